//! The report's "Training runs" section: each chained run of a `command:`
//! sweep with its segments, the wall time they took, its peak, and the
//! precheck's Train figure beside it.

use std::fmt::Write;

use super::Report;

/// Writes the section when the report has any chained run.
pub fn section(out: &mut String, report: &Report) {
    let chained: Vec<_> = report.rows.iter().filter(|r| r.chain.is_some()).collect();
    if chained.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Training runs\n");
    let _ = writeln!(
        out,
        "Each config's command ran as segments of one job, chained across the time limit. Wall = the \
         segments' own time (queueing between them not counted); Peak = the highest of every segment \
         (the run's memory meter, see above); Predicted = the precheck's figure for the run.\n"
    );
    let _ = writeln!(out, "| Config | Status | Segments | Wall | Peak | Predicted | Error |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for r in chained {
        let Some(c) = r.chain else { continue };
        let peak = c.peak_bytes as f64 / (1u64 << 30) as f64;
        let predicted = r.predicted_gib.map(|p| format!("{p:.3}G")).unwrap_or_else(|| "-".into());
        let error = match (r.predicted_gib, r.status.ran() && peak > 0.0) {
            (Some(p), true) => format!("{:+.0}%", (p - peak) / peak * 100.0),
            _ => "-".into(),
        };
        let status = match &r.detail {
            Some(d) if !r.status.ran() => format!("{}: {d}", r.status.label()),
            _ => r.status.label().to_string(),
        };
        let wall = crate::walltime::hms(c.wall_s.round() as u64);
        let _ =
            writeln!(out, "| {} | {status} | {} | {wall} | {peak:.3}G | {predicted} | {error} |", r.name, c.segments);
    }
    let _ = writeln!(out);
}
