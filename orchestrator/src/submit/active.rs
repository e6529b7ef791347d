//! `submit --active`: the active loop ([`crate::active`]) on a cluster.
//!
//! Each round waits for what is in flight (a `status --watch`: poll and
//! collect), reads what the sweep has measured (`measurements.jsonl`) and
//! tried (the configs' attempts), refits, judges every config, records the
//! round in the journal ([`Change::ActiveRound`]) and submits the chosen
//! configs as one array (`submit` limited to them, so the submission protocol
//! and its guarantees hold: no config is submitted twice). Everything the loop
//! knows is in the state directory, so a loop killed at any point resumes
//! where it stopped when run again.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

/// The latest answers of an active sweep, in its state directory.
pub const FILE: &str = "active.json";

/// The answers an active sweep left in the state directory of `experiment`
/// (`None`: it was never run actively).
pub fn load(state_root: &std::path::Path, experiment: &str) -> Result<Option<ActiveReport>, crate::fsio::FsError> {
    crate::fsio::read_json(&state_root.join(experiment).join(FILE))
}
use spec::record::MeasurementRecord;
use spec::RunConfig;

use super::{status, submit, CommandError, Options, Watch};
use crate::active::{self, Answer, Choice, Refit, Savings, Settings, Stop};
use crate::precheck::Calibration;
use crate::state::{Change, StateDir};
use crate::sweep::Sweep;

/// How an active sweep ended: every config's answer and what it saved. Kept
/// in the state directory as [`FILE`], where `status` and the report read it.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ActiveReport {
    pub experiment: String,
    /// Rounds recorded in the journal (this run's and earlier runs').
    pub rounds: u32,
    pub stop: Stop,
    /// By config name.
    pub answers: BTreeMap<String, Answer>,
    pub savings: Savings,
}

/// What the state directory says: measured records by hash, hashes tried
/// without a measurement, rounds recorded, and the measured runs' seconds.
struct Known {
    measured: BTreeMap<String, MeasurementRecord>,
    tried: BTreeSet<String>,
    rounds: u32,
    seconds: Vec<f64>,
}

fn known(opts: &Options, experiment: &str) -> Result<Known, CommandError> {
    let st = StateDir::open(&opts.state_root, experiment, opts.lock_wait)?;
    let mut measured = BTreeMap::new();
    if let Ok(text) = std::fs::read_to_string(st.path("measurements.jsonl")) {
        let recs = spec::record::read_jsonl(&text).map_err(|(line, e)| {
            CommandError::Refused(format!("{}:{line}: {e}", st.path("measurements.jsonl").display()))
        })?;
        for r in recs {
            if let Some((_, hash)) = r.id.rsplit_once('@') {
                measured.insert(hash.to_string(), r);
            }
        }
    }
    let records = st.records().values();
    let tried = records.clone().filter(|r| !r.attempts().is_empty()).map(|r| r.hash().to_string()).collect();
    let seconds = records.filter_map(|r| r.result().map(|x| x.wall_s)).collect();
    let lines = st.view().journal()?;
    let rounds = lines.iter().filter(|l| matches!(l.change, Change::ActiveRound { .. })).count() as u32;
    Ok(Known { measured, tried, rounds, seconds })
}

/// Runs the loop until every config is settled or the budget is spent;
/// `say` gets one line per round.
pub async fn run(
    sweep: &Sweep,
    opts: &Options,
    settings: &Settings,
    watch: Watch,
    say: &mut (dyn FnMut(&str) + Send),
) -> Result<ActiveReport, CommandError> {
    let name = sweep.experiment.name.clone();
    let mut seen = BTreeSet::new();
    let configs: Vec<(String, RunConfig)> = sweep
        .configs
        .iter()
        .filter(|c| c.is_valid() && seen.insert(c.hash.0.clone()))
        .map(|c| (c.hash.0.clone(), c.config.clone()))
        .collect();
    let prior = Calibration::builtin();
    loop {
        if opts.state_root.join(&name).join("sweep.json").exists() {
            status(&name, opts, Some(watch), &mut |_| {}).await?;
        }
        let k = known(opts, &name)?;
        let list: Vec<MeasurementRecord> = k.measured.values().cloned().collect();
        let limit = sweep.experiment.worker.memory_limit.map(|b| b as f64 / (1u64 << 30) as f64);
        let refit = Refit::new(&prior, sweep.experiment.runtime.as_str(), &list).with_limit(limit);
        let answers = active::answers(&configs, &k.measured, &refit, settings.target_error);
        let chosen = match active::choose(&configs, &answers, &refit, settings, k.tried.len(), &k.tried) {
            Choice::Done(stop) => {
                let r = report(sweep, k, stop, answers);
                crate::fsio::write_json(&opts.state_root.join(&name).join(FILE), &r)?;
                return Ok(r);
            }
            Choice::Measure(keys) => keys,
        };
        let round = k.rounds + 1;
        let open = answers.values().filter(|a| !a.is_settled()).count();
        {
            let mut st = StateDir::open(&opts.state_root, &name, opts.lock_wait)?;
            st.apply(Change::ActiveRound { round, chosen: chosen.clone(), measured: k.measured.len(), open })?;
        }
        let names: Vec<&str> =
            sweep.configs.iter().filter(|c| chosen.contains(&c.hash.0)).map(|c| c.name.as_str()).collect();
        say(&format!("round {round}: {open} configs open, measuring {}: {}", chosen.len(), names.join(", ")));
        let o =
            Options { only: Some(chosen.iter().cloned().collect()), force: true, include_risky: true, ..opts.clone() };
        let r = submit(sweep, &o, false).await?;
        if r.submitted.is_empty() && r.unresolved.is_empty() {
            let why: Vec<String> = r.skipped.iter().map(|(n, w)| format!("{n}: {w}")).collect();
            return Err(CommandError::Refused(format!(
                "round {round} chose configs that could not be submitted ({})",
                why.join("; ")
            )));
        }
    }
}

fn report(sweep: &Sweep, k: Known, stop: Stop, answers: BTreeMap<String, Answer>) -> ActiveReport {
    let savings = Savings::of(&answers, &k.seconds);
    let by_hash: BTreeMap<&str, &str> = sweep.configs.iter().map(|c| (c.hash.0.as_str(), c.name.as_str())).collect();
    let answers = answers.into_iter().map(|(h, a)| (by_hash.get(h.as_str()).unwrap_or(&"?").to_string(), a)).collect();
    ActiveReport { experiment: sweep.experiment.name.clone(), rounds: k.rounds, stop, answers, savings }
}

impl ActiveReport {
    /// `status`'s line on it: the two kinds of answer and the savings.
    pub fn status_line(&self) -> String {
        let s = &self.savings;
        format!(
            "active sweep: {} measured, {} predicted without a run ({} runs saved); `orchestrator report {}` lists the predictions",
            s.measured, s.predicted, s.runs_saved, self.experiment
        )
    }
}

impl std::fmt::Display for ActiveReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "active sweep {}: {} rounds, stopped: {:?}", self.experiment, self.rounds, self.stop)?;
        writeln!(f, "measured:")?;
        for (n, a) in &self.answers {
            if let Answer::Measured { peak_gib, oom } = a {
                let what = if *oom { "oom".to_string() } else { format!("{:.3} GiB", peak_gib.unwrap_or(0.0)) };
                writeln!(f, "  {n:<32} {what}")?;
            }
        }
        writeln!(f, "predicted (not run):")?;
        for (n, a) in &self.answers {
            if let Answer::Predicted { peak_gib, low_gib, high_gib, verdict, calibration, settled, .. } = a {
                let open = if *settled { "" } else { " (not settled)" };
                writeln!(
                    f,
                    "  {n:<32} {peak_gib:.3} GiB [{low_gib:.3}, {high_gib:.3}] {verdict}{open}; {calibration}"
                )?;
            }
        }
        let s = &self.savings;
        let gpu = s.gpu_seconds_saved.map(|g| format!(", {g:.0} s of run time saved")).unwrap_or_default();
        writeln!(
            f,
            "{} configs: {} measured, {} predicted; {} runs saved{gpu}",
            s.configs, s.measured, s.predicted, s.runs_saved
        )
    }
}
