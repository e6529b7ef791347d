//! `worker fidelity`: this worker's peak against the group's measured peak,
//! config by config. Each selected record of a measurement file (the group's
//! `data/vram-measurements.jsonl`: PyTorch, bf16 autocast) is rebuilt as the
//! config it describes and run by this binary in a child process (`worker run
//! --config`, one process per config as in a sweep), and its result is set
//! beside the record's peak. The table says how close the worker comes to the
//! group's truth; which device that means is in its header.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use spec::event::{RunResult, RunStatus};
use spec::model::Family;
use spec::record::MeasurementRecord;

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
}

/// One config: the group's figure and the worker's.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub id: String,
    pub family: Family,
    pub measured_gib: f64,
    pub worker_gib: Option<f64>,
    pub status: RunStatus,
    pub message: Option<String>,
}

impl Row {
    /// Signed relative error of the worker's peak against the measured one.
    pub fn error(&self) -> Option<f64> {
        self.worker_gib.filter(|_| self.status == RunStatus::Ok).map(|w| w / self.measured_gib - 1.0)
    }
}

/// The records this comparison can run: PyTorch runs that fitted (`ok`),
/// measured peak within `max_peak_gib`; with gradient checkpointing only for the
/// transformer families, which the worker checkpoints per block as the group's
/// runs do (its UNet's checkpointing is Burn's op-level strategy, MONAI's none).
pub fn select(records: &[MeasurementRecord], max_peak_gib: f64) -> Vec<&MeasurementRecord> {
    records
        .iter()
        .filter(|r| r.framework == "pytorch" && r.superseded.is_none())
        .filter(|r| !r.grad_ckpt || r.family != Family::Unet)
        .filter(|r| r.peak_gb.is_some_and(|p| p <= max_peak_gib))
        .collect()
}

/// Run every selected record through this binary; rows in the file's order.
pub fn run(opts: &Options) -> Result<Vec<Row>> {
    let text = std::fs::read_to_string(&opts.records).with_context(|| format!("reading {}", opts.records.display()))?;
    let records = spec::record::read_jsonl(&text)
        .map_err(|(line, e)| anyhow::anyhow!("{}:{line}: {e}", opts.records.display()))?;
    let mut chosen = select(&records, opts.max_peak_gib);
    chosen.retain(|r| opts.families.is_empty() || opts.families.contains(&r.family));
    anyhow::ensure!(
        !chosen.is_empty(),
        "no record of {} is within {} GiB (and of the families asked for)",
        opts.records.display(),
        opts.max_peak_gib
    );
    let exe = std::env::current_exe().context("locating this worker binary")?;
    let mut rows = Vec::new();
    for (i, r) in chosen.iter().enumerate() {
        let row = run_one(&exe, r, opts)?;
        eprintln!(
            "[{}/{}] {}: {:?} {}",
            i + 1,
            chosen.len(),
            row.id,
            row.status,
            row.worker_gib.map(|g| format!("{g:.3} GiB (measured {:.3})", row.measured_gib)).unwrap_or_default()
        );
        rows.push(row);
    }
    Ok(rows)
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
    let status = Command::new(exe)
        .args(["run", "--backend", &opts.backend, "--config"])
        .arg(&path)
        .arg("--state-dir")
        .arg(&opts.state_dir)
        .status()
        .with_context(|| format!("running {}", exe.display()))?;
    let text = std::fs::read_to_string(&events).unwrap_or_default();
    // The last line that is a result (the spec's `RunResult` reads only those).
    let result = text.lines().rev().find_map(|l| serde_json::from_str::<RunResult>(l).ok());
    let (status, peak, message) = match result {
        Some(r) => (r.status, r.peak_bytes, r.message),
        None => (RunStatus::Failed, 0, Some(format!("no result written (worker exit {status})"))),
    };
    Ok(Row {
        id: r.id.clone(),
        family: r.family,
        measured_gib: r.peak_gb.unwrap_or(0.0),
        worker_gib: (status == RunStatus::Ok).then_some(peak as f64 / GIB),
        status,
        message,
    })
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The comparison as markdown: one row per config, then per family the median
/// and p90 of the absolute error and the median signed error.
pub fn markdown(rows: &[Row], device: &str) -> String {
    let mut out = format!(
        "Worker ({device}) against the group's PyTorch peaks, {} configs:\n\n| config | family | measured GiB | worker GiB | error |\n|---|---|---|---|---|\n",
        rows.len()
    );
    for r in rows {
        let (worker, err) = match (r.worker_gib, r.error()) {
            (Some(w), Some(e)) => (format!("{w:.3}"), format!("{:+.1}%", 100.0 * e)),
            _ => (format!("{:?}", r.status).to_lowercase(), r.message.clone().unwrap_or_default()),
        };
        out += &format!("| {} | {} | {:.2} | {worker} | {err} |\n", r.id, r.family.name(), r.measured_gib);
    }
    out += "\n| family | runs | median abs. error | p90 abs. error | median signed error |\n|---|---|---|---|---|\n";
    let mut families: Vec<Family> = rows.iter().map(|r| r.family).collect();
    families.sort_by_key(|f| f.name());
    families.dedup();
    for f in families {
        let mut signed: Vec<f64> = rows.iter().filter(|r| r.family == f).filter_map(Row::error).collect();
        if signed.is_empty() {
            continue;
        }
        let mut abs: Vec<f64> = signed.iter().map(|e| e.abs()).collect();
        signed.sort_by(f64::total_cmp);
        abs.sort_by(f64::total_cmp);
        out += &format!(
            "| {} | {} | {:.1}% | {:.1}% | {:+.1}% |\n",
            f.name(),
            abs.len(),
            100.0 * percentile(&abs, 0.5),
            100.0 * percentile(&abs, 0.9),
            100.0 * percentile(&signed, 0.5)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECORDS: &str = r#"{"id":"a","family":"dit","framework":"pytorch","gpu":"A100-SXM4-80GB","precision":"bf16-amp","grad_ckpt":false,"batch":1,"in_channels":1,"out_channels":1,"spatial":[8,8,8],"variant":"S","patch":4,"peak_gb":0.7,"status":"ok"}
{"id":"b","family":"dit","framework":"pytorch","gpu":"A100-SXM4-80GB","precision":"bf16-amp","grad_ckpt":true,"batch":1,"in_channels":1,"out_channels":1,"spatial":[8,8,8],"variant":"S","patch":4,"peak_gb":0.7,"status":"ok"}
{"id":"c","family":"dit","framework":"pytorch","gpu":"A100-SXM4-80GB","precision":"bf16-amp","grad_ckpt":false,"batch":1,"in_channels":1,"out_channels":1,"spatial":[8,8,8],"variant":"S","patch":4,"peak_gb":50.0,"status":"ok"}
{"id":"d","family":"dit","framework":"burn-flex","gpu":"cpu","precision":"bf16-amp","grad_ckpt":false,"batch":1,"in_channels":1,"out_channels":1,"spatial":[8,8,8],"variant":"S","patch":4,"peak_gb":0.7,"status":"ok"}
{"id":"e","family":"dit","framework":"pytorch","gpu":"A100-SXM4-80GB","precision":"bf16-amp","grad_ckpt":false,"batch":1,"in_channels":1,"out_channels":1,"spatial":[8,8,8],"variant":"S","patch":4,"status":"oom"}
{"id":"f","family":"unet","framework":"pytorch","gpu":"A100-SXM4-80GB","precision":"bf16-amp","grad_ckpt":true,"batch":1,"in_channels":1,"out_channels":1,"spatial":[8,8,8],"channels":[8,16],"attention_levels":[false,false],"num_res_blocks":[1,1],"num_head_channels":8,"peak_gb":0.5,"status":"ok"}"#;

    #[test]
    fn selects_pytorch_runs_that_fit_and_checkpoint_as_the_worker_does() {
        let recs = spec::record::read_jsonl(RECORDS).unwrap();
        let ids: Vec<&str> = select(&recs, 4.0).iter().map(|r| r.id.as_str()).collect();
        // b: a checkpointed transformer (per block, as the worker does); f: a
        // checkpointed UNet, which the worker cannot checkpoint as the group's ran.
        assert_eq!(ids, ["a", "b"]);
    }

    #[test]
    fn table_gives_signed_errors_and_family_summaries() {
        let row = |id: &str, measured: f64, worker: f64| Row {
            id: id.into(),
            family: Family::Dit,
            measured_gib: measured,
            worker_gib: Some(worker),
            status: RunStatus::Ok,
            message: None,
        };
        let rows = [row("a", 1.0, 1.1), row("b", 2.0, 1.8)];
        let md = markdown(&rows, "cpu");
        assert!(md.contains("| a | dit | 1.00 | 1.100 | +10.0% |"), "{md}");
        assert!(md.contains("| b | dit | 2.00 | 1.800 | -10.0% |"), "{md}");
        assert!(md.contains("| dit | 2 | 10.0% | 10.0% |"), "{md}");
    }
}
