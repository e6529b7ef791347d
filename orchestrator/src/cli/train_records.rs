//! `predict --records` on training-run records (`data/training-runs.jsonl`):
//! each run's training figure, the phase expected to set it, the verdict;
//! with `--score`, the table that sets each prediction beside the run's
//! recorded peak, and beside the two older answers (the profiling walk plus
//! AdamW and one EMA copy, `plan`'s Train column before the phases; the
//! group's rule of thumb, the profiling peak x 1.55).

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use facts::training_record::TrainingRecord;
use serde::Serialize;

use crate::precheck::{Predictor, GIB};

/// Whether a JSONL file holds training-run records: its first record has
/// `pixel_spatial`, a field only that format has.
pub fn is_training_file(text: &str) -> bool {
    let first = text.lines().find(|l| !l.trim().is_empty());
    first
        .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .is_some_and(|v| v.get("pixel_spatial").is_some())
}

/// Read a training-run file; errors name the file and the line.
pub fn read(path: &Path) -> Result<Vec<TrainingRecord>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    facts::training_record::read_jsonl(&text).map_err(|(line, e)| anyhow::anyhow!("{}:{line}: {e}", path.display()))
}

/// One output line of `predict` for a training run.
#[derive(Debug, Serialize)]
pub struct TrainLine {
    pub id: String,
    pub group: String,
    /// The predicted peak of the whole run, GiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_gib: Option<f64>,
    /// The phase expected to set it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<&'static str>,
    /// `[low, high]` GiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub band_gib: Option<[f64; 2]>,
    pub verdict: &'static str,
    /// Each phase's peak, GiB.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub phases: std::collections::BTreeMap<&'static str, f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// The prediction of one run, and its two older answers in GiB (Train column
/// before the phases, the group's rule), or why there is none.
pub struct Scored {
    pub line: TrainLine,
    /// The prediction unrounded, GiB.
    pub gib: Option<f64>,
    pub legacy_gib: Option<f64>,
    pub rule_gib: Option<f64>,
}

/// Predict one training run.
pub fn predict(pred: &Predictor, r: &TrainingRecord, budget_gib: Option<f64>) -> Scored {
    let none = |reason: String| Scored {
        line: TrainLine {
            id: r.id.clone(),
            group: r.group.clone(),
            train_gib: None,
            phase: None,
            band_gib: None,
            verdict: "invalid",
            phases: Default::default(),
            reason: Some(reason),
        },
        gib: None,
        legacy_gib: None,
        rule_gib: None,
    };
    let cfg = match r.run_config() {
        Ok(c) => c,
        Err(e) => return none(e.to_string()),
    };
    let p = match pred.predict_peak(&cfg) {
        Ok(p) => p,
        Err(e) => return none(e.to_string()),
    };
    let verdict = pred.verdict_of(&cfg, &p, budget_gib);
    let t = &p.train;
    let gib = t.peak_gib();
    // `plan`'s Train column before the phases: the profiling walk with AdamW's
    // moments and one fp32 EMA copy resident.
    let params = p.params as f64;
    let legacy = (p.fwd_bwd_bytes + 12.0 * params).max(p.step_bytes + 4.0 * params) / GIB;
    Scored {
        line: TrainLine {
            id: r.id.clone(),
            group: r.group.clone(),
            train_gib: Some(round(gib, 2)),
            phase: Some(t.peak_phase.name()),
            band_gib: Some([round(gib / (1.0 + t.rel_uncertainty), 2), round(gib / (1.0 - t.rel_uncertainty), 2)]),
            verdict: verdict.name(),
            phases: t.phases.iter().map(|ph| (ph.phase.name(), round(ph.bytes / GIB, 2))).collect(),
            reason: t.uncovered.clone(),
        },
        gib: Some(gib),
        legacy_gib: Some(legacy),
        rule_gib: Some(1.55 * p.peak_gib()),
    }
}

/// `predict --records FILE` on a training-run file: one JSON line a run.
pub fn run(path: &Path, budget_gib: Option<f64>, out: &mut impl Write) -> Result<()> {
    let pred = Predictor::pytorch();
    for r in read(path)? {
        serde_json::to_writer(&mut *out, &predict(&pred, &r, budget_gib).line)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// Error statistics of one predictor over the runs it predicts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Score {
    pub n: usize,
    pub median: f64,
    pub p90: f64,
    /// Runs predicted more than 10 % under their recorded peak.
    pub under_10: usize,
}

/// Median and p90 of |error|, and the count more than 10 % under.
pub fn score(errors: &[f64]) -> Score {
    let mut a: Vec<f64> = errors.iter().map(|e| e.abs()).collect();
    a.sort_by(f64::total_cmp);
    let q = |f: f64| if a.is_empty() { f64::NAN } else { a[((a.len() - 1) as f64 * f).round() as usize] };
    Score { n: a.len(), median: q(0.5), p90: q(0.9), under_10: errors.iter().filter(|&&e| e < -0.10).count() }
}

/// `predict --records FILE --score`: every run beside its recorded peak, then
/// the three predictors' scores.
pub fn run_score(path: &Path, out: &mut impl Write) -> Result<()> {
    let pred = Predictor::pytorch();
    let recs = read(path)?;
    writeln!(out, "| run | measured | Train before | x1.55 rule | prediction | phase | error |")?;
    writeln!(out, "|---|---|---|---|---|---|---|")?;
    let (mut old, mut rule, mut new) = (Vec::new(), Vec::new(), Vec::new());
    for r in &recs {
        let s = predict(&pred, r, None);
        let m = r.peak_gib;
        let (Some(g), Some(l), Some(u)) = (s.gib, s.legacy_gib, s.rule_gib) else {
            writeln!(out, "| {} | {m:.1} | - | - | - | - | {} |", r.id, s.line.reason.unwrap_or_default())?;
            continue;
        };
        let e = g / m - 1.0;
        old.push(l / m - 1.0);
        rule.push(u / m - 1.0);
        new.push(e);
        let phase = s.line.phase.unwrap_or("-");
        writeln!(out, "| {} | {m:.1} | {l:.1} | {u:.1} | {g:.1} | {phase} | {:+.1} % |", r.id, 100.0 * e)?;
    }
    writeln!(out)?;
    writeln!(out, "| predictor | runs | median abs. error | p90 | more than 10 % under |")?;
    writeln!(out, "|---|---|---|---|---|")?;
    for (name, errors) in
        [("Train before (walk + AdamW + one EMA)", &old), ("profile x 1.55", &rule), ("the phases", &new)]
    {
        let s = score(errors);
        writeln!(out, "| {name} | {} | {:.1} % | {:.1} % | {} |", s.n, 100.0 * s.median, 100.0 * s.p90, s.under_10)?;
    }
    Ok(())
}
