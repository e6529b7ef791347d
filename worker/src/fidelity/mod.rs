//! `worker fidelity`: this worker's peak against the group's measured peak,
//! config by config. Each selected record of a measurement file (the group's
//! `data/vram-measurements.jsonl`: PyTorch, bf16 autocast) is rebuilt as the
//! config it describes and run by this binary in a child process (`worker run
//! --config`, one process per config as in a sweep), and its result is set
//! beside the record's peak. The table says how close the worker comes to the
//! group's truth; which device that means is in its header.
//!
//! Each row carries the worker's per-phase peaks (`model`: the f32 weights;
//! `fwd`, `bwd`; `step`: weights, gradients, AdamW moments and the foreach
//! step's square-root list), so an error is named by the phase that set the
//! peak, not only by its total. With `--predictions` (the JSON lines of
//! `orchestrator predict --records` on the same file) the precheck's
//! `pytorch` prediction and its peak phase stand beside them.
//!
//! A CPU run's allocations are also counted as PyTorch's CUDA caching
//! allocator counts them, per phase ([`crate::caching`]); with the cuBLAS
//! workspaces of the record's card added, that is the figure a CUDA run of
//! PyTorch would print ([`Row::on_card`]), the one set against the group's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use facts::event::{Phase, RunStatus};
use facts::gpu::Gpu;
use facts::model::Family;
use facts::record::MeasurementRecord;
use facts::run::ConfigHash;

mod reference;
mod table;
#[cfg(test)]
mod tests;

pub use reference::Reference;
pub use table::{markdown, read_predictions, Predicted};

const GIB: f64 = (1u64 << 30) as f64;

/// Which records to run, and how.
pub struct Options {
    pub records: PathBuf,
    /// Only records whose measured peak is at most this many GiB (what the device can hold).
    pub max_peak_gib: f64,
    /// Only records of these families (all when empty).
    pub families: Vec<Family>,
    /// Backend name passed to `worker run`.
    pub backend: String,
    /// Where the runs' events go (kept for inspection).
    pub state_dir: PathBuf,
    /// Record ids to leave out (configs the device cannot finish in reasonable time).
    pub skip: Vec<String>,
    /// Append each row here as a JSON line as its config ends (the file is truncated first).
    pub json: Option<PathBuf>,
}

/// One config: the group's figure and the worker's.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Row {
    pub id: String,
    pub family: Family,
    pub measured_gib: f64,
    pub worker_gib: Option<f64>,
    pub status: RunStatus,
    pub message: Option<String>,
    /// Parameters (the worker's count).
    pub params: u64,
    /// The worker's peak per phase, GiB: model, fwd, bwd, step.
    pub phases_gib: [Option<f64>; 4],
    /// Seconds the run took.
    pub wall_s: f64,
    /// The worker's peak per phase (model, fwd, bwd, step) as PyTorch's CUDA
    /// caching allocator counts the same allocations (CPU runs; absent in
    /// rows written before it was counted).
    #[serde(default)]
    pub counted_phases_gib: [Option<f64>; 4],
    /// The card the group's record ran on.
    #[serde(default)]
    pub gpu: Option<Gpu>,
    /// The figure scored against the record: the peak a CUDA PyTorch run on
    /// the record's card would print ([`Row::on_record_card`]), GiB; set as
    /// the row is written ([`Row::scored`]) and filled in as rows written
    /// before it are read.
    #[serde(default)]
    pub on_card_gib: Option<f64>,
}

impl Row {
    /// Signed relative error of the worker's peak against the measured one.
    pub fn error(&self) -> Option<f64> {
        self.worker_gib.filter(|_| self.status == RunStatus::Ok).map(|w| w / self.measured_gib - 1.0)
    }

    /// The peak as PyTorch's allocator counts it: the largest phase's.
    pub fn counted_gib(&self) -> Option<f64> {
        self.counted_phases_gib.into_iter().flatten().max_by(f64::total_cmp).filter(|_| self.status == RunStatus::Ok)
    }

    /// Signed relative error of the peak as PyTorch's allocator counts it.
    pub fn counted_error(&self) -> Option<f64> {
        self.counted_gib().map(|w| w / self.measured_gib - 1.0)
    }

    /// The peak a CUDA run of PyTorch on `gpu` would count: per phase, the
    /// allocations as its allocator counts them plus the cuBLAS workspaces
    /// the phase holds ([`crate::caching::cuda_workspaces`]).
    pub fn on_card(&self, gpu: Gpu) -> Option<f64> {
        let ok = self.status == RunStatus::Ok;
        (Phase::ALL.into_iter().zip(self.counted_phases_gib))
            .filter_map(|(phase, g)| Some(g? + crate::caching::cuda_workspaces(gpu, phase) as f64 / GIB))
            .max_by(f64::total_cmp)
            .filter(|_| ok)
    }

    /// [`Row::on_card`] on the record's own card.
    pub fn on_record_card(&self) -> Option<f64> {
        self.on_card(self.gpu?)
    }

    /// The row with [`Row::on_card_gib`] set from its counted phases and card.
    pub fn scored(self) -> Row {
        Row { on_card_gib: self.on_record_card(), ..self }
    }

    /// Signed relative error of the peak on the record's card.
    pub fn on_card_error(&self) -> Option<f64> {
        self.on_record_card().map(|w| w / self.measured_gib - 1.0)
    }

    /// [`Row::on_card_error`] beyond the group's rounding: their reports give
    /// peaks to 0.1 GiB, so a peak within 0.05 GiB of the figure is one the
    /// figure cannot tell from the truth (0), and one outside is off by its
    /// distance to that interval, relative to the figure.
    pub fn error_beyond_rounding(&self) -> Option<f64> {
        let (m, half) = (self.measured_gib, REPORT_ROUNDING_GIB / 2.0);
        self.on_record_card().map(|w| {
            let off = if w < m - half { w - (m - half) } else { (w - (m + half)).max(0.0) };
            off / m
        })
    }
}

/// The step of the group's reported peaks (`62.1 GB`).
const REPORT_ROUNDING_GIB: f64 = 0.1;

/// The records this comparison can run: PyTorch runs that fitted (`ok`),
/// measured peak within `max_peak_gib`, with or without gradient checkpointing
/// (the transformers checkpoint per block as the group's do; the UNet, like
/// MONAI's, has nothing to checkpoint and runs unchanged).
pub fn select(records: &[MeasurementRecord], max_peak_gib: f64) -> Vec<&MeasurementRecord> {
    records
        .iter()
        .filter(|r| r.framework == "pytorch" && r.superseded.is_none())
        .filter(|r| r.peak_gb.is_some_and(|p| p <= max_peak_gib))
        .collect()
}

/// Run every selected record through this binary; rows in the file's order.
pub fn run(opts: &Options) -> Result<Vec<Row>> {
    let text = std::fs::read_to_string(&opts.records).with_context(|| format!("reading {}", opts.records.display()))?;
    let records = facts::record::read_jsonl(&text)
        .map_err(|(line, e)| anyhow::anyhow!("{}:{line}: {e}", opts.records.display()))?;
    let mut chosen = select(&records, opts.max_peak_gib);
    chosen.retain(|r| opts.families.is_empty() || opts.families.contains(&r.family));
    chosen.retain(|r| !opts.skip.iter().any(|id| id == &r.id));
    anyhow::ensure!(
        !chosen.is_empty(),
        "no record of {} is within {} GiB (and of the families asked for)",
        opts.records.display(),
        opts.max_peak_gib
    );
    let exe = std::env::current_exe().context("locating this worker binary")?;
    if let Some(path) = &opts.json {
        std::fs::write(path, "").with_context(|| format!("writing {}", path.display()))?;
    }
    let mut rows: Vec<Row> = Vec::new();
    // The reports repeat some runs in two tables (DiT latent and pixel): a
    // config the worker already ran (same model, input and precision) is not run again.
    // Records of one config (its hash: everything but the names) share a run.
    let mut done: HashMap<ConfigHash, usize> = HashMap::new();
    for (i, r) in chosen.iter().enumerate() {
        let key = r.run_config()?.hash();
        let row = match done.get(&key) {
            Some(&j) => {
                Row { id: r.id.clone(), measured_gib: r.peak_gb.unwrap_or(0.0), gpu: r.gpu(), ..rows[j].clone() }
            }
            None => {
                done.insert(key, rows.len());
                run_one(&exe, r, opts)?
            }
        }
        .scored();
        eprintln!(
            "[{}/{}] {}: {:?} {}",
            i + 1,
            chosen.len(),
            row.id,
            row.status,
            row.worker_gib.map(|g| format!("{g:.3} GiB (measured {:.3})", row.measured_gib)).unwrap_or_default()
        );
        if let Some(path) = &opts.json {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().append(true).open(path)?;
            writeln!(f, "{}", serde_json::to_string(&row)?).with_context(|| format!("writing {}", path.display()))?;
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Rows as `--json` wrote them; a row written before rows carried
/// [`Row::on_card_gib`] gets it from its counted phases and card.
pub fn read_rows(text: &str) -> Result<Vec<Row>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            let row: Row = serde_json::from_str(l).with_context(|| format!("row line {}", i + 1))?;
            Ok(if row.on_card_gib.is_none() { row.scored() } else { row })
        })
        .collect()
}

fn run_one(exe: &Path, r: &MeasurementRecord, opts: &Options) -> Result<Row> {
    let mut cfg = r.run_config()?;
    cfg.experiment = "fidelity".into();
    cfg.name = r.id.replace(['/', '@'], "_");
    let dir = opts.state_dir.join("fidelity").join("configs");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{}.json", cfg.name));
    std::fs::write(&path, serde_json::to_string(&cfg)?).with_context(|| format!("writing {}", path.display()))?;
    let events = crate::events::events_path(&opts.state_dir, &cfg);
    let _ = std::fs::remove_file(&events);
    // Measured as the script behind the record's table did.
    let protocol = r.table.as_deref().and_then(facts::protocol::Protocol::of_table).unwrap_or_default();
    let status = Command::new(exe)
        .args(["run", "--backend", &opts.backend, "--protocol", protocol.name(), "--config"])
        .arg(&path)
        .arg("--state-dir")
        .arg(&opts.state_dir)
        .status()
        .with_context(|| format!("running {}", exe.display()))?;
    let Some(res) = crate::events::written_since(&opts.state_dir, &cfg, 0.0).result else {
        let message = Some(format!("no result written (worker exit {status})"));
        return Ok(Row {
            id: r.id.clone(),
            family: r.family,
            measured_gib: r.peak_gb.unwrap_or(0.0),
            worker_gib: None,
            status: RunStatus::Failed,
            message,
            params: 0,
            phases_gib: [None; 4],
            wall_s: 0.0,
            counted_phases_gib: [None; 4],
            gpu: r.gpu(),
            on_card_gib: None,
        });
    };
    let gib = |b: Option<u64>| b.map(|b| b as f64 / GIB);
    let p = &res.peaks;
    let counted = res.as_pytorch_counts.filter(|_| res.status == RunStatus::Ok).unwrap_or_default();
    Ok(Row {
        id: r.id.clone(),
        family: r.family,
        measured_gib: r.peak_gb.unwrap_or(0.0),
        worker_gib: (res.status == RunStatus::Ok).then_some(res.peak_bytes as f64 / GIB),
        status: res.status,
        message: res.message,
        params: res.params,
        phases_gib: [gib(p.model), gib(p.fwd), gib(p.bwd), gib(p.step)],
        wall_s: res.wall_s,
        counted_phases_gib: [gib(counted.model), gib(counted.fwd), gib(counted.bwd), gib(counted.step)],
        gpu: r.gpu(),
        on_card_gib: None,
    })
}
