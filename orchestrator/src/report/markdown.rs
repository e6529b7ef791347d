//! The Markdown report, in the layout of the group's hand-written ones
//! (`| Config | Channels | Params | Model | Fwd | Bwd | Total | Status |`), with
//! the prediction and its error added to every row.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{Report, Row, Status, Summary};
use crate::util::table::millions;

/// GiB as the reports print it (`49.7G`); small runs keep three digits.
pub fn fmt_gib(g: f64) -> String {
    if g >= 1.0 {
        format!("{g:.1}G")
    } else if g >= 0.01 {
        format!("{g:.3}G")
    } else {
        format!("{g:.4}G")
    }
}

fn opt_gib(g: Option<f64>) -> String {
    g.map(fmt_gib).unwrap_or_else(|| "-".into())
}

/// `40,960`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A cell: no pipes or newlines (they would break the table), at most `max` chars.
fn cell(s: &str, max: usize) -> String {
    let s = s.replace('|', "/").replace('\n', " ");
    if s.chars().count() > max {
        let cut: String = s.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        s
    }
}

/// The Status column: `OK (17.9GB free)`, `OOM (at 78.1G, in bwd)`, `invalid: …`.
pub fn status_cell(r: &Row, budget_gib: f64) -> String {
    let detail = r.detail.as_deref().map(|d| cell(d, 90));
    match r.status {
        Status::Ok => match r.peak_gib {
            Some(p) => format!("OK ({:.1}GB free)", (r.capacity_gib - p).max(0.0)),
            None => "OK".into(),
        },
        Status::OverBudget => format!("over budget (>{budget_gib:.0}GB)"),
        Status::Oom => {
            let mut parts = Vec::new();
            if let Some(g) = r.oom_at_gib {
                parts.push(format!("at {}", fmt_gib(g)));
            }
            if let Some(d) = detail.filter(|d| d.starts_with("in ")) {
                parts.push(d);
            }
            if parts.is_empty() {
                "OOM".into()
            } else {
                format!("OOM ({})", parts.join(", "))
            }
        }
        Status::SkippedOom => match r.predicted_gib {
            Some(p) => format!("skipped: predicted OOM ({} > {})", fmt_gib(p), fmt_gib(r.capacity_gib)),
            None => Status::SkippedOom.label().into(),
        },
        s => match detail {
            Some(d) => format!("{}: {d}", s.label()),
            None => s.label().into(),
        },
    }
}

fn error_cell(r: &Row) -> String {
    match r.error_pct() {
        Some(e) => format!("{e:+.0}%"),
        None => "-".into(),
    }
}

fn attn(levels: &[bool]) -> String {
    levels.iter().map(|a| if *a { 'T' } else { 'F' }).collect()
}

/// One table of `rows`; each followed by the configs that are its model
/// under a second name (same figures, their own names).
fn table(out: &mut String, report: &Report, rows: &[&Row]) {
    let budget_gib = report.budget_gib;
    let unet = rows.iter().all(|r| !r.is_transformer());
    let hdit = rows.iter().any(|r| r.level_depths.is_some());
    let mut header: Vec<&str> = vec!["Config"];
    if unet {
        header.extend(["Channels", "Attn"]);
    } else {
        header.extend(["Resolution", "Patch", "Tokens"]);
        if hdit {
            header.push("Depths");
        }
    }
    header.extend([
        "Params",
        "Model",
        "Fwd",
        "Bwd",
        if unet { "Total" } else { "Peak" },
        "Predicted",
        "Error",
        "Status",
    ]);
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(header.len()));
    for r in rows {
        let c = cells(r, unet, hdit, budget_gib);
        let _ = writeln!(out, "| {} |", c.join(" | "));
        for twin in report.twins_of(&r.name) {
            let mut c = c.clone();
            c[0] = cell(&format!("{twin} (same model as {})", r.name), 90);
            let _ = writeln!(out, "| {} |", c.join(" | "));
        }
    }
}

/// A row's cells in the project's columns.
fn cells(r: &Row, unet: bool, hdit: bool, budget_gib: f64) -> Vec<String> {
    let mut c: Vec<String> = vec![cell(&r.name, 60)];
    if unet {
        c.push(match &r.channels {
            Some(ch) => format!("{ch:?}"),
            None => "-".into(),
        });
        c.push(r.attention.as_deref().map(attn).unwrap_or_else(|| "-".into()));
    } else {
        c.push(r.resolution.clone());
        c.push(r.patch.map(|p| p.to_string()).unwrap_or_else(|| "-".into()));
        c.push(r.tokens.map(thousands).unwrap_or_else(|| "-".into()));
        if hdit {
            c.push(r.level_depths.as_ref().map(|d| format!("{d:?}")).unwrap_or_else(|| "-".into()));
        }
    }
    c.push(r.params.map(millions).unwrap_or_else(|| "-".into()));
    c.push(opt_gib(r.model_gib));
    c.push(opt_gib(r.fwd_gib));
    c.push(opt_gib(r.bwd_gib));
    c.push(opt_gib(r.peak_gib));
    c.push(opt_gib(r.predicted_gib));
    c.push(error_cell(r));
    c.push(status_cell(r, budget_gib));
    c
}

fn joined<T: ToString>(set: impl IntoIterator<Item = T>) -> String {
    let v: Vec<String> = set.into_iter().map(|x| x.to_string()).collect();
    if v.is_empty() {
        "-".into()
    } else {
        v.join(", ")
    }
}

/// The whole Markdown report. `plots` are linked relative to `dir` (where the
/// report is written), PNGs shown inline.
pub fn render(report: &Report, plots: &[PathBuf], dir: &Path) -> String {
    let mut out = String::new();
    let summary = report.summary();
    let many_sections = report.sections().len() > 1;
    header(&mut out, report);
    counts(&mut out, report, &summary);
    if let Some(a) = &report.active {
        super::active::section(&mut out, a);
    }
    super::training_runs::section(&mut out, report);
    tables(&mut out, report, many_sections);
    summaries(&mut out, report, &summary, many_sections);
    never_run(&mut out, report);
    unfinished(&mut out, report);
    plot_links(&mut out, plots, dir);
    out
}

/// Title, description and the facts table (GPU, budget, devices, runtimes).
fn header(out: &mut String, report: &Report) {
    let _ = writeln!(out, "# {}\n", report.title);
    if !report.description.is_empty() {
        let _ = writeln!(out, "{}\n", report.description);
    }
    let env = &report.env;
    let ckpt = joined(env.grad_ckpt.iter().map(|c| if *c { "on" } else { "off" }));
    let _ = writeln!(out, "| | |\n|---|---|");
    if report.host_memory {
        let _ = writeln!(
            out,
            "| Target GPU | {} (not used: the `local` cluster ran the worker on this machine's CPU) |",
            joined(&report.gpus)
        );
        let _ = writeln!(
            out,
            "| Capacity | {:.1} GiB, this machine's memory (what the verdicts were judged against) |",
            report.capacity_gib
        );
    } else {
        let _ = writeln!(out, "| Target GPU | {} ({:.1} GiB) |", joined(&report.gpus), report.capacity_gib);
    }
    if report.budget_set {
        let _ = writeln!(out, "| Budget | {:.0} GB |", report.budget_gib);
    } else {
        let _ = writeln!(
            out,
            "| Budget | none (the experiment sets no `budget_gb`: the limit is {}) |",
            if report.host_memory { "this machine's memory" } else { "the GPU's capacity" }
        );
    }
    let _ = writeln!(out, "| Measured on | {} |", joined(&env.devices));
    let _ = writeln!(out, "| Driver | {} |", joined(&env.drivers));
    let _ = writeln!(out, "| Backend | {} |", joined(&env.backends));
    let dtype = if env.dtypes.is_empty() { String::new() } else { format!(" (device dtype {})", joined(&env.dtypes)) };
    let _ = writeln!(out, "| Precision | {}{dtype} |", joined(&report.precisions));
    let _ = writeln!(out, "| Gradient checkpointing | {ckpt} |");
    if !env.meters.is_empty() {
        let _ = writeln!(out, "| Memory meter | {} |", joined(&env.meters));
    }
    if !env.hosts.is_empty() {
        let _ = writeln!(out, "| Hosts | {} |", joined(&env.hosts));
    }
    if report.predicted_by.is_empty() {
        let _ = writeln!(out, "| Prediction | precheck, `{}` calibration |", report.predictor);
    } else {
        let by: Vec<String> = report.predicted_by.iter().map(|c| format!("`{c}`")).collect();
        let _ = writeln!(out, "| Prediction | precheck at submission, before each run: {} |", by.join(", "));
    }
    let _ = writeln!(out, "| Source | `{}` |", report.source);
    let runtime = report.predictor.split('/').next().unwrap_or("");
    if !env.backends.is_empty() && !env.backends.iter().any(|b| b == runtime || format!("burn-{b}") == runtime) {
        let _ = writeln!(
            out,
            "\nThe predictions use the `{}` calibration, the measurements come from `{}` on `{}`: \
             the error includes the difference between the runtimes (the fixed CUDA context and \
             allocator overhead the calibration carries, above all on tiny models). \
             `orchestrator calibrate --records` on this sweep's records fits that runtime.",
            report.predictor,
            joined(&env.backends),
            joined(&env.devices)
        );
    }
}

/// How many configs ended how, and what the columns mean.
fn counts(out: &mut String, report: &Report, summary: &Summary) {
    let _ = writeln!(
        out,
        "\n{} configs: {}.\n",
        report.rows.len(),
        summary.counts.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join(", ")
    );
    if !report.twins.is_empty() {
        let pairs: Vec<String> = report.twins.iter().map(|t| format!("{} = {}", t.name, t.same_as)).collect();
        let _ = writeln!(
            out,
            "{} more under a second name, each the same model as a config above: measured once, \
             reported under each name ({}).\n",
            report.twins.len(),
            pairs.join(", ")
        );
    }
    let when =
        if report.predicted_by.is_empty() { "as the precheck predicts it now" } else { "as predicted before the run" };
    let _ = writeln!(
        out,
        "GB = GiB. Model = after building the model, Fwd / Bwd = peak in forward / backward, \
         Total (Peak) = overall peak including the optimizer step. Predicted = the precheck's \
         peak, {when}; Error = (predicted - measured) / measured.\n"
    );
}

/// One table per section and group.
fn tables(out: &mut String, report: &Report, many_sections: bool) {
    let mut last_section: Option<String> = None;
    for ((section, group), rows) in report.groups() {
        if many_sections && last_section.as_deref() != Some(section.as_str()) {
            let _ = writeln!(out, "## {}\n", if section.is_empty() { "(no table)" } else { &section });
            last_section = Some(section.clone());
        }
        let level = if many_sections { "###" } else { "##" };
        let heading = match rows.first().and_then(|r| r.channels.as_ref().map(|_| r)) {
            // UNet groups: attention pattern and head channels are per config; say the input.
            Some(r) => format!("{group}, input {}x{} (C,H,W,D)", r.in_channels, r.resolution),
            None => group.clone(),
        };
        let _ = writeln!(out, "{level} {heading}\n");
        table(out, report, &rows);
        out.push('\n');
    }
}

/// The prediction error, the best viable config and the largest token counts.
fn summaries(out: &mut String, report: &Report, summary: &Summary, many_sections: bool) {
    let _ = writeln!(out, "## Summary\n");
    match (summary.median_abs_error_pct, summary.max_abs_error_pct) {
        (Some(m), Some(x)) => {
            let _ = writeln!(
                out,
                "Prediction error over {} measured configs: median |error| {m:.1}%, largest {x:.1}%.\n",
                summary.measured
            );
        }
        _ => {
            let _ = writeln!(out, "No config has both a measured and a predicted peak yet.\n");
        }
    }
    let _ = writeln!(out, "### Best viable config per variant\n");
    if summary.best.is_empty() {
        let _ = writeln!(out, "None ran within budget yet.\n");
    } else {
        let _ = writeln!(out, "| Variant | Config | Params | Peak |\n|---|---|---|---|");
        for b in &summary.best {
            let g = if many_sections && !b.section.is_empty() {
                format!("{} ({})", b.group, b.section)
            } else {
                b.group.clone()
            };
            let _ = writeln!(
                out,
                "| {g} | {} | {} | {} |",
                b.name,
                b.params.map(millions).unwrap_or_else(|| "-".into()),
                peak_cell(b.peak_gib, b.predicted)
            );
        }
        out.push('\n');
    }
    if report.rows.iter().any(Row::is_transformer) {
        let _ = writeln!(out, "### Largest token count that fits per variant\n");
        if summary.largest_tokens.is_empty() {
            let _ = writeln!(out, "No transformer ran within budget yet.\n");
        } else {
            let _ =
                writeln!(out, "| Variant | Tokens | Config | Peak | Largest predicted to fit |\n|---|---|---|---|---|");
            for l in &summary.largest_tokens {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} |",
                    l.group,
                    thousands(l.tokens),
                    l.name,
                    peak_cell(l.peak_gib, l.predicted),
                    l.predicted_tokens.map(thousands).unwrap_or_else(|| "-".into())
                );
            }
            out.push('\n');
        }
    }
}

/// A summary's peak: `49.7G`, or `49.7G (predicted)` for an active sweep's answer without a run.
fn peak_cell(peak_gib: f64, predicted: bool) -> String {
    match predicted {
        true => format!("{} (predicted)", fmt_gib(peak_gib)),
        false => fmt_gib(peak_gib),
    }
}

/// The configs never submitted (and not answered by an active sweep), and why.
fn never_run(out: &mut String, report: &Report) {
    let _ = writeln!(out, "### Never run\n");
    let never: Vec<&Row> = report
        .rows
        .iter()
        .filter(|r| {
            matches!(r.status, Status::SkippedOom | Status::SkippedRisky | Status::Invalid | Status::NotSubmitted)
        })
        .collect();
    if never.is_empty() {
        let or = if report.active.is_some() { " or answered by the active sweep" } else { "" };
        let _ = writeln!(out, "Every config was submitted{or}: none skipped as a predicted OOM, none invalid.\n");
    } else {
        let _ = writeln!(out, "| Config | Variant | Predicted | Why |\n|---|---|---|---|");
        for r in never {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                r.name,
                r.group,
                opt_gib(r.predicted_gib),
                status_cell(r, report.budget_gib)
            );
        }
        out.push('\n');
    }
}

/// The configs submitted but not measured (yet).
fn unfinished(out: &mut String, report: &Report) {
    let unfinished: Vec<&Row> = report
        .rows
        .iter()
        .filter(|r| matches!(r.status, Status::Pending | Status::Running | Status::Failed | Status::Cancelled))
        .collect();
    if !unfinished.is_empty() {
        let _ = writeln!(out, "### Not measured yet or lost\n");
        for r in unfinished {
            let _ = writeln!(out, "- {}: {}", r.name, status_cell(r, report.budget_gib));
        }
        out.push('\n');
    }
}

/// The plots: PNGs inline, SVGs linked.
fn plot_links(out: &mut String, plots: &[PathBuf], dir: &Path) {
    if !plots.is_empty() {
        let _ = writeln!(out, "## Plots\n");
        for p in plots {
            let rel = p.strip_prefix(dir).unwrap_or(p).display().to_string();
            if rel.ends_with(".png") {
                let _ = writeln!(out, "![{rel}]({rel})\n");
            }
        }
        let svgs: Vec<String> = plots
            .iter()
            .map(|p| p.strip_prefix(dir).unwrap_or(p).display().to_string())
            .filter(|s| s.ends_with(".svg"))
            .map(|s| format!("[{s}]({s})"))
            .collect();
        if !svgs.is_empty() {
            let _ = writeln!(out, "SVG: {}\n", svgs.join(", "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_as_the_reports_print_them() {
        assert_eq!(fmt_gib(49.71), "49.7G");
        assert_eq!(fmt_gib(0.0421), "0.042G");
        assert_eq!(fmt_gib(0.004), "0.0040G");
        assert_eq!(thousands(40960), "40,960");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000_000), "1,000,000");
        assert_eq!(cell("a|b\nc", 10), "a/b c");
        assert_eq!(cell("abcdef", 4), "abc…");
    }
}
