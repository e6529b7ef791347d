//! `orchestrator report`: the tables the group writes by hand after a sweep,
//! written from the state directory (or from plain measurement records), with
//! the precheck's prediction beside every measurement and plots.
//!
//! A report row exists for *every* config of the sweep, whatever happened to
//! it: measured, skipped because the precheck predicted an OOM, invalid, failed,
//! still queued. The summaries at the end list what was never run, so nothing
//! silently disappears between `plan` and `report`.
//!
//! The state is only read (no lock): every file in it is replaced atomically, so
//! a report made while `status --watch` polls sees each config whole.

pub mod cli;
pub mod markdown;
pub mod plot;
mod verdict_map;

use serde::Serialize;
use spec::event::{RunResult, RunStatus};
use spec::model::Family;
use spec::record::{MeasuredStatus, MeasurementRecord};
use spec::{ModelSpec, RunConfig};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::collect;
use crate::fsio;
use crate::precheck::{Predictor, VerdictKind};
use crate::slurm::{Activity, SlurmState};
use crate::state::{self, ConfigRecord, StateError, StoredSweep};
use crate::sweep::SweepConfig;

const GIB: f64 = (1u64 << 30) as f64;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Fs(#[from] crate::fsio::FsError),
    #[error("no state for experiment `{experiment}` under {} (submit it first, or pass --state-dir)", root.display())]
    NoState { experiment: String, root: PathBuf },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}:{line}: not a measurement record: {source}", path.display())]
    Records { path: PathBuf, line: usize, source: serde_json::Error },
    #[error("{}: no measurement records", path.display())]
    NoRecords { path: PathBuf },
    #[error("plot: {0}")]
    Plot(String),
}

/// What became of one config, in the reports' words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    /// Ran, above the group's budget (the reports' ">60GB").
    OverBudget,
    /// Measured out of memory.
    Oom,
    /// Breaks a shape rule: would fail at once, never submitted.
    Invalid,
    /// Never submitted: the precheck predicted an OOM.
    SkippedOom,
    /// Never submitted: the precheck called it risky (submit without --include-risky).
    SkippedRisky,
    /// Never submitted, for another reason (a new config, or not yet sent).
    NotSubmitted,
    Failed,
    Cancelled,
    Pending,
    Running,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::OverBudget => "over budget",
            Status::Oom => "OOM",
            Status::Invalid => "invalid",
            Status::SkippedOom => "skipped: predicted OOM",
            Status::SkippedRisky => "skipped: risky",
            Status::NotSubmitted => "not submitted",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
            Status::Pending => "pending",
            Status::Running => "running",
        }
    }
    /// Measured and ran through (within or over budget).
    pub fn ran(self) -> bool {
        matches!(self, Status::Ok | Status::OverBudget)
    }
}

/// One config of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub name: String,
    /// Config hash (state mode) or record id (records mode).
    pub id: String,
    pub family: Family,
    /// The table it belongs in: `UNet, 4 levels`, `DiT-S`, `HDiT-B`.
    pub group: String,
    /// Splits groups further: the input shape (state mode, when the sweep has
    /// several) or the source table (records mode).
    pub section: String,
    /// Input `HxWxD` as the reports write it, and channels.
    pub resolution: String,
    pub in_channels: u32,
    pub channels: Option<Vec<u32>>,
    /// UNet attention per level.
    pub attention: Option<Vec<bool>>,
    pub level_depths: Option<Vec<u32>>,
    pub patch: Option<u32>,
    /// Tokens at the top level (transformers).
    pub tokens: Option<u64>,
    /// Input voxels.
    pub voxels: u64,
    pub params: Option<u64>,
    pub model_gib: Option<f64>,
    pub fwd_gib: Option<f64>,
    pub bwd_gib: Option<f64>,
    /// Overall peak (the reports' Total / Peak VRAM); `None` unless it ran through.
    pub peak_gib: Option<f64>,
    /// The peak reached when it ran out of memory, where known.
    pub oom_at_gib: Option<f64>,
    pub predicted_gib: Option<f64>,
    /// `fits`, `risky`, `oom`, `invalid`.
    pub verdict: VerdictKind,
    pub status: Status,
    /// Why (invalid reason, failure message, SLURM state).
    pub detail: Option<String>,
    pub capacity_gib: f64,
    /// The memory the run had: the worker's `memory_limit` where one applied
    /// (a measured OOM happened there), else the GPU's capacity.
    pub limit_gib: f64,
    pub wall_s: Option<f64>,
}

impl Row {
    /// Prediction error relative to the measured peak, in percent.
    pub fn error_pct(&self) -> Option<f64> {
        let (p, m) = (self.predicted_gib?, self.peak_gib?);
        (m > 0.0).then(|| (p - m) / m * 100.0)
    }
    pub fn is_transformer(&self) -> bool {
        self.family != Family::Unet
    }
}

/// Where the runs happened, from the worker's `start` events (or the records).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Environment {
    pub devices: BTreeSet<String>,
    pub drivers: BTreeSet<String>,
    pub backends: BTreeSet<String>,
    pub dtypes: BTreeSet<String>,
    pub hosts: BTreeSet<String>,
    pub grad_ckpt: BTreeSet<bool>,
    /// What the measured bytes are (the worker's meter), in words.
    pub meters: BTreeSet<String>,
}

/// A whole report: header facts and one row per config.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub title: String,
    pub description: String,
    /// The state directory or the records files.
    pub source: String,
    /// Target GPU(s) and capacity (GiB) the verdicts were made against.
    pub gpus: BTreeSet<String>,
    pub capacity_gib: f64,
    pub budget_gib: f64,
    /// Whether the budget is the experiment's own (`budget_gb`) or the group's default.
    pub budget_set: bool,
    pub precisions: BTreeSet<String>,
    /// The predictor's runtime (`pytorch/bf16-amp`).
    pub predictor: String,
    pub env: Environment,
    pub rows: Vec<Row>,
}

/// Best viable config of a group: the largest one that ran within budget.
#[derive(Debug, Clone, Serialize)]
pub struct Best {
    pub group: String,
    pub section: String,
    pub name: String,
    pub params: Option<u64>,
    pub peak_gib: f64,
}

/// Largest token count that ran within budget, per variant.
#[derive(Debug, Clone, Serialize)]
pub struct Largest {
    pub group: String,
    pub tokens: u64,
    pub name: String,
    pub peak_gib: f64,
    /// The largest token count predicted to fit, for comparison (never run or not).
    pub predicted_tokens: Option<u64>,
}

/// The summaries under the tables.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub counts: BTreeMap<&'static str, usize>,
    pub best: Vec<Best>,
    pub largest_tokens: Vec<Largest>,
    /// Configs never run: predicted OOM, risky, invalid, not submitted.
    pub never_run: Vec<String>,
    /// Median and largest |error| of predictions over measured configs, percent.
    pub median_abs_error_pct: Option<f64>,
    pub max_abs_error_pct: Option<f64>,
    pub measured: usize,
}

impl Report {
    /// Rows grouped as the reports group them: per section (input shape or
    /// table), then per group (UNet levels, transformer variant), in first-seen order.
    pub fn groups(&self) -> Vec<((String, String), Vec<&Row>)> {
        let mut order: Vec<(String, String)> = Vec::new();
        let mut by: BTreeMap<(String, String), Vec<&Row>> = BTreeMap::new();
        for r in &self.rows {
            let key = (r.section.clone(), r.group.clone());
            if !by.contains_key(&key) {
                order.push(key.clone());
            }
            by.entry(key).or_default().push(r);
        }
        // Sections stay together even when their groups interleave in the sweep.
        let sections: Vec<String> = order.iter().map(|k| k.0.clone()).fold(Vec::new(), |mut v, s| {
            if !v.contains(&s) {
                v.push(s);
            }
            v
        });
        let mut out = Vec::new();
        for s in sections {
            for k in order.iter().filter(|k| k.0 == s) {
                let rows = by.remove(k).unwrap_or_default();
                out.push((k.clone(), rows));
            }
        }
        out
    }

    pub fn sections(&self) -> BTreeSet<&str> {
        self.rows.iter().map(|r| r.section.as_str()).collect()
    }

    pub fn summary(&self) -> Summary {
        let mut counts = BTreeMap::new();
        for r in &self.rows {
            *counts.entry(r.status.label()).or_default() += 1;
        }
        let mut best = Vec::new();
        for ((section, group), rows) in self.groups() {
            let viable = rows
                .iter()
                .filter(|r| r.status == Status::Ok)
                .filter_map(|r| r.peak_gib.map(|p| (r, p)))
                .max_by(|(a, pa), (b, pb)| a.params.cmp(&b.params).then(pa.total_cmp(pb)));
            if let Some((r, p)) = viable {
                best.push(Best { group, section, name: r.name.clone(), params: r.params, peak_gib: p });
            }
        }
        let mut largest = Vec::new();
        let mut variants: Vec<&str> = Vec::new();
        for r in self.rows.iter().filter(|r| r.is_transformer()) {
            if !variants.contains(&r.group.as_str()) {
                variants.push(&r.group);
            }
        }
        for g in variants {
            let rows: Vec<&Row> = self.rows.iter().filter(|r| r.group == g).collect();
            let predicted_tokens = rows.iter().filter(|r| r.verdict.may_run()).filter_map(|r| r.tokens).max();
            let ran = rows
                .iter()
                .filter(|r| r.status == Status::Ok)
                .filter_map(|r| Some((r, r.tokens?, r.peak_gib?)))
                .max_by(|a, b| a.1.cmp(&b.1).then(b.2.total_cmp(&a.2)));
            if let Some((r, tokens, peak)) = ran {
                largest.push(Largest {
                    group: g.to_string(),
                    tokens,
                    name: r.name.clone(),
                    peak_gib: peak,
                    predicted_tokens,
                });
            }
        }
        let never_run = self
            .rows
            .iter()
            .filter(|r| {
                matches!(r.status, Status::SkippedOom | Status::SkippedRisky | Status::Invalid | Status::NotSubmitted)
            })
            .map(|r| r.name.clone())
            .collect();
        let mut errs: Vec<f64> = self.rows.iter().filter_map(Row::error_pct).map(f64::abs).collect();
        errs.sort_by(f64::total_cmp);
        Summary {
            counts,
            best,
            largest_tokens: largest,
            never_run,
            median_abs_error_pct: median(&errs),
            max_abs_error_pct: errs.last().copied(),
            measured: errs.len(),
        }
    }
}

fn median(sorted: &[f64]) -> Option<f64> {
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[n / 2]),
        n => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

fn family_title(f: Family) -> &'static str {
    match f {
        Family::Unet => "UNet",
        Family::Dit => "DiT",
        Family::Hdit => "HDiT",
        Family::Uvit => "U-ViT",
    }
}

/// The table a model belongs in: UNets by number of levels, transformers by
/// variant (or by their dimensions where they have no variant name).
pub fn group_of(model: &ModelSpec) -> String {
    let title = family_title(model.family());
    let variant = match model {
        ModelSpec::Unet(u) => return format!("UNet, {} levels", u.levels()),
        ModelSpec::Dit(m) => m.variant,
        ModelSpec::Hdit(m) => m.variant,
        ModelSpec::Uvit(m) => m.variant,
    };
    match (variant, model.transformer_dims()) {
        (Some(v), _) => format!("{title}-{v}"),
        (None, Some(Ok(d))) => format!("{title} h{} x{} d{}", d.hidden, d.heads, d.depth),
        (None, _) => format!("{title} (custom)"),
    }
}

/// Shape facts of a config (resolution, tokens, per-family fields) as a row
/// template with nothing measured yet.
fn base_row(cfg: &RunConfig, id: String, section: String, verdict: VerdictKind) -> Row {
    let (channels, attention, level_depths) = match &cfg.model {
        ModelSpec::Unet(u) => (Some(u.channels.clone()), Some(u.attention_levels.clone()), None),
        ModelSpec::Hdit(m) => (None, None, Some(m.level_depths.clone())),
        _ => (None, None, None),
    };
    let patch = cfg.model.patch();
    let tokens =
        patch.filter(|p| *p > 0 && cfg.input.spatial.divisible_by(*p)).map(|p| cfg.input.spatial.div(p).voxels());
    Row {
        name: cfg.name.clone(),
        id,
        family: cfg.model.family(),
        group: group_of(&cfg.model),
        section,
        resolution: cfg.input.spatial.to_string(),
        in_channels: cfg.input.channels,
        channels,
        attention,
        level_depths,
        patch,
        tokens,
        voxels: cfg.input.spatial.voxels(),
        params: spec::params::count(&cfg.model, &cfg.input, cfg.out_channels).ok(),
        model_gib: None,
        fwd_gib: None,
        bwd_gib: None,
        peak_gib: None,
        oom_at_gib: None,
        predicted_gib: None,
        verdict,
        status: Status::NotSubmitted,
        detail: None,
        capacity_gib: cfg.gpu.capacity_gib(),
        limit_gib: cfg.gpu.capacity_gib(),
        wall_s: None,
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB
}

/// Fills a row's measured columns and status from a worker result.
fn apply_result(row: &mut Row, res: &RunResult, budget_gib: f64) {
    row.params = Some(res.params);
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
    match &a.state {
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

/// The report of experiment `experiment` under `state_root`.
/// `predictor` overrides the experiment's own runtime (`runtime:` in its file).
pub fn from_state(state_root: &Path, experiment: &str, predictor: Option<&Predictor>) -> Result<Report, ReportError> {
    let view = state::View::new(state_root, experiment)?;
    let dir = view.root().to_path_buf();
    let stored: StoredSweep = view
        .sweep()?
        .ok_or_else(|| ReportError::NoState { experiment: experiment.to_string(), root: state_root.to_path_buf() })?;
    let records = view.records()?;
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
    let budget = sweep.experiment.budget_gb.unwrap_or(collect::BUDGET_GIB);
    let shapes: BTreeSet<String> = sweep.configs.iter().map(|c| input_label(&c.config)).collect();
    let mut env = Environment::default();
    let mut rows = Vec::new();
    let mut seen = BTreeSet::new();
    let bar = crate::progress::bar(sweep.configs.len() as u64, "reading runs");
    for c in &sweep.configs {
        bar.inc(1);
        if !seen.insert(c.hash.0.clone()) {
            continue; // the same computation twice in a sweep runs once
        }
        let section = if shapes.len() > 1 { input_label(&c.config) } else { String::new() };
        let record = records.get(&c.hash.0);
        let mut row = state_row(&dir, c, record, section, budget, predictor, sweep.experiment.budget_gb, &mut env)?;
        if let Some(limit) = sweep.experiment.worker.memory_limit {
            row.limit_gib = row.limit_gib.min(limit as f64 / GIB);
        }
        rows.push(row);
    }
    bar.finish_and_clear();
    Ok(Report {
        title: format!("{}: memory profiling report", sweep.experiment.name),
        description: sweep.experiment.description.clone(),
        source: dir.display().to_string(),
        gpus: [sweep.experiment.gpu.to_string()].into(),
        capacity_gib: sweep.experiment.gpu.capacity_gib(),
        budget_gib: budget,
        budget_set: sweep.experiment.budget_gb.is_some(),
        precisions: sweep.configs.iter().map(|c| c.config.precision.to_string()).collect(),
        predictor: predictor.runtime().to_string(),
        env,
        rows,
    })
}

/// `64x64x40 x8`: the input as a section heading.
fn input_label(cfg: &RunConfig) -> String {
    format!("input {} x{}", cfg.input.spatial, cfg.input.channels)
}

#[allow(clippy::too_many_arguments)]
fn state_row(
    dir: &Path,
    c: &SweepConfig,
    record: Option<&ConfigRecord>,
    section: String,
    budget: f64,
    predictor: &Predictor,
    budget_gb: Option<f64>,
    env: &mut Environment,
) -> Result<Row, ReportError> {
    if !c.is_valid() {
        let mut row = base_row(&c.config, c.hash.0.clone(), section, VerdictKind::Invalid);
        row.status = Status::Invalid;
        row.detail = Some(c.invalid.iter().map(|i| i.to_string()).collect::<Vec<_>>().join("; "));
        row.params = None;
        return Ok(row);
    }
    // What submit decided on, when it did; otherwise the prediction now.
    let verdict = match record.and_then(|r| r.verdict) {
        Some(v) => v,
        None => predictor.verdict(&c.config, budget_gb).kind(),
    };
    let mut row = base_row(&c.config, c.hash.0.clone(), section, verdict);
    row.predicted_gib =
        record.and_then(|r| r.predicted_gib).or_else(|| predictor.predict_peak(&c.config).ok().map(|p| p.peak_gib()));
    // The worker's events are the authority (the latest attempt only); the
    // record's copy of the result covers state dirs whose events were not pulled.
    let events = dir.join("runs").join(&c.name).join("events.jsonl");
    let progress = match std::fs::read(&events) {
        Ok(bytes) => Some(collect::parse_events(&bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(ReportError::Io { path: events, source }),
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
    let result = match &progress {
        Some(p) if p.attempts > 0 => p.result.clone(),
        _ => record.and_then(|r| r.result.clone()),
    };
    match result {
        Some(res) => apply_result(&mut row, &res, budget),
        None => {
            let (status, detail) = unfinished_status(record, row.verdict);
            row.status = status;
            row.detail = detail;
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

/// Reads measurement JSONL files (format: data/README.md).
pub fn read_records_files(paths: &[PathBuf]) -> Result<Vec<MeasurementRecord>, ReportError> {
    let mut out = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|source| ReportError::Io { path: path.clone(), source })?;
        let recs = spec::record::read_jsonl(&text).map_err(|(line, source)| ReportError::Records {
            path: path.clone(),
            line,
            source,
        })?;
        if recs.is_empty() {
            return Err(ReportError::NoRecords { path: path.clone() });
        }
        out.extend(recs);
    }
    Ok(out)
}

/// The report of plain measurement records: every record a row, sectioned by
/// its source table, each with the prediction for the run it describes.
pub fn from_records(records: &[MeasurementRecord], source: String, predictor: &Predictor) -> Report {
    let mut env = Environment::default();
    let mut rows = Vec::new();
    let mut gpus = BTreeSet::new();
    let mut precisions = BTreeSet::new();
    let budget = collect::BUDGET_GIB;
    for r in records {
        env.devices.insert(r.gpu.clone());
        env.backends.insert(r.framework.clone());
        env.grad_ckpt.insert(r.grad_ckpt);
        precisions.insert(r.precision.to_string());
        let section = r.table.clone().unwrap_or_default();
        let cfg = match r.run_config() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("{e}: left out of the report");
                continue;
            }
        };
        gpus.insert(cfg.gpu.to_string());
        let v = predictor.verdict(&cfg, Some(budget));
        let mut row = base_row(&cfg, r.id.clone(), section, v.kind());
        row.name = r.config_name.clone().unwrap_or_else(|| r.id.clone());
        row.params = r.params_m.map(|m| (m * 1e6).round() as u64).or(row.params);
        if r.tokens.is_some() {
            row.tokens = r.tokens;
        }
        row.model_gib = r.model_gb;
        row.fwd_gib = r.fwd_gb;
        row.bwd_gib = r.bwd_gb;
        row.peak_gib = r.peak_gb;
        row.oom_at_gib = r.oom_reported_gb;
        row.status = match r.status {
            MeasuredStatus::Ok => Status::Ok,
            MeasuredStatus::OverBudget => Status::OverBudget,
            MeasuredStatus::Oom => Status::Oom,
        };
        row.detail = r.note.clone();
        row.predicted_gib = v.predicted_gib();
        rows.push(row);
    }
    let capacity = rows.iter().map(|r| r.capacity_gib).fold(0.0, f64::max);
    Report {
        title: "Measured configs against the precheck".into(),
        description: String::new(),
        source,
        gpus,
        capacity_gib: capacity,
        budget_gib: budget,
        budget_set: true,
        precisions,
        predictor: predictor.runtime().to_string(),
        env,
        rows,
    }
}

/// Writes `report.md`, `report.json` and the plots into `out`; returns the
/// Markdown's path and the plot files written.
pub fn write(report: &Report, out: &Path) -> Result<(PathBuf, Vec<PathBuf>), ReportError> {
    std::fs::create_dir_all(out).map_err(|source| ReportError::Io { path: out.into(), source })?;
    let plots = plot::write_all(report, out).map_err(|e| ReportError::Plot(e.to_string()))?;
    let md = markdown::render(report, &plots, out);
    let md_path = out.join("report.md");
    fsio::write_atomic(&md_path, md.as_bytes())?;
    fsio::write_json(&out.join("report.json"), &json(report))?;
    Ok((md_path, plots))
}

/// The machine-readable report: header, rows (with the error) and summaries.
pub fn json(report: &Report) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = report
        .rows
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            if let Some(m) = v.as_object_mut() {
                m.insert("status_label".into(), r.status.label().into());
                m.insert("error_pct".into(), r.error_pct().into());
            }
            v
        })
        .collect();
    serde_json::json!({
        "title": report.title,
        "description": report.description,
        "source": report.source,
        "gpus": report.gpus,
        "capacity_gib": report.capacity_gib,
        "budget_gib": report.budget_gib,
        "budget_set": report.budget_set,
        "precisions": report.precisions,
        "predictor": report.predictor,
        "env": report.env,
        "rows": rows,
        "summary": report.summary(),
    })
}

#[cfg(test)]
mod tests;
