//! The report's section on an active sweep: the configs measured, those
//! answered by a prediction without a run (with the interval and the
//! calibration), those that could not be measured, those `cancel` stopped,
//! and what that saved.

use std::fmt::Write;

use super::{Row, Status};
use crate::active::ActiveReport;
use crate::active::Answer;

/// `## Active sweep`: counts, savings, and a row per predicted config.
pub fn section(out: &mut String, a: &ActiveReport) {
    let s = &a.savings;
    let _ = writeln!(out, "## Active sweep\n");
    let gpu = s.gpu_seconds_saved.map(|g| format!(", about {g:.0} s of run time saved")).unwrap_or_default();
    let _ = writeln!(
        out,
        "{}{gpu}; {}. A predicted config's measured peak lies in its interval nine times in ten; \
         a settled prediction answers for its config without a run.\n",
        s.counts(),
        a.stop_line()
    );
    let failures = crate::active::failures_text(&a.answers);
    if !failures.is_empty() {
        let _ = writeln!(out, "{failures}");
    }
    let cancelled = crate::active::cancelled_text(&a.answers);
    if !cancelled.is_empty() {
        let _ =
            writeln!(out, "{}`orchestrator resume {} --retry-cancelled` runs them again.\n", cancelled, a.experiment);
    }
    let predicted: Vec<(&String, &Answer)> =
        a.answers.iter().filter(|(_, a)| matches!(a, Answer::Predicted { .. })).collect();
    if predicted.is_empty() {
        return;
    }
    let _ = writeln!(out, "| Config | Predicted | Interval | Verdict | Settled | Calibration |");
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for (name, answer) in predicted {
        if let Answer::Predicted { peak_gib, low_gib, high_gib, band, verdict, reason, calibration, settled, .. } =
            answer
        {
            let verdict = match reason {
                Some(r) => format!("{verdict} ({})", r.words()),
                None => verdict.to_string(),
            };
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {verdict} | {} | {calibration} |",
                crate::precheck::memory(*peak_gib),
                crate::active::interval_words(*low_gib, *high_gib, *band),
                if *settled { "yes" } else { "no" }
            );
        }
    }
    let _ = writeln!(out);
}

/// The rows of configs never run that the active sweep answered by a
/// prediction: status `predicted`, the sweep's verdict and peak, the answer
/// kept (the JSON's `answer`), the interval in words.
pub fn annotate(rows: &mut [Row], a: &ActiveReport) {
    for row in rows.iter_mut().filter(|r| r.status.is_unrun()) {
        let Some(answer @ Answer::Predicted { peak_gib, verdict, settled, .. }) = a.answers.get(&row.name) else {
            continue;
        };
        let open = if *settled { "" } else { " (not settled: a run would decide)" };
        row.detail = answer.predicted_words().map(|w| format!("{w}{open}"));
        row.status = Status::Predicted;
        row.verdict = *verdict;
        row.predicted_gib = Some(*peak_gib);
        row.answer = Some(answer.clone());
    }
}
