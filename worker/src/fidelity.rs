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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use spec::event::{Phase, RunStatus};
use spec::model::Family;
use spec::record::MeasurementRecord;
use spec::run::ConfigHash;

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
    /// The worker's peak as PyTorch's CUDA caching allocator counts the same
    /// allocations (CPU runs; absent in rows written before it was counted).
    #[serde(default)]
    pub counted_gib: Option<f64>,
}

impl Row {
    /// Signed relative error of the worker's peak against the measured one.
    pub fn error(&self) -> Option<f64> {
        self.worker_gib.filter(|_| self.status == RunStatus::Ok).map(|w| w / self.measured_gib - 1.0)
    }

    /// Signed relative error of the peak as PyTorch's allocator counts it.
    pub fn counted_error(&self) -> Option<f64> {
        self.counted_gib.filter(|_| self.status == RunStatus::Ok).map(|w| w / self.measured_gib - 1.0)
    }

    /// [`Row::counted_error`] beyond the group's rounding: their reports give
    /// peaks to 0.1 GiB, so a peak within 0.05 GiB of the figure is one the
    /// figure cannot tell from the truth (0), and one outside is off by its
    /// distance to that interval, relative to the figure.
    pub fn error_beyond_rounding(&self) -> Option<f64> {
        let (m, half) = (self.measured_gib, REPORT_ROUNDING_GIB / 2.0);
        self.counted_gib.filter(|_| self.status == RunStatus::Ok).map(|w| {
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
    let records = spec::record::read_jsonl(&text)
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
            Some(&j) => Row { id: r.id.clone(), measured_gib: r.peak_gb.unwrap_or(0.0), ..rows[j].clone() },
            None => {
                done.insert(key, rows.len());
                run_one(&exe, r, opts)?
            }
        };
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

/// Rows as `--json` wrote them.
pub fn read_rows(text: &str) -> Result<Vec<Row>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("row line {}", i + 1)))
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
    let status = Command::new(exe)
        .args(["run", "--backend", &opts.backend, "--config"])
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
            counted_gib: None,
        });
    };
    let gib = |b: Option<u64>| b.map(|b| b as f64 / GIB);
    let p = &res.peaks;
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
        counted_gib: res
            .as_pytorch_counts
            .filter(|_| res.status == RunStatus::Ok)
            .and_then(|c| [c.model, c.fwd, c.bwd, c.step].into_iter().flatten().max())
            .map(|b| b as f64 / GIB),
    })
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The precheck's prediction of a record: `orchestrator predict --records`'s
/// JSON line (peak, its phase, both phases' peaks, the terms at the peak by kind).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Predicted {
    pub id: String,
    pub peak_gb: Option<f64>,
    #[serde(default)]
    pub fwd_bwd_gb: Option<f64>,
    #[serde(default)]
    pub step_gb: Option<f64>,
    #[serde(default)]
    pub terms: std::collections::BTreeMap<String, f64>,
}

impl Predicted {
    /// The terms at the peak, largest first, those of at least 1% of it: `activations 0.41, weights 0.12`.
    fn terms_text(&self) -> String {
        let peak = self.peak_gb.unwrap_or(0.0);
        let mut t: Vec<(&String, &f64)> = self.terms.iter().filter(|(_, &g)| g >= 0.01 * peak).collect();
        t.sort_by(|a, b| b.1.total_cmp(a.1));
        t.iter().map(|(k, g)| format!("{k} {g:.2}")).collect::<Vec<_>>().join(", ")
    }
}

/// Read `orchestrator predict`'s JSON lines, by record id.
pub fn read_predictions(text: &str) -> Result<HashMap<String, Predicted>> {
    let mut out = HashMap::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let p: Predicted = serde_json::from_str(line).with_context(|| format!("prediction line {}", i + 1))?;
        out.insert(p.id.clone(), p);
    }
    Ok(out)
}

fn cell(x: Option<f64>) -> String {
    x.map(|g| format!("{g:.3}")).unwrap_or_else(|| "-".into())
}

/// The phase that set the worker's peak, and the bytes per parameter the step holds.
fn peak_phase(r: &Row) -> (&'static str, Option<f64>) {
    let best = (0..4)
        .filter(|&i| r.phases_gib[i].is_some())
        .max_by(|&a, &b| r.phases_gib[a].unwrap_or(0.0).total_cmp(&r.phases_gib[b].unwrap_or(0.0)));
    let per_param = r.phases_gib[3].filter(|_| r.params > 0).map(|g| g * GIB / r.params as f64);
    (best.map_or("-", |i| Phase::ALL[i].name()), per_param)
}

/// One summary line of `error`: runs, median and p90 of |error|, median signed error.
fn summary(name: &str, rows: &[&Row], error: fn(&Row) -> Option<f64>) -> Option<String> {
    let mut signed: Vec<f64> = rows.iter().filter_map(|r| error(r)).collect();
    if signed.is_empty() {
        return None;
    }
    let mut abs: Vec<f64> = signed.iter().map(|e| e.abs()).collect();
    signed.sort_by(f64::total_cmp);
    abs.sort_by(f64::total_cmp);
    Some(format!(
        "| {name} | {} | {:.1}% | {:.1}% | {:+.1}% |\n",
        abs.len(),
        100.0 * percentile(&abs, 0.5),
        100.0 * percentile(&abs, 0.9),
        100.0 * percentile(&signed, 0.5)
    ))
}

/// The comparison as markdown: one row per config (the worker's peak and,
/// where counted, the same allocations as PyTorch's allocator counts them,
/// the worker's per-phase peaks, the phase that set its peak, the step's
/// bytes per parameter, and the precheck's prediction where given), then per
/// family and overall the median and p90 of the absolute error and the median
/// signed error, of both figures.
/// `before`: the rows of an earlier run of the command (its `--json`), whose
/// error stands beside each config's as "before", and per family.
pub fn markdown(rows: &[Row], device: &str, predictions: &HashMap<String, Predicted>, before: &[Row]) -> String {
    let before: HashMap<&str, &Row> = before.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut out = format!(
        "Worker ({device}) against the group's PyTorch peaks, {} configs (GiB; phases are the worker's):\n\n\
         | config | family | measured | worker | error | as PyTorch counts | its error | before | model | fwd | bwd | step \
         | peak in | step B/param | precheck | precheck fwd+bwd | precheck step | precheck terms at its peak |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        rows.len()
    );
    for r in rows {
        let (worker, err) = match (r.worker_gib, r.error()) {
            (Some(w), Some(e)) => (format!("{w:.3}"), format!("{:+.1}%", 100.0 * e)),
            _ => (format!("{:?}", r.status).to_lowercase(), r.message.clone().unwrap_or_default()),
        };
        let [m, f, b, st] = r.phases_gib.map(cell);
        let (phase, bpp) = peak_phase(r);
        let pred = predictions.get(&r.id);
        out += &format!(
            "| {} | {} | {:.2} | {worker} | {err} | {} | {} | {} | {m} | {f} | {b} | {st} | {phase} | {} | {} | {} | {} | {} |\n",
            r.id,
            r.family.name(),
            r.measured_gib,
            cell(r.counted_gib.filter(|_| r.status == RunStatus::Ok)),
            r.counted_error().map_or("-".into(), |e| format!("{:+.1}%", 100.0 * e)),
            before.get(r.id.as_str()).and_then(|b| b.error()).map_or("-".into(), |e| format!("{:+.1}%", 100.0 * e)),
            bpp.map_or("-".into(), |x| format!("{x:.1}")),
            cell(pred.and_then(|p| p.peak_gb)),
            cell(pred.and_then(|p| p.fwd_bwd_gb)),
            cell(pred.and_then(|p| p.step_gb)),
            pred.map(Predicted::terms_text).unwrap_or_default(),
        );
    }
    let mut families: Vec<Family> = rows.iter().map(|r| r.family).collect();
    families.sort_by_key(|f| f.name());
    families.dedup();
    let all: Vec<&Row> = rows.iter().collect();
    out += &summaries("The worker's peak", &families, &all, Row::error);
    if rows.iter().any(|r| r.counted_error().is_some()) {
        out += &summaries("As PyTorch's allocator counts it", &families, &all, Row::counted_error);
        out += &summaries(
            "As PyTorch's allocator counts it, beyond the reports' rounding to 0.1 GiB (0 within 0.05 GiB of the figure)",
            &families,
            &all,
            Row::error_beyond_rounding,
        );
    }
    if !before.is_empty() {
        let earlier: Vec<&Row> = before.values().copied().collect();
        out += &summaries("Before (the earlier run's rows, on the configs it ran)", &families, &earlier, Row::error);
    }
    out
}

/// A titled table of `error`'s summary lines: per family, then all.
fn summaries(title: &str, families: &[Family], rows: &[&Row], error: fn(&Row) -> Option<f64>) -> String {
    let mut out = format!(
        "\n{title}:\n\n| family | runs | median abs. error | p90 abs. error | median signed error |\n|---|---|---|---|---|\n"
    );
    for f in families {
        let of: Vec<&Row> = rows.iter().copied().filter(|r| r.family == *f).collect();
        out += &summary(f.name(), &of, error).unwrap_or_default();
    }
    out + &summary("all", rows, error).unwrap_or_default()
}

/// PyTorch's own run of some of the same configs (a GPU check's
/// `pytorch.jsonl`: the project's reference models, `max_memory_allocated`):
/// its peak by the group's record id, matched by config hash.
#[derive(Debug, Clone, Default)]
pub struct Reference {
    /// The GPU it ran on.
    pub device: String,
    pub peaks_gib: HashMap<String, f64>,
}

impl Reference {
    /// The reference records' peaks, keyed by the id of the group's record
    /// of the same config (hash: everything but names).
    pub fn matching(group: &[MeasurementRecord], reference: &[MeasurementRecord]) -> Result<Reference> {
        let mut by_hash: HashMap<ConfigHash, &MeasurementRecord> = HashMap::new();
        for r in reference.iter().filter(|r| r.status == spec::record::MeasuredStatus::Ok && r.peak_gb.is_some()) {
            by_hash.insert(r.run_config().with_context(|| format!("reference record {}", r.id))?.hash(), r);
        }
        let mut out = Reference::default();
        for g in group {
            let Ok(cfg) = g.run_config() else { continue };
            if let Some(r) = by_hash.get(&cfg.hash()) {
                out.device.clone_from(&r.gpu);
                out.peaks_gib.insert(g.id.clone(), r.peak_gb.unwrap_or_default());
            }
        }
        Ok(out)
    }

    /// The rows PyTorch also ran: the group's figure, PyTorch's, the worker's
    /// as PyTorch counts, the worker against PyTorch and PyTorch against the
    /// group; then per family the median and p90 of both absolute errors.
    pub fn markdown(&self, rows: &[Row]) -> String {
        let both: Vec<(&Row, f64, f64)> = rows
            .iter()
            .filter_map(|r| {
                Some((r, *self.peaks_gib.get(&r.id)?, r.counted_gib.filter(|_| r.status == RunStatus::Ok)?))
            })
            .collect();
        if both.is_empty() {
            return String::new();
        }
        let pct = |x: f64| format!("{:+.1}%", 100.0 * x);
        let mut out = format!(
            "\nAgainst PyTorch's own run of the same configs ({}, the project's reference models), {} configs (GiB):\n\n\
             | config | family | group | PyTorch | worker as PyTorch counts | worker vs PyTorch | PyTorch vs group |\n\
             |---|---|---|---|---|---|---|\n",
            self.device,
            both.len()
        );
        for (r, torch, counted) in &both {
            out += &format!(
                "| {} | {} | {:.2} | {torch:.3} | {counted:.3} | {} | {} |\n",
                r.id,
                r.family.name(),
                r.measured_gib,
                pct(counted / torch - 1.0),
                pct(torch / r.measured_gib - 1.0)
            );
        }
        out += "\n| family | runs | worker vs PyTorch: median, p90 abs. | PyTorch vs group: median, p90 abs. |\n|---|---|---|---|\n";
        let mut families: Vec<Family> = both.iter().map(|(r, ..)| r.family).collect();
        families.sort_by_key(|f| f.name());
        families.dedup();
        let line = |name: &str, of: Vec<&(&Row, f64, f64)>| {
            let stats = |f: &dyn Fn(&(&Row, f64, f64)) -> f64| {
                let mut v: Vec<f64> = of.iter().map(|x| f(x).abs()).collect();
                v.sort_by(f64::total_cmp);
                format!("{:.1}%, {:.1}%", 100.0 * percentile(&v, 0.5), 100.0 * percentile(&v, 0.9))
            };
            let worker = stats(&|(_, t, c)| c / t - 1.0);
            let torch = stats(&|(r, t, _)| t / r.measured_gib - 1.0);
            format!("| {name} | {} | {worker} | {torch} |\n", of.len())
        };
        for f in &families {
            out += &line(f.name(), both.iter().filter(|(r, ..)| r.family == *f).collect());
        }
        out + &line("all", both.iter().collect())
    }
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
    fn selects_pytorch_runs_that_fit_with_and_without_checkpointing() {
        let recs = spec::record::read_jsonl(RECORDS).unwrap();
        let ids: Vec<&str> = select(&recs, 4.0).iter().map(|r| r.id.as_str()).collect();
        // b: a checkpointed transformer (per block, as the worker does); f: a
        // checkpointed UNet, which runs as the group's did (nothing to checkpoint).
        assert_eq!(ids, ["a", "b", "f"]);
    }

    #[test]
    fn pytorchs_run_is_matched_by_config_and_set_beside_the_worker() {
        let group = spec::record::read_jsonl(RECORDS).unwrap();
        // PyTorch's run of record a's config under another id and GPU: it
        // answers every record of that config (c, d, e differ from a only in
        // figures and framework); b (checkpointing) and f (a UNet) are other configs.
        let torch = RECORDS.lines().next().unwrap().replace(r#""id":"a""#, r#""id":"ref/a""#);
        let torch = torch.replace("A100-SXM4-80GB", "NVIDIA H200").replace(r#""peak_gb":0.7"#, r#""peak_gb":0.69"#);
        let reference = Reference::matching(&group, &spec::record::read_jsonl(&torch).unwrap()).unwrap();
        assert_eq!(reference.device, "NVIDIA H200");
        let matched: std::collections::BTreeSet<&str> = reference.peaks_gib.keys().map(String::as_str).collect();
        assert_eq!(matched, ["a", "c", "d", "e"].into());
        assert!(reference.peaks_gib.values().all(|&g| g == 0.69), "{:?}", reference.peaks_gib);
        let row = |id: &str| Row {
            id: id.into(),
            family: Family::Dit,
            measured_gib: 0.7,
            worker_gib: Some(0.5),
            status: RunStatus::Ok,
            message: None,
            params: 1,
            phases_gib: [None; 4],
            wall_s: 1.0,
            counted_gib: Some(0.6),
        };
        let md = reference.markdown(&[row("a"), row("b")]);
        assert!(md.contains("(NVIDIA H200, the project's reference models), 1 configs"), "{md}");
        // 0.6 against 0.69: -13.0%; 0.69 against 0.7: -1.4%.
        assert!(md.contains("| a | dit | 0.70 | 0.690 | 0.600 | -13.0% | -1.4% |"), "{md}");
        assert!(md.contains("| all | 1 | 13.0%, 13.0% | 1.4%, 1.4% |"), "{md}");
        assert_eq!(Reference::default().markdown(&[row("a")]), "", "nothing in common, no table");
    }

    #[test]
    fn an_error_within_the_reports_rounding_counts_as_none() {
        let row = |counted: f64| Row {
            id: "a".into(),
            family: Family::Dit,
            measured_gib: 0.7,
            worker_gib: Some(counted - 0.01),
            status: RunStatus::Ok,
            message: None,
            params: 1,
            phases_gib: [None; 4],
            wall_s: 1.0,
            counted_gib: Some(counted),
        };
        let beyond = |counted: f64| row(counted).error_beyond_rounding().unwrap();
        assert_eq!(beyond(0.66), 0.0);
        assert_eq!(beyond(0.749), 0.0);
        assert!((beyond(0.634) - (0.634 - 0.65) / 0.7).abs() < 1e-12);
        assert!((beyond(0.80) - 0.05 / 0.7).abs() < 1e-12);
        assert_eq!(Row { status: RunStatus::Oom, ..row(0.9) }.error_beyond_rounding(), None);
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
            params: 1 << 26,
            phases_gib: [Some(0.25), Some(worker / 2.0), Some(worker / 2.0), Some(worker)],
            wall_s: 1.0,
            counted_gib: Some(worker * 1.05),
        };
        let rows = [row("a", 1.0, 1.1), row("b", 2.0, 1.8)];
        let predictions = read_predictions(
            r#"{"id":"a","peak_gb":0.95,"fits":true,"verdict":"fits","peak_phase":"step","fwd_bwd_gb":0.5,"step_gb":0.95,"terms":{"weights":0.2,"grads":0.2,"optimizer":0.55}}"#,
        )
        .unwrap();
        let earlier = [row("a", 1.0, 0.7)];
        let md = markdown(&rows, "cpu", &predictions, &earlier);
        // a: its step (1.1 GiB for 2^26 parameters: 17.6 B each) beside the precheck's 0.95 GiB step.
        assert!(
            md.contains(
                "| a | dit | 1.00 | 1.100 | +10.0% | 1.155 | +15.5% | -30.0% | 0.250 | 0.550 | 0.550 | 1.100 | step | 17.6 \
                 | 0.950 | 0.500 | 0.950 | optimizer 0.55, grads 0.20, weights 0.20 |"
            ),
            "{md}"
        );
        assert!(md.contains("| b | dit | 2.00 | 1.800 | -10.0% | 1.890 | -5.5% |"), "{md}");
        let section = |title: &str| md.split(title).nth(1).unwrap_or_else(|| panic!("{title}: {md}")).to_string();
        let worker = section("The worker's peak:");
        assert!(worker.contains("| dit | 2 | 10.0% | 10.0% |"), "{md}");
        assert!(worker.contains("| all | 2 | 10.0% | 10.0% |"), "{md}");
        // Counted: +15.5% and -5.5%; the median of two is the upper one here (index 0.5 rounds to 1).
        let counted = section("As PyTorch's allocator counts it:");
        assert!(counted.contains("| dit | 2 | 15.5% | 15.5% | +15.5% |"), "{md}");
        // a: 1.155 is 0.105 above 1.05, the top of what rounds to 1.0: +10.5%;
        // b: 1.89 is 0.06 under 1.95: -3.0%.
        let beyond = section("beyond the reports' rounding to 0.1 GiB (0 within 0.05 GiB of the figure):");
        assert!(beyond.contains("| dit | 2 | 10.5% | 10.5% | +10.5% |"), "{md}");
        assert!(section("Before (the earlier").contains("| all | 1 | 30.0% | 30.0% | -30.0% |"), "{md}");
    }
}
