//! Accuracy of the memory precheck on the group's published measurements:
//! median / p90 absolute relative error of the predicted peak and no OOM record
//! called `fits`, computed from `predict` output exactly as the CLI emits it.

use std::path::PathBuf;

use facts::record::{read_jsonl, MeasuredStatus, MeasurementRecord};
use orchestrator::cli::precheck::predict_record;
use orchestrator::precheck::calibrate::{self, summarise};
use orchestrator::precheck::Calibration;

fn records() -> Vec<MeasurementRecord> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/vram-measurements.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    read_jsonl(&text).unwrap_or_else(|(line, e)| panic!("{}:{line}: {e}", path.display()))
}

#[test]
fn published_records_within_targets() {
    let cal = Calibration::builtin();
    let recs = records();
    assert!(recs.len() > 100);
    let mut errs = Vec::new();
    let mut per_family: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    let mut oom_fits = Vec::new();
    for r in &recs {
        let line = predict_record(&cal, r, None);
        assert_ne!(line.verdict, "invalid", "{}: {:?}", r.id, line.reason);
        let peak = line.peak_gb.expect("valid records have a prediction");
        if std::env::var_os("PRECHECK_VERBOSE").is_some() {
            eprintln!(
                "{:<44} measured {:>6} predicted {peak:>7.2} {} {}",
                r.id,
                r.peak_gb.map(|m| format!("{m:.1}")).unwrap_or("OOM".into()),
                line.verdict,
                line.peak_phase.unwrap_or("")
            );
        }
        match (r.status, r.peak_gb) {
            (MeasuredStatus::Oom, _) if line.verdict == "fits" => {
                oom_fits.push(format!("{} predicted {peak:.1} GiB", r.id))
            }
            (MeasuredStatus::Oom, _) => {}
            (_, Some(m)) => {
                let e = (peak - m).abs() / m;
                errs.push(e);
                per_family.entry(r.family.name().to_string()).or_default().push(e);
            }
            _ => {}
        }
    }
    for (f, e) in &per_family {
        let (m, p90, max) = summarise(e.clone());
        eprintln!("{f:<6} n={:<3} median {:.1}%  p90 {:.1}%  max {:.1}%", e.len(), 100.0 * m, 100.0 * p90, 100.0 * max);
    }
    let (median, p90, max) = summarise(errs);
    eprintln!("all    median {:.1}%  p90 {:.1}%  max {:.1}%", 100.0 * median, 100.0 * p90, 100.0 * max);
    // Called `risky` at most (the group's 3L_medium at 68 GiB: the allocator's
    // fragmentation margin), never `fits`.
    assert!(oom_fits.is_empty(), "OOM records called `fits`: {oom_fits:?}");
    assert!(median <= 0.015, "median abs rel error {:.1}% > 1.5%", 100.0 * median);
    assert!(p90 <= 0.06, "p90 abs rel error {:.1}% > 6%", 100.0 * p90);
}

/// Extrapolation check: refit without each table and predict it. Looser bounds
/// than in sample (a held-out table is a new regime), but it must stay a usable predictor.
#[test]
fn leave_one_table_out_stays_usable() {
    let (samples, _) = calibrate::samples(&records());
    let report = calibrate::calibrate(&samples, true);
    let held = &report.leave_one_table_out["pytorch/bf16-amp"];
    let mut worst_median: f64 = 0.0;
    for (t, s) in held {
        eprintln!(
            "held out {t:<16} n={:<3} median {:.1}%  p90 {:.1}%  max {:.1}%  oom-pred-fit {}/{}",
            s.n,
            100.0 * s.median,
            100.0 * s.p90,
            100.0 * s.max,
            s.oom_predicted_fit,
            s.n_oom
        );
        worst_median = worst_median.max(s.median);
    }
    assert!(worst_median < 0.25, "a held-out table is off by a median {:.0}%", 100.0 * worst_median);
    // The bands shipped in runtimes.json are exactly these held-out errors.
    let shipped = Calibration::builtin();
    assert_eq!(
        report.calibration.uncertainty["pytorch/bf16-amp"].bands, shipped.uncertainty["pytorch/bf16-amp"].bands,
        "runtimes.json's bands are stale: rerun `orchestrator calibrate --records data/vram-measurements.jsonl`"
    );
    let cv = &report.cross_validated["pytorch/bf16-amp"];
    for (family, s) in cv {
        eprintln!(
            "cross-validated {family:<5} n={:<3} median {:.1}%  p90 {:.1}%",
            s.n,
            100.0 * s.median,
            100.0 * s.p90
        );
    }
    // p90 10% before the records were corrected, 13% before the walk counted
    // what the group's models keep (issue 44); the target since.
    assert!(cv["all"].median <= 0.015 && cv["all"].p90 <= 0.06, "{:?}", cv["all"]);
    // With those bands, the runs that ran are not held back.
    let (held_back, ran) = report.held_back["pytorch/bf16-amp"];
    assert_eq!(ran, 140);
    assert!(held_back * 20 <= ran, "{held_back} of {ran} runs that ran would be held back as risky or oom");
}

/// Scaling a UNet to a larger input is where the group extrapolates: their
/// S2D runs at 128x128 (80x64x64 after space-to-depth) are in the data, the
/// 256x256 ones (80x128x128) are not. They report the peak growing 1.3-1.8x
/// for narrow-early / wide-deep widths (the optimizer state of the deep levels
/// dominates) and 3.3-4.4x for wide-early ones (activations at full
/// resolution, 4x the voxels). The walk must scale the same way; 5% slack is
/// the slack of the group's own range.
#[test]
fn unet_scaling_from_128_to_256_matches_the_groups_ratios() {
    let pred = orchestrator::precheck::Predictor::pytorch();
    let (mut narrow, mut wide) = (0, 0);
    for r in
        records().iter().filter(|r| r.table.as_deref().is_some_and(|t| t.starts_with("s2d_128")) && r.peak_gb.is_some())
    {
        let widths = r.channels.clone().unwrap();
        let attn = r.attention_levels.clone().unwrap();
        // Attention only at the two deepest levels: the group's 5-level family.
        if widths.len() != 5 || attn[..3].iter().any(|a| *a) {
            continue;
        }
        let mut cfg = r.run_config().unwrap();
        let at_128 = pred.peak_bytes(&cfg).unwrap();
        cfg.input.spatial = facts::Spatial::new(80, 128, 128);
        let ratio = pred.peak_bytes(&cfg).unwrap() / at_128;
        let range = if widths[0] <= 32 && widths[4] >= 1024 {
            narrow += 1;
            // The group's 1.3-1.8x; up to 2.0 since the walk holds the native
            // convolutions' column buffers at level 0 (4x the voxels at 256),
            // which the group's runs had too (the probe of
            // data/gpu-check/2026-11-27-h100) but its 256 rows are not here to check.
            (1.3, 2.0)
        } else if widths[0] >= 64 && widths[4] <= 512 {
            wide += 1;
            (3.3, 4.4)
        } else {
            continue;
        };
        eprintln!("{:<44} {widths:?} 128->256 x{ratio:.2} (group: {}-{})", r.id, range.0, range.1);
        assert!(
            ratio >= range.0 * 0.95 && ratio <= range.1 * 1.05,
            "{} {widths:?}: predicted x{ratio:.2} from 128 to 256, the group measures {}-{}x",
            r.id,
            range.0,
            range.1
        );
    }
    assert!(narrow >= 4 && wide >= 8, "narrow-early {narrow}, wide-early {wide}");
}

/// The verdicts on configs that are not in the data, simulated: each table in
/// turn is new (the runtime refitted without it, its distance measured from
/// the other tables' coverage, the shipped bands), as the group's next
/// experiment will be. Of its runs that ran, at most 5% may be held back
/// (`risky` or `oom`), and none of its OOMs may be called `fits`.
#[test]
fn verdicts_on_a_new_table_hold_back_little_and_never_pass_an_oom() {
    use orchestrator::precheck::uncertainty::Uncertainty;
    use orchestrator::precheck::{judge, Verdict};
    let (samples, _) = calibrate::samples(&records());
    let group: Vec<&calibrate::Sample> = samples.iter().collect();
    let shipped = Calibration::builtin();
    let rt = "pytorch/bf16-amp";
    let (held, _) = calibrate::cross_validate(rt, &group, shipped.runtimes[rt], None);
    let bands = shipped.uncertainty[rt].bands.clone();
    let (mut ran, mut held_back, mut oom_fits) = (0, Vec::new(), Vec::new());
    for h in &held {
        let s = group[h.sample];
        let others = group.iter().filter(|o| o.table != s.table).map(|o| &o.cfg);
        let mut u = Uncertainty::estimate(String::new(), &[], others);
        u.bands = bands.clone();
        let phase = match h.regime {
            orchestrator::precheck::uncertainty::Regime::Activation => orchestrator::precheck::PeakPhase::FwdBwd,
            orchestrator::precheck::uncertainty::Regime::Optimizer => orchestrator::precheck::PeakPhase::Step,
        };
        let a = u.assess(&s.cfg, phase);
        let v = judge(h.peak_gib, s.available_gib, None, a.rel, a.distance.as_ref());
        match s.measured_gib {
            Some(m) => {
                ran += 1;
                if !matches!(v, Verdict::Fits { .. }) {
                    held_back.push(format!("{} (measured {m:.1}): {v}", s.id));
                }
            }
            None if matches!(v, Verdict::Fits { .. }) => oom_fits.push(format!("{}: {v}", s.id)),
            None => {}
        }
    }
    eprintln!(
        "new-table simulation: {} of {ran} runs that ran held back; {} OOMs called fits",
        held_back.len(),
        oom_fits.len()
    );
    for l in held_back.iter().chain(&oom_fits) {
        eprintln!("  {l}");
    }
    assert!(oom_fits.is_empty(), "OOMs called fits: {oom_fits:?}");
    assert!(held_back.len() * 20 <= ran, "{} of {ran} held back", held_back.len());
}
