//! `orchestrator evidence --savings PATH...`: what `plan` would have saved
//! the group on its own sweeps.
//!
//! Per experiment file: its configs (valid, each model once) that have a
//! record (the replay's match: [`Records::find`]), how many of those ran out
//! of memory or past the experiment's budget (the group's 60 GB: the record's
//! `status` says so, or its peak is above the budget), and
//! what `plan` calls each of them before submission, judged held out: by the
//! calibration fitted, as `calibrate` fits the shipped one (its bands
//! cross-validated), on the records of every table but the ones that hold a
//! record of that config. `submit` holds back both (`oom` always, `risky`
//! unless `--include-risky`). A run that stayed within the budget and is
//! called `oom` or `risky` is one `plan` would have held back for nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use facts::record::{MeasuredStatus, MeasurementRecord};

use super::EvidenceError;
use crate::precheck::{calibrate, Calibration, Predictor, Verdict, VerdictKind};
use crate::sweep::SweepConfig;
use crate::transport::replay::Records;

/// One config with a record, and `plan`'s held-out verdict on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    pub config: String,
    /// The line of its record in the records file.
    pub line: usize,
    /// Its GPU and config hash (`A100-SXM4-80GB/<hash>`): one model on one
    /// card, whatever the experiment calls it.
    pub run: String,
    pub outcome: Outcome,
    /// The tables left out of the calibration that judged it: every table
    /// with a record of this config.
    pub left_out: Vec<String>,
    pub verdict: Verdict,
}

impl Judged {
    /// Ran out of memory, or ran past the budget.
    pub fn failed(&self) -> bool {
        self.outcome != Outcome::Within
    }

    /// `plan` calls it `oom` or `risky`: `submit` holds it back.
    pub fn held_back(&self) -> bool {
        matches!(self.verdict.kind(), VerdictKind::Oom | VerdictKind::Risky)
    }
}

/// How a config's recorded run ended, against the experiment's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Oom,
    /// Ran, above the budget: recorded `over_budget`, or its peak is above
    /// the experiment's `budget_gb` (a table whose script labelled none).
    OverBudget,
    Within,
}

impl Outcome {
    fn of(r: &MeasurementRecord, budget_gib: Option<f64>) -> Outcome {
        match r.status {
            MeasuredStatus::Oom => Outcome::Oom,
            MeasuredStatus::OverBudget => Outcome::OverBudget,
            MeasuredStatus::Ok if r.peak_gib().zip(budget_gib).is_some_and(|(p, b)| p > b) => Outcome::OverBudget,
            MeasuredStatus::Ok => Outcome::Within,
        }
    }
}

/// One experiment's configs with a record, judged.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Savings {
    pub experiment: String,
    /// Valid configs, each model once.
    pub configs: usize,
    pub judged: Vec<Judged>,
}

/// A config with a record, before its verdict.
struct Pending {
    exp: usize,
    config: SweepConfig,
    line: usize,
    outcome: Outcome,
    left_out: Vec<String>,
}

/// Judges every experiment of `paths` (files or directories, as
/// [`super::experiments::files`] orders them) against `records`.
pub fn run(paths: &[PathBuf], records: &Path) -> Result<Vec<Savings>, EvidenceError> {
    let all = super::standing_records(records)?;
    let source = records.display().to_string();
    let every = Records::new(source.clone(), all.iter().cloned());
    let mut tables: BTreeMap<String, Vec<(usize, MeasurementRecord)>> = BTreeMap::new();
    for (line, r) in &all {
        tables.entry(r.table.clone().unwrap_or_default()).or_default().push((*line, r.clone()));
    }
    let by_table: Vec<(String, Records)> =
        tables.into_iter().map(|(t, recs)| (t.clone(), Records::new(format!("{source} (table {t})"), recs))).collect();

    let mut out = Vec::new();
    let mut pending = Vec::new();
    for path in super::experiments::files(paths)? {
        let sweep = crate::sweep::load(&path, &[]).map_err(|e| EvidenceError::Replay(e.to_string()))?;
        let mut seen = BTreeSet::new();
        let mut savings = Savings { experiment: sweep.experiment.name.clone(), ..Savings::default() };
        for c in sweep.configs.iter().filter(|c| c.is_valid() && seen.insert(c.hash.clone())) {
            savings.configs += 1;
            let Ok(found) = every.find(&c.config) else { continue };
            let left_out = by_table.iter().filter(|(_, r)| r.find(&c.config).is_ok()).map(|(t, _)| t.clone()).collect();
            pending.push(Pending {
                exp: out.len(),
                config: c.clone(),
                line: found.line,
                outcome: Outcome::of(found.record, sweep.experiment.budget_gb),
                left_out,
            });
        }
        out.push((sweep, savings));
    }
    let cals = held_out_calibrations(&all, pending.iter().map(|p| p.left_out.clone()).collect());
    for p in pending {
        let (sweep, savings) = &mut out[p.exp];
        let runtime = sweep.experiment.runtime.as_str();
        let predictor = Predictor::from_calibration(&cals[&p.left_out], runtime, p.config.config.precision)
            .map_err(|e| EvidenceError::Replay(format!("{}: {e}", sweep.source.display())))?;
        // What `plan` judges it by: the experiment's budget, its GPU's capacity.
        let verdict = sweep.verdict(&predictor, &p.config);
        let run = format!("{}/{}", p.config.config.gpu.name(), p.config.hash);
        let (config, line, outcome, left_out) = (p.config.name, p.line, p.outcome, p.left_out);
        savings.judged.push(Judged { config, line, run, outcome, left_out, verdict });
    }
    Ok(out.into_iter().map(|(_, s)| s).collect())
}

/// The calibration fitted without each set of tables, as `calibrate` fits
/// the shipped one (bands cross-validated), the sets fitted side by side.
pub(super) fn held_out_calibrations(
    all: &[(usize, MeasurementRecord)],
    sets: BTreeSet<Vec<String>>,
) -> BTreeMap<Vec<String>, Calibration> {
    let sets: Vec<Vec<String>> = sets.into_iter().collect();
    let fit = |left_out: &Vec<String>| {
        let train: Vec<MeasurementRecord> = all
            .iter()
            .filter(|(_, r)| !left_out.contains(&r.table.clone().unwrap_or_default()))
            .map(|(_, r)| r.clone())
            .collect();
        calibrate::calibrate(&calibrate::samples(&train).0, true).calibration
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 16);
    let chunk = sets.len().div_ceil(threads).max(1);
    let fitted: Vec<Calibration> = std::thread::scope(|s| {
        let parts: Vec<_> =
            sets.chunks(chunk).map(|c| s.spawn(move || c.iter().map(fit).collect::<Vec<_>>())).collect();
        parts
            .into_iter()
            .flat_map(|p| match p.join() {
                Ok(v) => v,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    sets.into_iter().zip(fitted).collect()
}

/// The table `evidence --savings` prints: a row per experiment, the total
/// (each config once), then each config that failed or that `plan` would
/// have held back though it ran within the budget.
pub struct SavingsTally<'a>(pub &'a [Savings]);

/// The counts of one row.
#[derive(Default)]
struct Counts {
    with_record: usize,
    oom: usize,
    over_budget: usize,
    called: BTreeMap<VerdictKind, usize>,
    held_back: usize,
}

impl Counts {
    fn add(&mut self, j: &Judged) {
        self.with_record += 1;
        self.oom += usize::from(j.outcome == Outcome::Oom);
        self.over_budget += usize::from(j.outcome == Outcome::OverBudget);
        if j.failed() {
            *self.called.entry(j.verdict.kind()).or_default() += 1;
        }
        self.held_back += usize::from(!j.failed() && j.held_back());
    }

    fn row(&self, f: &mut std::fmt::Formatter<'_>, name: &str, configs: &str) -> std::fmt::Result {
        let called = |k| self.called.get(&k).copied().unwrap_or(0);
        writeln!(
            f,
            "| {name} | {configs} | {} | {} | {} | {} | {} | {} | {} |",
            self.with_record,
            self.oom,
            self.over_budget,
            called(VerdictKind::Oom),
            called(VerdictKind::Risky),
            called(VerdictKind::Fits) + called(VerdictKind::Invalid),
            self.held_back
        )
    }
}

impl std::fmt::Display for SavingsTally<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "| experiment | configs | with a record | ran out of memory | ran over the budget | of those, `plan` calls `oom` | `risky` | `fits` | ran within budget, `plan` holds back |"
        )?;
        writeln!(f, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")?;
        let mut all = Counts::default();
        let mut runs = BTreeSet::new();
        for s in self.0 {
            let mut c = Counts::default();
            for j in &s.judged {
                c.add(j);
                if runs.insert(j.run.as_str()) {
                    all.add(j);
                }
            }
            c.row(f, &s.experiment, &s.configs.to_string())?;
        }
        all.row(f, "**all** (each config once)", "-")?;
        let listed = |j: &&Judged| j.failed() || j.held_back();
        if self.0.iter().any(|s| s.judged.iter().any(|j| listed(&j))) {
            writeln!(f)?;
        }
        for s in self.0 {
            for j in s.judged.iter().filter(listed) {
                detail(f, &s.experiment, j)?;
            }
        }
        Ok(())
    }
}

/// `exp9/3L_medium_lat4x: ran out of memory; plan without unet_latent_4x: risky (68.0 GiB)`.
fn detail(f: &mut std::fmt::Formatter<'_>, experiment: &str, j: &Judged) -> std::fmt::Result {
    let what = match j.outcome {
        Outcome::Oom => "ran out of memory",
        Outcome::OverBudget => "ran over the budget",
        Outcome::Within => "ran within the budget",
    };
    let predicted = j.verdict.predicted_gib().map(|g| format!(" ({g:.1} GiB)")).unwrap_or_default();
    writeln!(
        f,
        "- {experiment}/{}: {what}; `plan` without {}: {}{predicted}",
        j.config,
        j.left_out.join(" and "),
        j.verdict.kind().name()
    )
}
