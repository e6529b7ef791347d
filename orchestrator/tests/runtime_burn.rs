//! The precheck's Burn runtimes against what Burn really does, measured:
//! `burn-flex` on CPU holds every attention score tensor for backward; the
//! GPU runtimes (`burn-vulkan`, `burn-wgpu`) were measured on an H100
//! (data/burn-gpu-h100.jsonl) and do not; none of them has autocast, and the
//! GPU kernels compute in f32 whatever is asked.

use orchestrator::precheck::{Predictor, Verdict};
use orchestrator::sweep;
use spec::record::{MeasuredStatus, MeasurementRecord};

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

/// DiT-L at patch 2 on an 80x64x64 input (40,960 tokens). PyTorch's
/// memory-efficient attention fits an 80 GB A100; Burn on CPU holds 16 heads
/// x 40,960^2 scores per block and cannot; Burn on the GPU ran it on the H100
/// at 57.6 GiB (f32), and the precheck says it fits there too.
#[test]
fn dit_l_patch2_per_runtime() {
    assert!(matches!(plan_one("pytorch", "bf16-amp", DIT_L_P2, IN_80).0, Verdict::Fits { .. }));
    match plan_one("burn-flex", "fp32", DIT_L_P2, IN_80).0 {
        Verdict::Oom { predicted_gib, .. } => assert!(predicted_gib > 1000.0, "{predicted_gib}"),
        other => panic!("burn-flex: {other:?}"),
    }
    let (verdict, gib) = plan_one("burn-vulkan", "fp32", DIT_L_P2, IN_80);
    assert!((gib - 57.64).abs() / 57.64 < 0.25, "burn-vulkan predicts {gib:.1} GiB, measured 57.6");
    assert!(!matches!(verdict, Verdict::Oom { .. } | Verdict::Invalid { .. }), "{verdict:?}");
}

/// No autocast in Burn: `bf16-amp` is planned as pure bf16 on CPU, and the
/// GPU runtimes plan f32 whatever is asked (the worker falls back and says so).
#[test]
fn burn_precisions_are_what_burn_runs() {
    let unet = "{family: unet, channels: [64, 128, 256], attention_levels: [false, false, true], num_res_blocks: 2, num_head_channels: 64}";
    let input = "{channels: 8, spatial: [40, 64, 64]}";
    let peak = |rt: &str, p: &str| plan_one(rt, p, unet, input).1;
    assert_eq!(peak("burn-flex", "bf16-amp"), peak("burn-flex", "bf16"));
    assert!(peak("burn-flex", "bf16") < peak("burn-flex", "fp32"));
    assert_eq!(peak("burn-vulkan", "bf16"), peak("burn-vulkan", "fp32"));
    assert_eq!(peak("burn-wgpu", "bf16-amp"), peak("burn-wgpu", "fp32"));
}

/// The shipped `burn-vulkan` coefficients against every H100 run of the
/// worker: no run that completed is predicted `oom`, and the errors stay
/// within the band the runtime declares.
#[test]
fn burn_vulkan_matches_the_h100_runs() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/burn-gpu-h100.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let records: Vec<MeasurementRecord> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(records.len() >= 10, "{} records", records.len());
    let p = Predictor::builtin("burn-vulkan", spec::Precision::Fp32).unwrap();
    let band = p.coefficients().rel_uncertainty;
    let mut errors = Vec::new();
    for r in records.iter().filter(|r| r.status == MeasuredStatus::Ok) {
        let cfg = r.run_config().unwrap();
        let predicted = p.predict_peak(&cfg).unwrap().peak_gib();
        let measured = r.peak_gb.unwrap();
        let err = (predicted - measured).abs() / measured;
        assert!(err <= band.max(0.05) * 1.5, "{}: predicted {predicted:.2} measured {measured:.2} GiB", r.id);
        assert!(!matches!(p.verdict(&cfg, None), Verdict::Oom { .. }), "{} ran but is predicted oom", r.id);
        errors.push(err);
    }
    errors.sort_by(f64::total_cmp);
    let median = errors[errors.len() / 2];
    assert!(median < 0.15, "median error {median:.3}");
}
