//! No shipped coefficient without the records that regenerate it: the
//! calibration in `orchestrator/calibration/runtimes.json` is what
//! `orchestrator calibrate` fits on the records in `data/` (the command is in
//! the file's note), runtime for runtime, coefficient for coefficient.

use std::path::{Path, PathBuf};

use orchestrator::cli::precheck as cli;
use orchestrator::precheck::{calibrate, Calibration, Coefficients, Fit};

fn data(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file)
}

/// The record files the shipped note names, read as `calibrate` reads them.
fn shipped_and_records() -> (Calibration, Vec<PathBuf>) {
    let shipped = Calibration::builtin();
    let command = shipped.note.split('`').nth(1).expect("the note names its command");
    let files: Vec<PathBuf> = command
        .split_whitespace()
        .skip_while(|w| *w != "--records")
        .skip(1)
        .take_while(|w| !w.starts_with("--"))
        .map(data)
        .collect();
    assert!(!files.is_empty(), "{command}");
    (shipped, files)
}

fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

fn same(a: &Coefficients, b: &Coefficients) -> Result<(), String> {
    for i in 0..Coefficients::FITTED.len() {
        if !close(a.get(i), b.get(i)) {
            return Err(format!("{}: {} against {}", Coefficients::FITTED[i], a.get(i), b.get(i)));
        }
    }
    let flags = |c: &Coefficients| (c.transformer_scores_materialised, c.attention_chunk_bytes, c.autocast, c.f32_only);
    if flags(a) != flags(b) || !close(a.rel_uncertainty, b.rel_uncertainty) {
        return Err(format!("flags or band: {a:?} against {b:?}"));
    }
    Ok(())
}

/// Numbers equal to a few ulps (a JSON float reads back within one), everything else exactly.
fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value::*;
    match (a, b) {
        (Number(x), Number(y)) => close(x.as_f64().unwrap(), y.as_f64().unwrap()),
        (Array(x), Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y)),
        (Object(x), Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn the_shipped_calibration_is_what_calibrate_fits_on_the_records() {
    let (shipped, files) = shipped_and_records();
    let records = cli::read_records(&files).unwrap();
    let (samples, _) = calibrate::samples(&records);
    let cross_validate = !shipped.note.contains("--no-loto");
    let report = calibrate::calibrate(&samples, cross_validate);
    // Through JSON, as `--out` writes it and the binary embeds it.
    let regenerated = Calibration::from_json(&serde_json::to_string(&report.calibration).unwrap()).unwrap();
    let keys = |c: &Calibration| c.runtimes.keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&regenerated), keys(&shipped), "runtimes fitted against runtimes shipped");
    for (rt, c) in &shipped.runtimes {
        same(&regenerated.runtimes[rt], c).unwrap_or_else(|e| panic!("{rt}: {e}"));
    }
    let bands = |c: &Calibration| serde_json::to_value(&c.uncertainty).unwrap();
    assert!(same_json(&bands(&regenerated), &bands(&shipped)), "the shipped bands are not the regenerated ones");
    assert_eq!(cli::note(&files_as_written(&files), &report, cross_validate), shipped.note);
}

/// The files as the note writes them (relative to the repository root).
fn files_as_written(files: &[PathBuf]) -> Vec<PathBuf> {
    let root = data("");
    files.iter().map(|f| f.strip_prefix(&root).unwrap().to_path_buf()).collect()
}

/// A runtime whose every record is superseded ships no fit, and `plan` says
/// what stands in for it; a precision never measured is derived and says so.
#[test]
fn unfitted_runtimes_and_precisions_say_what_answers() {
    let shipped = Calibration::builtin();
    let vulkan = shipped.resolve("burn-vulkan", facts::Precision::Fp32).unwrap();
    assert_eq!((vulkan.fit, vulkan.key.as_str()), (Fit::StandIn, "pytorch/bf16-amp"));
    assert!(vulkan.describe(Some(152)).starts_with("stand-in: pytorch/bf16-amp, fitted on 152 records"));
    assert!(vulkan.describe(None).contains("scripts/gpu-check.sh"), "{}", vulkan.describe(None));
    let flex = shipped.resolve("burn-flex", facts::Precision::Fp16Amp).unwrap();
    assert_eq!((flex.fit, flex.key.as_str()), (Fit::OtherPrecision, "burn-flex/bf16-amp"));
    assert_eq!(flex.label(), "derived: burn-flex/bf16-amp for burn-flex/fp16-amp");
    assert!(shipped.resolve("tensorflow", facts::Precision::Fp32).is_err(), "an unknown runtime is an error");
}
