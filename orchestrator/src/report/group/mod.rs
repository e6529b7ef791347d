//! The report in the layout of the group's own profiling scripts: the tables
//! of `docs/profiling_results.md` in `ModeS7/AIS4900_master` (at 0ee6133),
//! their columns, number formats and status labels, regenerated from a
//! sweep's runs. An experiment names the script it follows
//! (`report_layout:`); nothing here is the group's code, only the facts of
//! what their tables print, cited `path@commit:line`.
//!
//! `unet.rs`: the latent UNet and S2D tables; `transformer.rs`: DiT, HDiT and
//! U-ViT. What is not a measurement of the group's kind (a failed run, a
//! config never submitted) keeps the project's status words, so no row hides
//! what became of it.

mod transformer;
mod unet;

use std::fmt::Write as _;

use super::{markdown, Report, ReportLayout, Row, Status};

/// The whole Markdown of a report in its group layout.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    header(&mut out, report);
    match report.layout {
        ReportLayout::LatentUnet => unet::latent(&mut out, report),
        ReportLayout::S2dUnet => unet::s2d(&mut out, report),
        ReportLayout::Dit => transformer::dit(&mut out, report),
        ReportLayout::HditUvit => transformer::hdit_uvit(&mut out, report),
        // The project's layout is markdown.rs; asked here, the same tables.
        ReportLayout::Project => return markdown::render(report, &[], std::path::Path::new(".")),
    }
    // An active sweep's answers without a run: which, with their intervals.
    if let Some(a) = &report.active {
        super::active::section(&mut out, a);
    }
    twins(&mut out, report);
    out
}

/// Title, where the runs came from, what the columns are, and the counts.
fn header(out: &mut String, report: &Report) {
    let _ = writeln!(out, "# {}\n", report.title);
    if !report.description.is_empty() {
        let _ = writeln!(out, "{}\n", report.description);
    }
    let script = report.layout.script().unwrap_or("-");
    let _ = writeln!(
        out,
        "The tables of the group's `{script}`, as its report prints them (layout `{}`), from `{}`.\n",
        report.layout, report.source
    );
    let env = &report.env;
    let list = |v: Vec<String>| if v.is_empty() { "-".to_string() } else { v.join(", ") };
    let _ = writeln!(
        out,
        "- **GPU**: {} (measured on: {}; backend: {})",
        list(report.gpus.iter().cloned().collect()),
        list(env.devices.iter().cloned().collect()),
        list(env.backends.iter().cloned().collect())
    );
    let ckpt = list(env.grad_ckpt.iter().map(|c| if *c { "on".into() } else { "off".into() }).collect());
    let _ = writeln!(
        out,
        "- **Precision**: {}; gradient checkpointing: {ckpt}",
        list(report.precisions.iter().cloned().collect())
    );
    match report.budget_set {
        true => {
            let _ = writeln!(out, "- **Budget**: {:.0} GB", report.budget_gib);
        }
        false => {
            let _ = writeln!(out, "- **Budget**: none set (the limit is the GPU's capacity)");
        }
    }
    let counts = report.summary().counts;
    let _ = writeln!(
        out,
        "\n{} configs: {}.\n",
        report.rows.len(),
        counts.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join(", ")
    );
    let _ = writeln!(out, "{}\n", columns(report.layout));
}

/// What the columns of a layout are (the scripts' measurements, group-code facts).
fn columns(layout: ReportLayout) -> &'static str {
    match layout {
        ReportLayout::LatentUnet => {
            "GB = GiB. Model = memory held after building the model; Fwd, Bwd, Total = the running \
             maximum of the peak after forward, backward and the optimizer step (so Fwd ≤ Bwd ≤ \
             Total), as the script prints them (profile_latent_3d_unet.py@02d6741:116-134). A run \
             that ran out of memory prints OOM and FAIL (:202)."
        }
        ReportLayout::S2dUnet => {
            "GB = GiB. VRAM = the peak of one forward, backward and optimizer step; at an OOM, the \
             peak reached when it failed, starred (profile_s2d_3d_memory.py@7dc81f3:45-52, :106-117)."
        }
        ReportLayout::Dit | ReportLayout::HditUvit => {
            "GB = GiB. Peak VRAM = the peak of one forward, backward and optimizer step; free = the \
             script's 80 GB (`--gpu-gb`) less the peak (profile_dit_memory.py@3140d97:265-271, \
             profile_hdit_uvit_memory.py@ff513e0:386-393)."
        }
        ReportLayout::Project => "",
    }
}

/// The configs reported under a second name, said under the tables.
fn twins(out: &mut String, report: &Report) {
    for t in &report.twins {
        let _ =
            writeln!(out, "{} is the same model as {}: measured once, reported under each name.\n", t.name, t.same_as);
    }
}

/// Rows grouped by `key`, groups and rows in first-seen order.
fn grouped<'a, K: PartialEq>(
    rows: impl IntoIterator<Item = &'a Row>,
    key: impl Fn(&Row) -> K,
) -> Vec<(K, Vec<&'a Row>)> {
    let mut out: Vec<(K, Vec<&Row>)> = Vec::new();
    for r in rows {
        let k = key(r);
        match out.iter_mut().find(|(g, _)| *g == k) {
            Some((_, v)) => v.push(r),
            None => out.push((k, vec![r])),
        }
    }
    out
}

/// A table with the report's separator line (as many dashes as each heading).
fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let dashes: Vec<String> = header.iter().map(|h| "-".repeat(h.chars().count() + 2)).collect();
    let _ = writeln!(out, "|{}|", dashes.join("|"));
    for r in rows {
        let _ = writeln!(out, "| {} |", r.join(" | "));
    }
    out.push('\n');
}

/// What a row is in the group's words: ran (with its peak), ran out of
/// memory, or neither (the project's status words say what it is).
enum Outcome {
    Ran { peak: f64, over_budget: bool },
    Oom,
    Other(String),
}

fn outcome(r: &Row, budget_gib: f64) -> Outcome {
    match (r.status, r.peak_gib) {
        (Status::Ok, Some(peak)) => Outcome::Ran { peak, over_budget: false },
        (Status::OverBudget, Some(peak)) => Outcome::Ran { peak, over_budget: true },
        (Status::Oom, _) => Outcome::Oom,
        _ => Outcome::Other(markdown::status_cell(r, budget_gib)),
    }
}

/// The figure an OOM printed, where one is known (a replayed record without
/// one reads 0 bytes).
fn oom_figure(r: &Row) -> Option<f64> {
    r.oom_at_gib.filter(|g| *g > 0.0)
}

/// `29.0M`: millions to one decimal (every script's `params_m:.1f`).
fn params(r: &Row) -> String {
    r.params.filter(|p| *p > 0).map(|p| format!("{:.1}M", p as f64 / 1e6)).unwrap_or_else(|| "-".into())
}

#[cfg(test)]
mod tests;
