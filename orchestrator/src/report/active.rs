//! The report's section on an active sweep: the configs measured, those
//! answered by a prediction without a run (with the interval and the
//! calibration), and what that saved.

use std::fmt::Write;

use crate::active::Answer;
use crate::precheck::memory;
use crate::submit::active::ActiveReport;

/// `## Active sweep`: counts, savings, and a row per predicted config.
pub fn section(out: &mut String, a: &ActiveReport) {
    let s = &a.savings;
    let _ = writeln!(out, "## Active sweep\n");
    let gpu = s.gpu_seconds_saved.map(|g| format!(", about {g:.0} s of run time")).unwrap_or_default();
    let _ = writeln!(
        out,
        "{} configs: {} measured, {} predicted without a run ({} runs saved{gpu}) after {} rounds; \
         stopped: {}. A predicted config's measured peak lies in its interval nine times in ten.\n",
        s.configs,
        s.measured,
        s.predicted,
        s.runs_saved,
        a.rounds,
        match a.stop {
            crate::active::Stop::Settled => "every config measured or settled by its prediction",
            crate::active::Stop::Budget => "the run budget was spent",
        }
    );
    let predicted: Vec<(&String, &Answer)> =
        a.answers.iter().filter(|(_, a)| matches!(a, Answer::Predicted { .. })).collect();
    if predicted.is_empty() {
        return;
    }
    let _ = writeln!(out, "| Config | Predicted | Interval | Verdict | Settled | Calibration |");
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for (name, answer) in predicted {
        if let Answer::Predicted { peak_gib, low_gib, high_gib, verdict, calibration, settled, .. } = answer {
            let _ = writeln!(
                out,
                "| {name} | {} | {}–{} | {verdict} | {} | {calibration} |",
                memory(*peak_gib),
                memory(*low_gib),
                memory(*high_gib),
                if *settled { "yes" } else { "no" }
            );
        }
    }
    let _ = writeln!(out);
}

/// What a config's row says when the active sweep answered it without a run.
pub fn row_detail(a: &ActiveReport, name: &str) -> Option<String> {
    match a.answers.get(name)? {
        Answer::Predicted { peak_gib, low_gib, high_gib, .. } => Some(format!(
            "predicted without a run (active sweep): {} in {}–{}",
            memory(*peak_gib),
            memory(*low_gib),
            memory(*high_gib)
        )),
        _ => None,
    }
}
