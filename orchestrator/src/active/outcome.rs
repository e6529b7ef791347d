//! How an active sweep ended ([`ActiveReport`]): every config's answer and
//! what it saved, kept in the state directory (`active.json`) where
//! `status`, `resume` and the report read it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{cancelled_text, failures_text, plural, Answer, Savings, Stop};

/// How an active sweep ended: every config's answer and what it saved.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ActiveReport {
    pub experiment: String,
    /// Rounds recorded in the journal (this run's and earlier runs').
    pub rounds: u32,
    pub stop: Stop,
    /// By config name.
    pub answers: BTreeMap<String, Answer>,
    pub savings: Savings,
}

impl ActiveReport {
    /// The predictions that answer for their config (settled), by name:
    /// what `resume` does not submit unless asked (`--all`).
    pub fn settled_predictions(&self) -> BTreeSet<&str> {
        self.answers.iter().filter(|(_, a)| a.is_settled_prediction()).map(|(n, _)| n.as_str()).collect()
    }

    /// Every config answered by a prediction, settled or not, by name.
    pub fn predictions(&self) -> BTreeSet<&str> {
        self.answers.iter().filter(|(_, a)| matches!(a, Answer::Predicted { .. })).map(|(n, _)| n.as_str()).collect()
    }

    /// `status`'s line on it: the kinds of answer and the savings, counting
    /// as saved only the settled predictions whose config is still not
    /// submitted (`submitted`: names of the configs submitted since), and,
    /// where there are predictions, that `report` (the command) lists them.
    pub fn status_line(&self, submitted: &BTreeSet<String>, report: &str) -> String {
        let s = &self.savings;
        let settled = self.settled_predictions();
        let saved = settled.iter().filter(|n| !submitted.contains(**n)).count();
        let failed = match s.failed {
            0 => String::new(),
            n => format!(", {n} could not be measured"),
        };
        let cancelled = match s.cancelled {
            0 => String::new(),
            n => format!(", {n} stopped by `cancel`"),
        };
        // Predictions run since (`resume --all`) are no longer without a run.
        let since = match settled.len() - saved {
            0 => String::new(),
            n => format!(", {n} of them run since"),
        };
        let listed = match s.predicted {
            0 => String::new(),
            _ => format!("; `{report}` lists the predictions"),
        };
        format!(
            "active sweep: {} measured, {} predicted without a run{failed}{cancelled}{since} ({} saved){listed}",
            s.measured,
            s.predicted,
            plural(saved, "run", "runs"),
        )
    }

    /// `stopped after 3 rounds: the run budget is spent`.
    pub fn stop_line(&self) -> String {
        format!("stopped after {}: {}", plural(self.rounds as usize, "round", "rounds"), self.stop)
    }
}

impl std::fmt::Display for ActiveReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "active sweep {}: {}", self.experiment, self.stop_line())?;
        writeln!(f, "measured:")?;
        for (n, a) in &self.answers {
            if let Answer::Measured { peak_gib, oom } = a {
                let what = if *oom { "oom".to_string() } else { format!("{:.3} GiB", peak_gib.unwrap_or(0.0)) };
                writeln!(f, "  {n:<32} {what}")?;
            }
        }
        write!(f, "{}", failures_text(&self.answers))?;
        write!(f, "{}", cancelled_text(&self.answers))?;
        writeln!(f, "predicted (not run):")?;
        for (n, a) in &self.answers {
            if let (Some(words), Answer::Predicted { calibration, settled, .. }) = (a.predicted_words(), a) {
                let open = if *settled { "" } else { " (not settled)" };
                writeln!(f, "  {n:<32} {words}{open}; {calibration}")?;
            }
        }
        writeln!(f, "{}", self.savings.counts())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precheck::VerdictKind;

    /// A report of `answers`, stopped by `stop` after one round.
    fn report(answers: &[(&str, Answer)], stop: Stop) -> ActiveReport {
        let answers: BTreeMap<String, Answer> = answers.iter().map(|(n, a)| (n.to_string(), a.clone())).collect();
        let savings = Savings::of(&answers, &[]);
        ActiveReport { experiment: "e".into(), rounds: 1, stop, answers, savings }
    }

    #[test]
    fn runs_stopped_by_cancel_are_said_as_cancelled_and_no_prediction_is_promised_where_there_is_none() {
        let r = report(&[("a", Answer::Cancelled), ("b", Answer::Cancelled)], Stop::Cancelled);
        let text = r.to_string();
        assert!(text.contains("stopped after 1 round: `cancel` stopped the last round's runs"), "{text}");
        assert!(text.contains("2 configs were stopped by `cancel` before they measured (a, b)\n"), "{text}");
        assert!(text.contains("2 configs: 0 measured, 0 predicted without a run, 2 stopped by `cancel`"), "{text}");
        assert!(!text.contains("failed") && !text.contains("could not be measured"), "{text}");
        let line = r.status_line(&BTreeSet::new(), "orchestrator report e");
        assert_eq!(line, "active sweep: 0 measured, 0 predicted without a run, 2 stopped by `cancel` (0 runs saved)");
        let measured = Answer::Measured { peak_gib: Some(1.0), oom: false };
        let predicted = Answer::Predicted {
            peak_gib: 1.0,
            low_gib: 0.9,
            high_gib: 1.1,
            band: 0.1,
            verdict: VerdictKind::Fits,
            reason: None,
            distance: None,
            calibration: "c".into(),
            settled: true,
        };
        let r = report(&[("a", measured), ("b", predicted)], Stop::Settled);
        let line = r.status_line(&BTreeSet::new(), "orchestrator report e --state-dir /s");
        assert!(
            line.ends_with("(1 run saved); `orchestrator report e --state-dir /s` lists the predictions"),
            "{line}"
        );
    }
}
