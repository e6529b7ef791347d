//! The group's UNet tables: the latent script's (one table per latent shape,
//! `| Config | Channels | Params | Model | Fwd | Bwd | Total | Status |`,
//! docs/profiling_results.md@0ee6133:251-270, :291-310) and the S2D script's
//! (one table per number of levels, `| Config | Params | VRAM | Status |`,
//! :408-438). Rows in the sweep's order, each config's second names after it.

use std::fmt::Write as _;

use super::{grouped, oom_figure, outcome, params, table, Outcome};
use crate::report::{Report, Row};

/// The latent script's tables, one per input shape.
pub(super) fn latent(out: &mut String, report: &Report) {
    for ((channels, resolution), rows) in grouped(&report.rows, |r| (r.in_channels, r.resolution.clone())) {
        let _ = writeln!(out, "## Input {channels}x{resolution} (C,H,W,D)\n");
        let cells = with_twins(report, &rows, |r| latent_cells(r, report.budget_gib));
        table(out, &["Config", "Channels", "Params", "Model", "Fwd", "Bwd", "Total", "Status"], &cells);
    }
}

/// Each row's cells, then the same cells under each of its second names
/// (the sweep's twins: measured once, reported under each name).
fn with_twins(report: &Report, rows: &[&Row], cells: impl Fn(&Row) -> Vec<String>) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for r in rows {
        let c = cells(r);
        let twins: Vec<Vec<String>> = report
            .twins_of(&r.name)
            .map(|t| {
                let mut c = c.clone();
                c[0] = t.to_string();
                c
            })
            .collect();
        out.push(c);
        out.extend(twins);
    }
    out
}

/// One row of the latent table. Figures to one decimal, `G` after them
/// (profile_latent_3d_unet.py@02d6741:197-199); Fwd, Bwd and Total the running
/// maximum from the build on (one window, :99 to :134); over the budget the
/// report's `>60GB` (docs/profiling_results.md@0ee6133:267); out of memory
/// `OOM` in Total and `FAIL` (:270, the script's :202).
fn latent_cells(r: &Row, budget_gib: f64) -> Vec<String> {
    let channels = r.channels.as_ref().map(|c| format!("{c:?}")).unwrap_or_else(|| "-".into());
    let dash = || "-".to_string();
    let mut c = vec![r.name.clone(), channels];
    match outcome(r, budget_gib) {
        Outcome::Ran { over_budget, .. } => {
            let [fwd, bwd, total] = running_max(r);
            let g = |x: Option<f64>| x.map(|x| format!("{x:.1}G")).unwrap_or_else(dash);
            c.extend([params(r), g(r.model_gib), g(fwd), g(bwd), g(total)]);
            c.push(if over_budget { format!(">{budget_gib:.0}GB") } else { "OK".into() });
        }
        Outcome::Oom => c.extend([dash(), dash(), dash(), dash(), "OOM".into(), "FAIL".into()]),
        Outcome::Other(status) => c.extend([dash(), dash(), dash(), dash(), dash(), status]),
    }
    c
}

/// Fwd, Bwd, Total as the running maximum of the model, forward, backward and
/// overall peaks: each the largest figure up to its phase (a phase without a
/// figure stays `None` and passes the maximum on).
pub(super) fn running_max(r: &Row) -> [Option<f64>; 3] {
    let mut acc = r.model_gib;
    [r.fwd_gib, r.bwd_gib, r.peak_gib].map(|x| {
        let v = x.map(|x| acc.map_or(x, |a| a.max(x)));
        if v.is_some() {
            acc = v;
        }
        v
    })
}

/// The S2D script's tables: per input shape where the sweep has several, one
/// table per number of levels.
pub(super) fn s2d(out: &mut String, report: &Report) {
    let inputs = grouped(&report.rows, |r| (r.in_channels, r.resolution.clone()));
    let many = inputs.len() > 1;
    for ((channels, resolution), rows) in inputs {
        if many {
            let _ = writeln!(out, "## Input {channels}x{resolution} (C,H,W,D)\n");
        }
        for (levels, rows) in grouped(rows, |r| r.channels.as_ref().map(Vec::len)) {
            let title = levels.map(|l| format!("{l}-Level UNets")).unwrap_or_else(|| "Other models".into());
            let _ = writeln!(out, "{} {title}\n", if many { "###" } else { "##" });
            let cells = with_twins(report, &rows, |r| s2d_cells(r, report.budget_gib));
            table(out, &["Config", "Params", "VRAM", "Status"], &cells);
        }
    }
}

/// One row of an S2D table: parameters in whole millions and the peak to one
/// decimal (the report's rounding of the script's `:>5.0f`M and `:.2f`G,
/// profile_s2d_3d_memory.py@7dc81f3:49-51); an OOM's figure starred, no
/// parameters (:47, docs/profiling_results.md@0ee6133:416).
fn s2d_cells(r: &Row, budget_gib: f64) -> Vec<String> {
    let dash = || "-".to_string();
    let mut c = vec![r.name.clone()];
    match outcome(r, budget_gib) {
        Outcome::Ran { peak, over_budget } => {
            let p = r.params.filter(|p| *p > 0).map(|p| format!("{:.0}M", p as f64 / 1e6)).unwrap_or_else(dash);
            c.extend([p, format!("{peak:.1}G")]);
            c.push(if over_budget { format!(">{budget_gib:.0}GB") } else { "OK".into() });
        }
        Outcome::Oom => {
            c.extend([dash(), oom_figure(r).map(|g| format!("{g:.1}G*")).unwrap_or_else(dash), "OOM".into()])
        }
        Outcome::Other(status) => c.extend([dash(), dash(), status]),
    }
    c
}
