//! The comparison's tables: one row per config, then per family the median
//! and p90 of each figure's error.

use std::collections::HashMap;

use anyhow::{Context, Result};
use facts::event::Phase;
use facts::model::Family;

use super::{Row, GIB};

pub(super) fn percentile(sorted: &[f64], q: f64) -> f64 {
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

pub(super) fn cell(x: Option<f64>) -> String {
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
    summary_line(name, rows.iter().filter_map(|r| error(r)).collect())
}

/// `| name | n | median abs. | p90 abs. | median signed |` of signed errors (none: no line).
pub(super) fn summary_line(name: &str, mut signed: Vec<f64>) -> Option<String> {
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
/// and that with the cuBLAS workspaces of the record's card,
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
         | config | family | measured | worker | error | as PyTorch counts | its error | on its card | its error | before \
         | model | fwd | bwd | step | peak in | step B/param | precheck | precheck fwd+bwd | precheck step \
         | precheck terms at its peak |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        rows.len()
    );
    let pct = |e: Option<f64>| e.map_or("-".into(), |e| format!("{:+.1}%", 100.0 * e));
    for r in rows {
        let (worker, err) = match (r.worker_gib, r.error()) {
            (Some(w), Some(e)) => (format!("{w:.3}"), format!("{:+.1}%", 100.0 * e)),
            _ => (format!("{:?}", r.status).to_lowercase(), r.message.clone().unwrap_or_default()),
        };
        let [m, f, b, st] = r.phases_gib.map(cell);
        let (phase, bpp) = peak_phase(r);
        let pred = predictions.get(&r.id);
        out += &format!(
            "| {} | {} | {:.2} | {worker} | {err} | {} | {} | {} | {} | {} | {m} | {f} | {b} | {st} | {phase} | {} | {} | {} | {} | {} |\n",
            r.id,
            r.family.name(),
            r.measured_gib,
            cell(r.counted_gib()),
            pct(r.counted_error()),
            cell(r.on_record_card()),
            pct(r.on_card_error()),
            pct(before.get(r.id.as_str()).and_then(|b| b.error())),
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
    }
    if rows.iter().any(|r| r.on_card_error().is_some()) {
        out += &summaries(
            "On the record's card: as PyTorch's allocator counts it, with the card's cuBLAS workspaces",
            &families,
            &all,
            Row::on_card_error,
        );
        out += &summaries(
            "On the record's card, beyond the reports' rounding to 0.1 GiB (0 within 0.05 GiB of the figure)",
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
