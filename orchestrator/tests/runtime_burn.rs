//! The precheck's Burn runtimes against what the worker runs: memory-efficient
//! attention for the transformer families (no heads x N x N scores kept, one
//! chunk's score tile while a block runs) and autocast for the `-amp`
//! precisions, on CPU and GPU alike (worker/README.md, docs/gpu.md).

use facts::record::{MeasuredStatus, MeasurementRecord};
use orchestrator::precheck::{Predictor, Verdict};
use orchestrator::sweep;

fn plan_one(runtime: &str, precision: &str, model: &str, input: &str) -> (Verdict, f64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("one.yaml");
    std::fs::write(
        &path,
        format!(
            "name: one\ngpu: A100-SXM4-80GB\nprecision: {precision}\nruntime: {runtime}\n\
             input: {input}\noutput_channels: 1\nmodel: {model}\n"
        ),
    )
    .unwrap();
    let s = sweep::load(&path, &[]).unwrap();
    let cfg = &s.configs[0].config;
    let p = s.predictor().unwrap();
    (p.verdict(cfg, None), p.predict_peak(cfg).unwrap().peak_gib())
}

const DIT_L_P2: &str = "{family: dit, variant: L, patch: 2}";
const IN_80: &str = "{channels: 1, spatial: [80, 64, 64]}";

/// DiT-L at patch 2 on an 80x64x64 input (40,960 tokens). Kept scores would be
/// 16 heads x 40,960^2 x 4 bytes = 100 GiB per block, 2,400 GiB for 24 blocks;
/// neither PyTorch's SDPA nor the worker's memory-efficient attention keeps
/// them, so every runtime plans it near the group's 62 GiB (fp32 activations
/// twice their bf16 size: under 150 GiB), the half types below fp32.
#[test]
fn dit_l_patch2_per_runtime() {
    assert!(matches!(plan_one("pytorch", "bf16-amp", DIT_L_P2, IN_80).0, Verdict::Fits { .. }));
    for (rt, precision) in [("burn-flex", "fp32"), ("burn-flex", "bf16-amp"), ("burn-vulkan", "fp32")] {
        let (verdict, gib) = plan_one(rt, precision, DIT_L_P2, IN_80);
        assert!(gib < 150.0, "{rt}/{precision} predicts {gib:.1} GiB: no score tensors are kept");
        assert!(!matches!(verdict, Verdict::Invalid { .. }), "{rt}: {verdict:?}");
    }
    // Autocast keeps half activations: one set of coefficients at both
    // precisions (the stand-in's) shows it. burn-flex's two precisions are
    // separate fits on 18 CPU runs of 20-90 MiB each, whose ratio at 40,960
    // tokens is the fits' (issue 52's refit put bf16-amp's act_scale at 0.84
    // against fp32's 0.48), not autocast's.
    assert!(
        plan_one("burn-vulkan", "bf16-amp", DIT_L_P2, IN_80).1 < plan_one("burn-vulkan", "fp32", DIT_L_P2, IN_80).1
    );
}

/// Autocast in the worker: `bf16-amp` keeps f32 parameters and AdamW state
/// (above pure bf16) with half activations (below fp32), on CPU and GPU.
#[test]
fn burn_precisions_are_what_burn_runs() {
    let unet = "{family: unet, channels: [64, 128, 256], attention_levels: [false, false, true], num_res_blocks: 2, num_head_channels: 64}";
    let input = "{channels: 8, spatial: [40, 64, 64]}";
    let peak = |rt: &str, p: &str| plan_one(rt, p, unet, input).1;
    for rt in ["burn-flex", "burn-vulkan", "burn-wgpu"] {
        let (amp, bf16, fp32) = (peak(rt, "bf16-amp"), peak(rt, "bf16"), peak(rt, "fp32"));
        assert!(bf16 < amp && amp < fp32, "{rt}: bf16 {bf16:.3}, bf16-amp {amp:.3}, fp32 {fp32:.3} GiB");
    }
}

/// No GPU runtime of the worker ships a fit: its only records (the H100 runs
/// of January, `data/burn-gpu-h100.jsonl`) are superseded, and `calibrate`
/// cannot regenerate coefficients from them. The PyTorch fit stands in,
/// predicting each of those configs as it predicts the group's run of it, and
/// the precheck says so.
#[test]
fn burn_gpu_runtimes_are_predicted_by_the_pytorch_stand_in() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/burn-gpu-h100.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let records: Vec<MeasurementRecord> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(records.iter().all(|r| r.superseded.is_some()), "a current record: fit it instead");
    let pytorch = Predictor::builtin("pytorch", facts::Precision::Fp32).unwrap();
    for rt in ["burn-vulkan", "burn-wgpu", "burn-cuda"] {
        let p = Predictor::builtin(rt, facts::Precision::Fp32).unwrap();
        for r in records.iter().filter(|r| r.status == MeasuredStatus::Ok) {
            let cfg = r.run_config().unwrap();
            assert_eq!(p.peak_bytes(&cfg).unwrap(), pytorch.peak_bytes(&cfg).unwrap(), "{rt}: {}", r.id);
        }
        let (_, source) =
            orchestrator::precheck::overlay::predictor(None, rt, facts::Precision::Bf16Amp, facts::Gpu::H100_80)
                .unwrap();
        let said = source.to_string();
        assert!(said.starts_with("stand-in: pytorch/bf16-amp, fitted on 152 records"), "{said}");
        assert!(said.contains(&format!("no {rt} fit ships")), "{said}");
    }
}
