//! The precheck's Burn GPU runtime: Burn's training path materialises every
//! attention score tensor (its fused attention is not used under autodiff) and
//! has no autocast, so a config that fits in PyTorch can run out of memory on
//! the worker. The precheck must say so before queue time is spent.

use orchestrator::precheck::Verdict;
use orchestrator::sweep;

/// DiT-L at patch 2 on an 80x64x64 input (40,960 tokens): with PyTorch's
/// memory-efficient attention it fits an 80 GB A100; with Burn's materialised
/// scores (16 heads x 40,960^2 per block, 24 blocks) it cannot.
#[test]
fn dit_l_patch2_fits_in_pytorch_but_not_in_burn() {
    let dir = tempfile::tempdir().unwrap();
    let verdict_for = |runtime: &str| {
        let path = dir.path().join(format!("{runtime}.yaml"));
        std::fs::write(
            &path,
            format!(
                "name: ditl\ngpu: A100-SXM4-80GB\nprecision: bf16-amp\nruntime: {runtime}\n\
                 input: {{channels: 1, spatial: [80, 64, 64]}}\noutput_channels: 1\n\
                 model: {{family: dit, variant: L, patch: 2}}\n"
            ),
        )
        .unwrap();
        let s = sweep::load(&path, &[]).unwrap();
        let c = &s.configs[0];
        s.predictor().unwrap().verdict(&c.config, None)
    };
    let torch = verdict_for("pytorch");
    assert!(matches!(torch, Verdict::Fits { .. }), "pytorch: {torch:?}");
    for runtime in ["burn-vulkan", "burn-wgpu"] {
        match verdict_for(runtime) {
            Verdict::Oom { predicted_gib, available_gib } => {
                assert!(predicted_gib > 10.0 * available_gib, "{runtime}: {predicted_gib} GiB")
            }
            other => panic!("{runtime}: {other:?}"),
        }
    }
}

/// Burn has no autocast: `bf16-amp` runs everything in bf16, weights and
/// AdamW state included, so the optimizer-bound peak of a big UNet is smaller
/// than PyTorch's fp32 master weights + moments, never larger.
#[test]
fn burn_runs_amp_as_pure_bf16() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("u.yaml");
    std::fs::write(
        &path,
        "name: u\ngpu: A100-SXM4-80GB\nprecision: bf16-amp\nruntime: burn-vulkan\n\
         input: {channels: 8, spatial: [40, 64, 64]}\noutput_channels: 4\n\
         model: {family: unet, channels: [256, 512, 1024, 2048], attention_levels: [false, false, true, true], num_res_blocks: 2, num_head_channels: 64}\n",
    )
    .unwrap();
    let s = sweep::load(&path, &[]).unwrap();
    let cfg = &s.configs[0].config;
    let burn = s.predictor().unwrap().predict(cfg).unwrap();
    let torch = orchestrator::precheck::Predictor::pytorch().predict(cfg).unwrap();
    let params = burn.params as f64;
    // Weights, gradients and both moments in bf16: 8 bytes a parameter, at least.
    assert!(burn.peak_bytes >= 8.0 * params, "{} for {params}", burn.peak_bytes);
    assert!(burn.peak_bytes < torch.peak_bytes, "burn {} torch {}", burn.peak_bytes, torch.peak_bytes);
}
