//! The `predict` and `calibrate` commands (their arguments are in `cli/mod.rs`).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use facts::record::MeasurementRecord;
use serde::Serialize;

use crate::precheck::calibrate::{self, FitStats};
use crate::precheck::{Calibration, Predictor, Verdict};

/// Read measurement JSONL files; errors name the file and the line.
pub fn read_records(paths: &[PathBuf]) -> Result<Vec<MeasurementRecord>> {
    let mut all = Vec::new();
    for p in paths {
        let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        let recs =
            facts::record::read_jsonl(&text).map_err(|(line, e)| anyhow::anyhow!("{}:{line}: {e}", p.display()))?;
        all.extend(recs);
    }
    Ok(all)
}

/// Load a calibration file, or the shipped one.
pub fn load_calibration(path: Option<&Path>) -> Result<Calibration> {
    match path {
        None => Ok(Calibration::builtin()),
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            Calibration::from_json(&text).with_context(|| format!("parsing {}", p.display()))
        }
    }
}

/// One output line of `predict`.
#[derive(Debug, Serialize)]
pub struct PredictLine {
    pub id: String,
    pub params_m: Option<f64>,
    pub peak_gb: Option<f64>,
    pub fits: bool,
    pub verdict: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_peak_gb: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_phase: Option<&'static str>,
    /// The two phases' predicted peaks (forward/backward, optimizer step), GiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fwd_bwd_gb: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_gb: Option<f64>,
    /// The terms resident at the peak, summed by kind (weights, grads,
    /// optimizer, activations, ...), GiB: what `worker fidelity` sets beside
    /// the worker's per-phase peaks.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub terms: std::collections::BTreeMap<&'static str, f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Predict one record (measured fields ignored).
pub fn predict_record(cal: &Calibration, r: &MeasurementRecord, budget_gib: Option<f64>) -> PredictLine {
    let invalid = |reason: String| PredictLine {
        id: r.id.clone(),
        params_m: None,
        peak_gb: None,
        fits: false,
        verdict: "invalid",
        train_peak_gb: None,
        peak_phase: None,
        fwd_bwd_gb: None,
        step_gb: None,
        terms: Default::default(),
        reason: Some(reason),
    };
    let cfg = match r.run_config() {
        Ok(c) => c,
        Err(e) => return invalid(e.to_string()),
    };
    let pred = match Predictor::from_calibration(cal, &r.framework, r.precision) {
        Ok(p) => p,
        Err(e) => return invalid(e.to_string()),
    };
    let verdict = pred.verdict(&cfg, budget_gib);
    if let Verdict::Invalid { reasons } = &verdict {
        return invalid(reasons.join("; "));
    }
    match pred.predict(&cfg) {
        Ok(p) => PredictLine {
            id: r.id.clone(),
            params_m: Some(round(p.params as f64 / 1e6, 1)),
            peak_gb: Some(round(p.peak_gib(), 2)),
            fits: verdict.fits_gpu(),
            verdict: verdict.name(),
            train_peak_gb: Some(round(p.train_peak_gib(), 2)),
            peak_phase: Some(p.peak_phase.name()),
            fwd_bwd_gb: Some(round(p.fwd_bwd_bytes / crate::precheck::GIB, 3)),
            step_gb: Some(round(p.step_bytes / crate::precheck::GIB, 3)),
            terms: p.peak_terms().fold(Default::default(), |mut m, t| {
                *m.entry(t.kind.name()).or_insert(0.0) += t.bytes / crate::precheck::GIB;
                m
            }),
            reason: match verdict {
                Verdict::Fits { .. } => None,
                v => Some(v.to_string()),
            },
        },
        Err(e) => invalid(e.to_string()),
    }
}

/// `orchestrator predict --records FILE... [--calibration FILE] [--budget-gb GB] [--score]`:
/// one JSON line per record on stdout; a training-run file's lines are its
/// runs' training figures ([`super::train_records`]).
pub fn run_predict(
    records: &[PathBuf],
    calibration: Option<&Path>,
    budget_gib: Option<f64>,
    score: bool,
) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut measurements = Vec::new();
    for p in records {
        let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        if super::train_records::is_training_file(&text) {
            let written = match score {
                true => super::train_records::run_score(p, &mut out),
                false => super::train_records::run(p, budget_gib, &mut out),
            };
            // A closed pipe (`| head`) is the reader's choice, not an error.
            match written {
                Err(e)
                    if e.downcast_ref::<std::io::Error>()
                        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
                {
                    return Ok(())
                }
                other => other?,
            }
        } else {
            anyhow::ensure!(!score, "{}: --score reads training-run records (data/training-runs.jsonl)", p.display());
            measurements.push(p.clone());
        }
    }
    let cal = load_calibration(calibration)?;
    let recs = read_records(&measurements)?;
    let written = (|| -> std::io::Result<()> {
        for r in &recs {
            let line = predict_record(&cal, r, budget_gib);
            serde_json::to_writer(&mut out, &line)?;
            out.write_all(b"\n")?;
        }
        out.flush()
    })();
    match written {
        // A closed pipe (`| head`) is the reader's choice, not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

fn print_stats(title: &str, st: &std::collections::BTreeMap<String, FitStats>, out: &mut impl Write) -> Result<()> {
    writeln!(out, "{title}")?;
    writeln!(
        out,
        "  {:<16} {:>4} {:>8} {:>8} {:>8} {:>5} {:>14}",
        "group", "n", "median", "p90", "max", "oom", "oom-pred-fits"
    )?;
    for (k, s) in st {
        writeln!(
            out,
            "  {:<16} {:>4} {:>7.1}% {:>7.1}% {:>7.1}% {:>5} {:>14}",
            k,
            s.n,
            100.0 * s.median,
            100.0 * s.p90,
            100.0 * s.max,
            s.n_oom,
            s.oom_predicted_fit
        )?;
    }
    Ok(())
}

/// `orchestrator calibrate --records FILE... [--out FILE] [--no-loto]`: refit every
/// runtime found in the records, print fit quality per family in-sample and
/// cross-validated (per held-out table too), and how many of the runs that
/// ran the bands would hold back; write the calibration JSON to `--out`
/// (stdout when absent).
pub fn run_calibrate(records: &[PathBuf], out_path: Option<&Path>, cross_validate: bool) -> Result<()> {
    let recs = read_records(records)?;
    let (samples, skipped) = calibrate::samples(&recs);
    anyhow::ensure!(!samples.is_empty(), "no usable records in {} file(s)", records.len());
    let mut report = calibrate::calibrate(&samples, cross_validate);
    report.calibration.note = note(records, &report, cross_validate);
    let stderr = std::io::stderr();
    let mut err = stderr.lock();
    for s in &skipped {
        writeln!(err, "skipped: {s}")?;
    }
    for (rt, st) in &report.in_sample {
        let cv = report.cross_validated.get(rt);
        print_side_by_side(&format!("runtime {rt}: absolute relative error of peak_gb"), st, cv, &mut err)?;
        if let Some(t) = report.leave_one_table_out.get(rt) {
            print_stats(&format!("runtime {rt}: per held-out table (refitted without it)"), t, &mut err)?;
        }
        if let Some(u) = report.calibration.uncertainty.get(rt) {
            print_bands(rt, u, &mut err)?;
        }
        if let Some((held, ran)) = report.held_back.get(rt) {
            writeln!(
                err,
                "runtime {rt}: {held} of {ran} runs that ran would be held back (risky or oom on their own device)"
            )?;
        }
    }
    let json = serde_json::to_string_pretty(&report.calibration)? + "\n";
    match out_path {
        Some(p) => std::fs::write(p, json).with_context(|| format!("writing {}", p.display()))?,
        None => print!("{json}"),
    }
    Ok(())
}

/// The calibration file's note: how to regenerate it, and what each runtime was fitted on.
pub fn note(records: &[PathBuf], report: &calibrate::Report, cross_validate: bool) -> String {
    let files: Vec<String> = records.iter().map(|p| p.display().to_string()).collect();
    let fitted: Vec<String> = report
        .in_sample
        .iter()
        .map(|(rt, st)| format!("{rt} on {} records", st.get("all").map_or(0, |s| s.n + s.n_oom)))
        .collect();
    format!(
        "Fitted by `orchestrator calibrate --records {}{}`: {}. Bands (`uncertainty`): per family and regime, the p90 \
         of the {} error. A runtime without records here ships no fit (`plan` says what stands in). Coefficients are \
         documented in orchestrator/src/precheck/calibration.rs (Coefficients).",
        files.join(" "),
        if cross_validate { "" } else { " --no-loto" },
        fitted.join(", "),
        if cross_validate { "cross-validated" } else { "in-sample" },
    )
}

/// In-sample and cross-validated quality per family, one line each.
fn print_side_by_side(
    title: &str,
    ins: &std::collections::BTreeMap<String, FitStats>,
    cv: Option<&std::collections::BTreeMap<String, FitStats>>,
    out: &mut impl Write,
) -> Result<()> {
    writeln!(out, "{title}")?;
    writeln!(
        out,
        "  {:<8} {:>4}  {:>17}  {:>17}  {:>13}",
        "family", "n", "in-sample med/p90", "held-out med/p90", "oom-pred-fits"
    )?;
    let pct = |s: Option<&FitStats>| match s {
        Some(s) => format!("{:.1}% / {:.1}%", 100.0 * s.median, 100.0 * s.p90),
        None => "-".into(),
    };
    for (k, s) in ins {
        let c = cv.and_then(|c| c.get(k));
        let oom = match c {
            Some(c) => format!("{} / {} ({} held out)", s.oom_predicted_fit, s.n_oom, c.oom_predicted_fit),
            None => format!("{} / {}", s.oom_predicted_fit, s.n_oom),
        };
        writeln!(out, "  {:<8} {:>4}  {:>17}  {:>17}  {}", k, s.n, pct(Some(s)), pct(c), oom)?;
    }
    Ok(())
}

/// The bands `plan` widens each prediction by: one line per family and what
/// sets its peak (`plan` takes the widest of a family's bands in place of
/// one with fewer than five runs).
fn print_bands(rt: &str, u: &crate::precheck::Uncertainty, out: &mut impl Write) -> Result<()> {
    use crate::precheck::uncertainty::Regime;
    let kind = if u.method.starts_with("cross-validated") { "held-out" } else { "in-sample" };
    writeln!(out, "runtime {rt}: bands (p90 of the {kind} error, by what sets the peak)")?;
    for b in &u.bands {
        let regime = match b.regime {
            Regime::Activation => "forward/backward",
            Regime::Optimizer => "optimizer step",
        };
        writeln!(out, "  {:<8} {:<16} {:>6.1}%  ({} runs)", b.family.to_string(), regime, 100.0 * b.p90, b.n)?;
    }
    Ok(())
}

/// `orchestrator calibrate --check`: the local overlay of `state_root`, before
/// (the shipped calibration on your runs) and after (the overlay, each
/// experiment's runs predicted by a fit without them).
pub fn run_check(state_root: &Path) -> Result<()> {
    let overlay = crate::state::overlay(state_root)
        .with_context(|| format!("fitting the calibration overlay of {}", state_root.display()))?;
    let path = crate::state::overlay_path(state_root);
    let mut out = std::io::stdout().lock();
    if overlay.sources.is_empty() {
        writeln!(
            out,
            "no measurements under {} yet: plan, submit and fit use the shipped calibration",
            state_root.display()
        )?;
        return Ok(());
    }
    writeln!(out, "calibration overlay {} (from {} measurement files)", path.display(), overlay.sources.len())?;
    let pct = |(m, p): (f64, f64)| format!("{:.1}% / {:.1}%", 100.0 * m, 100.0 * p);
    let mut cells = vec![[
        "runtime on device",
        "runs",
        "oom",
        "shipped med/p90",
        "overlay med/p90 (held out)",
        "overlay used for",
        "experiments",
    ]
    .map(String::from)
    .to_vec()];
    for e in overlay.entries.values() {
        cells.push(vec![
            format!("{} on {}", e.runtime, e.device),
            e.measured.to_string(),
            e.oom.to_string(),
            pct(e.shipped_error),
            pct(e.overlay_error),
            e.used_for(),
            e.experiments.join(", "),
        ]);
    }
    if overlay.entries.is_empty() {
        writeln!(out, "no runtime has enough runs for an overlay yet")?;
    } else {
        write!(out, "{}", crate::util::table::render_table(&cells))?;
    }
    // Why, family by family, in `plan`'s words.
    for e in overlay.entries.values().filter(|e| !e.families.is_empty()) {
        writeln!(out, "{} on {}, per family (held-out error median/p90):", e.runtime, e.device)?;
        for (family, fit) in &e.families {
            writeln!(out, "{}", fit.line(*family))?;
        }
    }
    for n in &overlay.notes {
        writeln!(out, "note: {n}")?;
    }
    Ok(())
}
