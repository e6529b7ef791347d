//! How an active sweep ended ([`ActiveReport`]): every config's answer and
//! what it saved, kept in the state directory (`active.json`) where
//! `status`, `resume` and the report read it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{failures_text, plural, Answer, Savings, Stop};

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
    /// submitted (`submitted`: names of the configs submitted since).
    pub fn status_line(&self, submitted: &BTreeSet<String>) -> String {
        let s = &self.savings;
        let settled = self.settled_predictions();
        let saved = settled.iter().filter(|n| !submitted.contains(**n)).count();
        let failed = match s.failed {
            0 => String::new(),
            n => format!(", {n} could not be measured"),
        };
        // Predictions run since (`resume --all`) are no longer without a run.
        let since = match settled.len() - saved {
            0 => String::new(),
            n => format!(", {n} of them run since"),
        };
        format!(
            "active sweep: {} measured, {} predicted without a run{failed}{since} ({} saved); `orchestrator report {}` lists the predictions",
            s.measured,
            s.predicted,
            plural(saved, "run", "runs"),
            self.experiment
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
