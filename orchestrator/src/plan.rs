//! `orchestrator plan`: every config of a sweep, whether it can run, its exact
//! size and the precheck's verdict, before anything is submitted.

use facts::model::ModelSpec;
use facts::params;
use serde::Serialize;
use std::io::Write;

use crate::precheck::{memory, Predictor, Verdict};
use crate::sweep::{Sweep, SweepConfig};
use crate::util::table::{millions, render_table};

/// One row of the plan table.
#[derive(Debug, Clone, Serialize)]
pub struct PlanRow {
    pub name: String,
    pub hash: String,
    pub family: String,
    /// Key dimensions (`[32, 64, 128] attn[FTT] r=1 h=64`, `S (h384 x6 d12) p2`).
    pub dims: String,
    /// Voxels (UNet) or tokens (transformers) at each level, top level first.
    pub per_level: Vec<u64>,
    /// Exact parameter count (absent when the config cannot be built).
    pub params: Option<u64>,
    /// Predicted peak of the profiling step in GiB.
    pub predicted_gib: Option<f64>,
    /// Predicted peak of the training run in GiB: the largest of its phases.
    pub train_gib: Option<f64>,
    /// The phase expected to set it (`step`, `generation`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_phase: Option<&'static str>,
    /// Its band, ± this fraction.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_band: Option<f64>,
    /// The memory the verdict is judged against: the GPU's, or the worker's
    /// memory limit where lower.
    pub capacity_gib: f64,
    /// `valid` or `invalid: reason`.
    pub status: String,
    pub verdict: Verdict,
}

/// Rows for every config in sweep order.
pub fn rows(sweep: &Sweep, predictor: &Predictor) -> Vec<PlanRow> {
    let runs = crate::util::par::chunks(&sweep.configs, |run| {
        let mut dims = Dims::default();
        run.iter().map(|c| row(sweep, c, predictor, &mut dims)).collect::<Vec<_>>()
    });
    runs.concat()
}

/// `plan --json`: one JSON object a line for every config in sweep order.
/// The configs go in rounds: each round's lines are made on every core (a
/// run of configs each) and written before the next round's, so the output
/// starts at once and the memory holds one round's text.
pub fn write_json(sweep: &Sweep, predictor: &Predictor, out: &mut impl Write) -> std::io::Result<()> {
    const ROUND: usize = 16 * 1024;
    for round in sweep.configs.chunks(ROUND) {
        let runs = crate::util::par::chunks(round, |run| {
            let mut dims = Dims::default();
            let mut text = Vec::with_capacity(run.len() * 512);
            for c in run {
                serde_json::to_writer(&mut text, &row(sweep, c, predictor, &mut dims))?;
                text.push(b'\n');
            }
            Ok::<_, serde_json::Error>(text)
        });
        for text in runs {
            out.write_all(&text?)?;
        }
    }
    out.flush()
}

/// The last model's [`ModelSpec::summary`]: neighbouring configs mostly share their model.
#[derive(Default)]
struct Dims(Option<(ModelSpec, String)>);

impl Dims {
    fn of(&mut self, model: &ModelSpec) -> String {
        match &self.0 {
            Some((m, dims)) if m == model => dims.clone(),
            _ => self.0.insert((model.clone(), model.summary())).1.clone(),
        }
    }
}

fn row(sweep: &Sweep, c: &SweepConfig, predictor: &Predictor, dims: &mut Dims) -> PlanRow {
    let cfg = &c.config;
    let per_level = params::level_grids(&cfg.model, &cfg.input).iter().map(|g| g.voxels()).collect();
    // One prediction (without the term breakdown) gives the sizes and the verdict.
    let prediction = if c.is_valid() { Some(predictor.predict_peak(cfg)) } else { None };
    let verdict = match &prediction {
        None => Verdict::Invalid { reasons: c.invalid.iter().map(|i| i.to_string()).collect() },
        Some(Ok(p)) => sweep.verdict_of(predictor, c, p),
        Some(Err(e)) => Verdict::Invalid { reasons: vec![e.to_string()] },
    };
    let prediction = prediction.and_then(Result::ok);
    let params = match &prediction {
        Some(p) => Some(p.params),
        None if c.is_valid() => params::count(&cfg.model, &cfg.input, cfg.out_channels).ok(),
        None => None,
    };
    PlanRow {
        name: c.name.clone(),
        hash: c.hash.to_string(),
        family: cfg.model.family().to_string(),
        dims: dims.of(&cfg.model),
        per_level,
        params,
        predicted_gib: prediction.as_ref().map(|p| p.peak_gib()),
        train_gib: prediction.as_ref().map(|p| p.train_peak_gib()),
        train_phase: prediction.as_ref().map(|p| p.train.peak_phase.short()),
        train_band: prediction.as_ref().map(|p| p.train.rel_uncertainty),
        capacity_gib: sweep.available_gib(c),
        status: c.status(),
        verdict,
    }
}

/// Counts per level, compact: `163840/20480/2560`.
fn per_level(v: &[u64]) -> String {
    v.iter().map(|n| n.to_string()).collect::<Vec<_>>().join("/")
}

/// `19.4G±13% gen`: the training figure, its band and the phase that sets it.
fn train_cell(r: &PlanRow) -> String {
    match (r.train_gib, r.train_band, r.train_phase) {
        (Some(g), Some(b), Some(p)) => format!("{}±{:.0}% {p}", memory(g), 100.0 * b),
        _ => "-".into(),
    }
}

/// One row of the plan table, as text.
fn cells_of(r: &PlanRow) -> Vec<String> {
    let gib = |g: Option<f64>| g.map(memory).unwrap_or_else(|| "-".into());
    let verdict = match &r.verdict {
        Verdict::Invalid { .. } => r.status.clone(),
        v => v.to_string(),
    };
    vec![
        r.name.clone(),
        r.family.clone(),
        r.dims.clone(),
        per_level(&r.per_level),
        r.params.map(millions).unwrap_or_else(|| "-".into()),
        gib(r.predicted_gib),
        train_cell(r),
        memory(r.capacity_gib),
        verdict,
    ]
}

/// The plan as an aligned text table with a one-line summary.
pub fn table(sweep: &Sweep, rows: &[PlanRow]) -> String {
    let header =
        ["Config", "Family", "Dims", "Voxels|tokens per level", "Params", "Peak", "Train", "Capacity", "Verdict"];
    let mut cells: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    cells.extend(crate::util::par::map(rows, cells_of));
    let mut out = render_table(&cells);
    let count = |name: &str| rows.iter().filter(|r| r.verdict.name() == name).count();
    let on = match sweep.host_memory_gib {
        Some(_) => "this machine's CPU".to_string(),
        None => sweep.experiment.gpu.to_string(),
    };
    out.push_str(&format!(
        "\n{}: {} configs on {on}: {} fit, {} risky, {} predicted OOM, {} invalid\n",
        sweep.experiment.name,
        rows.len(),
        count("fits"),
        count("risky"),
        count("oom"),
        count("invalid"),
    ));
    out
}
