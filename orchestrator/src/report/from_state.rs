//! A report from a state directory: a row for every config of the stored
//! sweep, from its record and the worker's events, read without the lock.

use std::collections::BTreeSet;
use std::path::Path;

use facts::event::{RunResult, RunStatus};
use facts::RunConfig;

use super::{base_row, gib, Environment, Report, ReportError, Row, Status};
use crate::collect;
use crate::precheck::{Predictor, VerdictKind};
use crate::slurm::{Activity, SlurmState};
use crate::state::{self, ConfigRecord, StoredSweep};
use crate::sweep::SweepConfig;

/// The report of experiment `experiment` under `state_root`.
/// `predictor` overrides the experiment's own runtime (`runtime:` in its file).
pub fn from_state(state_root: &Path, experiment: &str, predictor: Option<&Predictor>) -> Result<Report, ReportError> {
    let view = state::View::new(state_root, experiment)?;
    let (stored, records) = view.sweep_and_records()?;
    let stored: StoredSweep = stored
        .ok_or_else(|| ReportError::NoState { experiment: experiment.to_string(), root: state_root.to_path_buf() })?;
    let sweep = &stored.sweep;
    let own;
    let predictor = match predictor {
        Some(p) => p,
        None => {
            own = sweep.predictor().unwrap_or_else(|e| {
                tracing::warn!("{e}; predicting with the pytorch calibration");
                Predictor::pytorch()
            });
            &own
        }
    };
    // The experiment's own budget, as plan and fit apply it; none: the GPU's capacity.
    let budget =
        sweep.experiment.budget_gb.unwrap_or(sweep.host_memory_gib.unwrap_or(sweep.experiment.gpu.capacity_gib()));
    let shapes: BTreeSet<String> = sweep.configs.iter().map(|c| input_label(&c.config)).collect();
    let mut env = Environment::default();
    let mut rows = Vec::new();
    let mut seen = BTreeSet::new();
    let mut names = BTreeSet::new();
    let bar = crate::progress::bar(sweep.configs.len() as u64, "reading runs");
    for c in &sweep.configs {
        bar.inc(1);
        if !seen.insert(c.hash.clone()) {
            continue; // the same computation twice in a sweep runs once
        }
        let section = if shapes.len() > 1 { input_label(&c.config) } else { String::new() };
        let record = records.get(&c.hash);
        let reader = Reader { view: &view, sweep, predictor, budget };
        let mut row = reader.row(c, record, section, &mut env)?;
        if !names.insert(c.name.as_str()) {
            // The stored sweep lists the file's configs first, then those the
            // file no longer has (an edited config's earlier version).
            row.name = format!("{} (earlier version)", c.name);
        }
        // What the verdicts were judged against: a `local` run has this
        // machine's memory, not the GPU's; a worker `memory_limit` below either.
        let capacity = sweep.available_gib(c);
        if sweep.host_memory_gib.is_some() {
            row.capacity_gib = capacity;
        }
        row.limit_gib = row.limit_gib.min(capacity);
        rows.push(row);
    }
    bar.finish_and_clear();
    let active = view.active()?;
    if let Some(a) = &active {
        super::active::annotate(&mut rows, a);
    }
    // A model the sweep planned once under its first name keeps its other
    // names: measured once, reported under each (the group's 4L_maisi is 4L_small).
    let twins = sweep
        .collapsed
        .iter()
        .filter(|(_, kept)| rows.iter().any(|r| &r.name == kept))
        .map(|(name, kept)| super::Twin { name: name.clone(), same_as: kept.clone() })
        .collect();
    Ok(Report {
        title: match sweep.experiment.command {
            Some(_) => format!("{}: training runs report", sweep.experiment.name),
            None => format!("{}: memory profiling report", sweep.experiment.name),
        },
        description: sweep.experiment.description.clone(),
        source: view.root().display().to_string(),
        gpus: [sweep.experiment.gpu.to_string()].into(),
        capacity_gib: sweep.host_memory_gib.unwrap_or(sweep.experiment.gpu.capacity_gib()),
        host_memory: sweep.host_memory_gib.is_some(),
        budget_gib: budget,
        budget_set: sweep.experiment.budget_gb.is_some(),
        precisions: sweep.configs.iter().map(|c| c.config.precision.to_string()).collect(),
        predictor: predictor.runtime().to_string(),
        active,
        predicted_by: records
            .values()
            .filter(|r| r.predicted_gib().is_some())
            .filter_map(|r| r.calibration().map(str::to_string))
            .collect(),
        env,
        rows,
        twins,
        layout: sweep.experiment.report_layout,
    })
}

/// `input 8x64x64x40 (C,H,W,D)`: the input as a section heading.
fn input_label(cfg: &RunConfig) -> String {
    format!("input {}", cfg.input)
}

/// What a state row is read against: the state directory, the predictor and
/// the budget (`budget_gb` as the experiment sets it, if it does).
struct Reader<'a> {
    view: &'a state::View,
    sweep: &'a crate::sweep::Sweep,
    predictor: &'a Predictor,
    budget: f64,
}

impl Reader<'_> {
    /// The row of config `c` from its record and its events; the run's
    /// environment goes into `env`.
    fn row(
        &self,
        c: &SweepConfig,
        record: Option<&ConfigRecord>,
        section: String,
        env: &mut Environment,
    ) -> Result<Row, ReportError> {
        if !c.is_valid() {
            let mut row = base_row(&c.config, c.hash.to_string(), section, VerdictKind::Invalid);
            row.status = Status::Invalid;
            row.detail = Some(c.invalid.iter().map(|i| i.to_string()).collect::<Vec<_>>().join("; "));
            row.params = None;
            return Ok(row);
        }
        // What submit decided on, when it did; otherwise the prediction now.
        let verdict = match record.and_then(|r| r.verdict()) {
            Some(v) => v,
            None => self.sweep.verdict(self.predictor, c).kind(),
        };
        let mut row = base_row(&c.config, c.hash.to_string(), section, verdict);
        row.predicted_gib = record
            .and_then(|r| r.predicted_gib())
            .or_else(|| self.predictor.predict_peak(&c.config).ok().map(|p| p.peak_gib()));
        // The worker's events are the authority (the latest attempt only); the
        // record's copy of the result covers state dirs whose events were not pulled.
        let events = record.and_then(|r| r.latest().and_then(|a| r.events_rel(a)));
        let progress = match events.map(|rel| self.view.events(&rel)) {
            None => None,
            Some((Ok(bytes), _)) => Some(collect::parse_events(&bytes)),
            Some((Err(e), _)) if e.kind() == std::io::ErrorKind::NotFound => None,
            Some((Err(source), path)) => return Err(ReportError::Io { path, source }),
        };
        if let Some(e) = progress.as_ref().and_then(|p| p.env.as_ref()) {
            env.devices.insert(e.device.clone());
            if let Some(d) = &e.driver {
                env.drivers.insert(d.clone());
            }
            env.backends.insert(e.backend.clone());
            env.dtypes.insert(e.dtype.clone());
            env.hosts.insert(e.host.clone());
            env.grad_ckpt.insert(e.grad_ckpt);
            if let Some(m) = e.meter {
                env.meters.insert(m.describe().to_string());
            }
        }
        row.chain = progress.as_ref().and_then(|p| p.chain);
        let result = match &progress {
            Some(p) if p.attempts > 0 => p.result.clone(),
            _ => record.and_then(|r| r.result().cloned()),
        };
        match result {
            Some(res) => {
                apply_result(&mut row, &res, self.budget);
                // A chain's peak is its highest segment's, not its last one's.
                if let (Some(c), Some(p)) = (row.chain, row.peak_gib) {
                    row.peak_gib = Some(p.max(gib(c.peak_bytes)));
                }
            }
            None => {
                let (status, detail) = unfinished_status(record, row.verdict);
                row.status = status;
                // A job that failed before or outside the worker: its log says why.
                row.detail = record.and_then(ConfigRecord::failure_cause).or(detail);
                if status == Status::Running {
                    if let Some(p) = progress.as_ref().filter(|p| p.attempts > 0) {
                        let phase = p.phase.map(|ph| ph.name()).unwrap_or("start");
                        row.detail = Some(format!("in {phase}, peak so far {:.2} GiB", gib(p.peak_bytes)));
                    }
                }
            }
        }
        Ok(row)
    }
}

/// Fills a row's measured columns and status from a worker result.
fn apply_result(row: &mut Row, res: &RunResult, budget_gib: f64) {
    // A run that failed before building its model counts none: the row keeps
    // the exact count `plan` shows (facts::params::count, from base_row).
    if res.params > 0 || row.params.is_none() {
        row.params = Some(res.params);
    }
    row.model_gib = res.peaks.model.map(gib);
    row.fwd_gib = res.peaks.fwd.map(gib);
    row.bwd_gib = res.peaks.bwd.map(gib);
    row.wall_s = Some(res.wall_s);
    let peak = gib(res.peak_bytes);
    row.status = match res.status {
        RunStatus::Ok if peak > budget_gib => Status::OverBudget,
        RunStatus::Ok => Status::Ok,
        RunStatus::Oom => Status::Oom,
        RunStatus::Failed => Status::Failed,
        RunStatus::Cancelled => Status::Cancelled,
    };
    match res.status {
        RunStatus::Ok => row.peak_gib = Some(peak),
        RunStatus::Oom => {
            row.oom_at_gib = Some(peak);
            row.detail = res.phase.map(|p| format!("in {}", p.name()));
        }
        RunStatus::Failed | RunStatus::Cancelled => {
            row.detail = match (res.phase, &res.message) {
                (Some(p), Some(m)) => Some(format!("in {}: {m}", p.name())),
                (None, Some(m)) => Some(m.clone()),
                (Some(p), None) => Some(format!("in {}", p.name())),
                (None, None) => None,
            };
        }
    }
}

/// Status of a config that has no result yet, from its verdict and latest attempt.
fn unfinished_status(record: Option<&ConfigRecord>, verdict: VerdictKind) -> (Status, Option<String>) {
    let Some(a) = record.and_then(ConfigRecord::latest) else {
        return match verdict {
            VerdictKind::Oom => (Status::SkippedOom, None),
            VerdictKind::Risky => (Status::SkippedRisky, Some("submit with --include-risky to run it".into())),
            _ => (Status::NotSubmitted, None),
        };
    };
    match a.state() {
        None => (Status::Pending, Some("submitted, not yet seen by SLURM".into())),
        Some(s) => match s.activity() {
            // The state only where it says more than the status (REQUEUED, SUSPENDED).
            Activity::Queued => (Status::Pending, (*s != SlurmState::Pending).then(|| s.to_string())),
            Activity::Running => (Status::Running, (*s != SlurmState::Running).then(|| s.to_string())),
            Activity::Ended if *s == SlurmState::Cancelled => (Status::Cancelled, Some(s.to_string())),
            Activity::Ended => (Status::Failed, Some(format!("SLURM {s}, no result from the worker"))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run that failed before building its model reports 0 parameters: the
    /// row keeps the exact count `plan` shows, and no measured figure.
    #[test]
    fn a_failed_run_keeps_the_count_plan_knows() {
        let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments/demo.yaml");
        let sweep = crate::sweep::load(&demo, &[]).expect("demo loads");
        let c = &sweep.configs[0].config;
        let mut row = base_row(c, "h".into(), String::new(), VerdictKind::Fits);
        let failed: RunResult = serde_json::from_value(serde_json::json!({
            "event": "result", "t": 0.0, "status": "failed", "params": 0, "peaks": {}, "peak_bytes": 0,
            "message": "replay: no record of this config", "wall_s": 0.0
        }))
        .expect("a result");
        apply_result(&mut row, &failed, 60.0);
        let plan = facts::params::count(&c.model, &c.input, c.out_channels).expect("a valid config");
        assert!(plan > 0);
        assert_eq!(row.params, Some(plan), "{row:?}");
        assert_eq!((row.status, row.peak_gib, row.oom_at_gib), (Status::Failed, None, None));
        assert_eq!(row.detail.as_deref(), Some("replay: no record of this config"));
    }
}
