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

mod active;
mod from_records;
mod from_state;
pub mod group;
pub mod markdown;
pub mod plot;
mod summary;
mod training_runs;
mod verdict_map;

pub use from_records::{from_records, read_records_files};
pub use from_state::from_state;

use facts::model::Family;
use facts::{ModelSpec, RunConfig};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

pub use crate::experiment::ReportLayout;
use crate::fsio;
use crate::precheck::VerdictKind;
use crate::state::StateError;

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
    /// Never submitted: an active sweep answered it by a prediction (with
    /// its interval; settled or not, the row's `answer` says).
    Predicted,
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
            Status::Predicted => "predicted (active sweep)",
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
    /// Never sent to the cluster (an active sweep may have answered it by a prediction).
    pub fn is_unrun(self) -> bool {
        matches!(self, Status::SkippedOom | Status::SkippedRisky | Status::NotSubmitted)
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
    /// An HDiT's tokens at its bottleneck (its deepest level).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bottleneck_tokens: Option<u64>,
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
    /// An active sweep's answer for a config it predicted without a run
    /// (`"source": "predicted"`); `None` for every other row.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<crate::active::Answer>,
    /// A chained training run: its segments, wall time and peak over all of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain: Option<crate::collect::ChainTally>,
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
    /// The peak a summary counts this row at, and whether it is predicted:
    /// measured within budget (`OK`), or, never run, an active sweep's
    /// settled prediction that it fits. `None` for every other row.
    pub fn viable_peak(&self) -> Option<(f64, bool)> {
        match (self.status, &self.answer) {
            (Status::Ok, _) => self.peak_gib.map(|p| (p, false)),
            (
                Status::Predicted,
                Some(crate::active::Answer::Predicted { peak_gib, verdict: VerdictKind::Fits, settled: true, .. }),
            ) => Some((*peak_gib, true)),
            _ => None,
        }
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
    /// The capacity is this machine's memory: a `local` cluster ran the
    /// worker on its CPU, and the verdicts were judged against it.
    pub host_memory: bool,
    pub budget_gib: f64,
    /// Whether the budget is the experiment's own (`budget_gb`) or the group's default.
    pub budget_set: bool,
    pub precisions: BTreeSet<String>,
    /// The predictor's runtime (`pytorch/bf16-amp`).
    pub predictor: String,
    /// The calibrations that made the predictions submit stored, before
    /// each run (empty: every prediction is made now, by `predictor`).
    pub predicted_by: BTreeSet<String>,
    /// The answers of an active sweep (`submit --active`), when it ran as one.
    pub active: Option<crate::active::ActiveReport>,
    pub env: Environment,
    pub rows: Vec<Row>,
    /// Configs of the sweep that are another row's model under a second name
    /// (the sweep plans them once): measured once, reported under each name.
    pub twins: Vec<Twin>,
    /// The tables `report` writes (the experiment's `report_layout`).
    pub layout: ReportLayout,
}

/// A config the sweep folded into an identical one: its name, and the row it is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Twin {
    pub name: String,
    pub same_as: String,
}

impl Report {
    /// The names config `row` is also reported under.
    pub fn twins_of<'a>(&'a self, row: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.twins.iter().filter(move |t| t.same_as == row).map(|t| t.name.as_str())
    }
}

/// Best viable config of a group: the largest one that ran within budget.
#[derive(Debug, Clone, Serialize)]
pub struct Best {
    pub group: String,
    pub section: String,
    pub name: String,
    pub params: Option<u64>,
    pub peak_gib: f64,
    /// Not run: an active sweep's settled prediction (`peak_gib` predicted).
    pub predicted: bool,
}

/// Largest token count that ran within budget (or, never run, that an
/// active sweep's settled prediction says fits), per variant.
#[derive(Debug, Clone, Serialize)]
pub struct Largest {
    pub group: String,
    pub tokens: u64,
    pub name: String,
    pub peak_gib: f64,
    /// Not run: an active sweep's settled prediction (`peak_gib` predicted).
    pub predicted: bool,
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

fn family_title(f: Family) -> &'static str {
    match f {
        Family::Unet => "UNet",
        Family::Dit => "DiT",
        Family::Hdit => "HDiT",
        Family::Uvit => "U-ViT",
        Family::Mamba => "MambaDiff",
    }
}

fn mamba_variant(model: &ModelSpec) -> Option<facts::Variant> {
    match model.canonical() {
        ModelSpec::Mamba(c) => c.variant,
        _ => None,
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
        // Named by its variant only where the variant's sizes are what it resolves to.
        ModelSpec::Mamba(m) => match (mamba_variant(model), m.dims()) {
            (Some(v), _) => return format!("{title}-{v}"),
            (None, Ok(d)) => return format!("{title} {} x{}", facts::model::join(&d.stage_dims), d.heads),
            (None, Err(_)) => return format!("{title} (custom)"),
        },
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
    let grid = patch.filter(|p| *p > 0 && cfg.input.spatial.divisible_by(*p)).map(|p| cfg.input.spatial.div(p));
    let tokens = grid.map(|g| g.voxels());
    // Each token merge halves every side (rounding down, as the group's script
    // counts it: profile_hdit_uvit_memory.py@ff513e0:122-133).
    let bottleneck_tokens = match (&cfg.model, grid) {
        (ModelSpec::Hdit(m), Some(g)) => {
            let merged = (1..m.levels()).fold(g, |g, _| g.div(2));
            Some(merged.voxels())
        }
        _ => None,
    };
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
        bottleneck_tokens,
        voxels: cfg.input.spatial.voxels(),
        params: facts::params::count(&cfg.model, &cfg.input, cfg.out_channels).ok(),
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
        answer: None,
        chain: None,
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB
}

/// Writes `report.md` (in the report's layout), `report.json` and the plots
/// into `out`; returns the Markdown's path and the plot files written.
pub fn write(report: &Report, out: &Path) -> Result<(PathBuf, Vec<PathBuf>), ReportError> {
    std::fs::create_dir_all(out).map_err(|source| ReportError::Io { path: out.into(), source })?;
    let plots = plot::write_all(report, out).map_err(|e| ReportError::Plot(e.to_string()))?;
    let md = match report.layout {
        ReportLayout::Project => markdown::render(report, &plots, out),
        _ => group::render(report),
    };
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
        "host_memory": report.host_memory,
        "budget_gib": report.budget_gib,
        "budget_set": report.budget_set,
        "precisions": report.precisions,
        "predictor": report.predictor,
        "predicted_by": report.predicted_by,
        "active": report.active,
        "env": report.env,
        "rows": rows,
        "twins": report.twins,
        "layout": report.layout,
        "summary": report.summary(),
    })
}

#[cfg(test)]
mod tests;
