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

#[cfg(test)]
mod tests {
    use super::super::{base_row, tests::report_of, Row, Status};
    use crate::collect::ChainTally;

    fn row(name: &str, status: Status, chain: Option<ChainTally>, detail: Option<&str>) -> Row {
        let cfg: facts::RunConfig = serde_json::from_value(serde_json::json!({
            "experiment": "t", "name": name,
            "model": {"family": "unet", "channels": [8, 16], "attention_levels": [false, false], "num_res_blocks": 1, "num_head_channels": 8},
            "input": {"channels": 1, "spatial": [8, 8, 8]}, "out_channels": 1, "batch": 1,
            "precision": "fp32", "grad_ckpt": false, "gpu": "A100-40GB"
        }))
        .expect("config");
        let mut r = base_row(&cfg, name.into(), String::new(), crate::precheck::VerdictKind::Fits);
        r.status = status;
        r.chain = chain;
        r.detail = detail.map(str::to_string);
        r.predicted_gib = Some(0.110);
        r
    }

    /// The chain demo's figures (closing note of issue 51): 7 segments, 1:42
    /// of segments, 0.069 GiB against 0.110 predicted. A chain that failed
    /// says why and has no error figure; a row with no chain is not listed;
    /// a report without chains has no section.
    #[test]
    fn each_chained_run_is_a_row_with_its_segments_wall_peak_and_error() {
        let ok = ChainTally { segments: 7, wall_s: 102.4, peak_bytes: (0.069 * (1u64 << 30) as f64) as u64 };
        let failed = ChainTally { segments: 12, wall_s: 3.0 * 86_400.0 + 61.0, peak_bytes: 1 << 30 };
        let rows = vec![
            row("steps100", Status::Ok, Some(ok), None),
            row("steps200", Status::Failed, Some(failed), Some("12 segments reached; checkpoint kept")),
            row("profiled", Status::Ok, None, None),
        ];
        let mut out = String::new();
        super::section(&mut out, &report_of(rows));
        let table: Vec<&str> = out.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(
            table,
            [
                "| Config | Status | Segments | Wall | Peak | Predicted | Error |",
                "|---|---|---|---|---|---|---|",
                "| steps100 | OK | 7 | 00:01:42 | 0.069G | 0.110G | +59% |",
                "| steps200 | failed: 12 segments reached; checkpoint kept | 12 | 3-00:01:01 | 1.000G | 0.110G | - |",
            ]
        );
        assert!(out.starts_with("## Training runs\n"), "{out}");
        let mut none = String::new();
        super::section(&mut none, &report_of(vec![row("profiled", Status::Ok, None, None)]));
        assert_eq!(none, "", "no chained run, no section");
    }
}
