//! Progress for the long commands: indicatif bars (submit, event collection,
//! `status --watch`) and the one-line sweep summary `status` prints, with an
//! ETA from the durations of the runs that finished.
//!
//! Bars draw on stderr and only when it is a terminal, so piped output
//! (`status --json | jq`, CI logs) stays exactly the tables.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;

use crate::slurm::Activity;
use crate::state::{self, ConfigRecord};

fn target() -> ProgressDrawTarget {
    if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

/// A bar of `len` steps labelled `msg` (hidden when stderr is not a terminal).
pub fn bar(len: u64, msg: &str) -> ProgressBar {
    let b = ProgressBar::with_draw_target(Some(len), target());
    // The template is a constant: it parses, and the default style is a fine fallback.
    let style = ProgressStyle::with_template("{msg:>16} [{bar:30}] {pos}/{len} {elapsed_precise} {prefix}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    b.set_style(style);
    b.set_message(msg.to_string());
    b
}

/// A spinner for a step of unknown length (an sbatch, a connection).
pub fn spinner(msg: &str) -> ProgressBar {
    let b = ProgressBar::with_draw_target(None, target());
    let style = ProgressStyle::with_template("{spinner} {msg} {elapsed}").unwrap_or_else(|_| ProgressStyle::default_spinner());
    b.set_style(style);
    b.set_message(msg.to_string());
    b.enable_steady_tick(std::time::Duration::from_millis(120));
    b
}

/// Where a sweep stands: configs per state, and when it should be done.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SweepProgress {
    pub total: usize,
    /// Per SLURM state of the latest attempt (`not submitted`, `SUBMITTING` for an unsettled intent).
    pub counts: BTreeMap<String, usize>,
    pub ended: usize,
    pub running: usize,
    /// Queued, or an intent not yet settled.
    pub waiting: usize,
    pub never_submitted: usize,
    /// Median run time of the finished runs, seconds.
    pub median_run_s: Option<f64>,
    /// Rough time to the last live config ending, seconds.
    pub eta_s: Option<f64>,
}

/// How long a finished attempt ran: the worker's own wall time when there is a
/// result, else from the first RUNNING to the end in the SLURM history.
fn duration(r: &ConfigRecord) -> Option<f64> {
    if let Some(w) = r.result.as_ref().and_then(|v| v.get("wall_s")).and_then(|w| w.as_f64()) {
        return Some(w);
    }
    let a = r.latest()?;
    let end = a.history.last().filter(|c| c.state.activity() == Activity::Ended)?.t;
    let start = a.history.iter().find(|c| c.state.activity() == Activity::Running).map(|c| c.t).or(a.submitted_at)?;
    (end >= start).then_some(end - start)
}

/// Counts and ETA over the records of a sweep.
///
/// The ETA assumes the runs still to come take the median finished run time
/// and run as many at once as run now (one when none does): rough, but it
/// rests on this sweep's own numbers, not a guess.
pub fn sweep_progress<'a>(records: impl IntoIterator<Item = &'a ConfigRecord>) -> SweepProgress {
    let mut p = SweepProgress::default();
    let mut durations = Vec::new();
    for r in records {
        p.total += 1;
        let state = match r.latest() {
            None => {
                p.never_submitted += 1;
                "not submitted".to_string()
            }
            Some(a) if a.array_job_id.is_none() => {
                p.waiting += 1;
                "SUBMITTING".to_string()
            }
            Some(a) => match &a.state {
                None => {
                    p.waiting += 1;
                    "SUBMITTED".to_string()
                }
                Some(s) => {
                    match s.activity() {
                        Activity::Queued => p.waiting += 1,
                        Activity::Running => p.running += 1,
                        Activity::Ended => {
                            p.ended += 1;
                            if let Some(d) = duration(r) {
                                durations.push(d);
                            }
                        }
                    }
                    s.to_string()
                }
            },
        };
        *p.counts.entry(state).or_default() += 1;
    }
    durations.sort_by(f64::total_cmp);
    p.median_run_s = (!durations.is_empty()).then(|| durations[durations.len() / 2]);
    let live = p.running + p.waiting;
    p.eta_s = match (live, p.median_run_s) {
        (0, _) => Some(0.0),
        (_, None) => None,
        (n, Some(m)) => Some(m * n.div_ceil(p.running.max(1)) as f64),
    };
    p
}

/// The progress of experiment `experiment` under `state_root`, read without the lock.
pub fn read(state_root: &Path, experiment: &str) -> Result<SweepProgress, state::StateError> {
    let dir = state_root.join(experiment).join("configs");
    let mut records = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            if e.path().extension().is_some_and(|x| x == "json") {
                if let Some(r) = state::read_json::<ConfigRecord>(&e.path())? {
                    records.push(r);
                }
            }
        }
    }
    Ok(sweep_progress(&records))
}

/// `1h02m`, `3m05s`, `12s`, `0.4s`.
pub fn human_duration(s: f64) -> String {
    if s < 9.95 {
        return format!("{:.1}s", s.max(0.0));
    }
    let s = s.round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

impl SweepProgress {
    /// `6 configs: 4 COMPLETED, 1 RUNNING, 1 PENDING; median run 12s; ETA ~24s`.
    pub fn line(&self) -> String {
        let counts = self.counts.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join(", ");
        let mut s = format!("{} configs: {counts}", self.total);
        if let Some(m) = self.median_run_s {
            s.push_str(&format!("; median run {}", human_duration(m)));
        }
        match self.eta_s {
            Some(e) if self.running + self.waiting > 0 => s.push_str(&format!("; ETA ~{}", human_duration(e))),
            None if self.running + self.waiting > 0 => s.push_str("; ETA after the first run ends"),
            _ => {}
        }
        s
    }

    /// Shows this progress on a `status --watch` bar (length = submitted configs).
    pub fn show_on(&self, bar: &ProgressBar) {
        bar.set_length((self.total - self.never_submitted) as u64);
        bar.set_position(self.ended as u64);
        bar.set_prefix(match self.eta_s {
            Some(e) if self.running + self.waiting > 0 => format!("{} running, ETA ~{}", self.running, human_duration(e)),
            _ => format!("{} running", self.running),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::SlurmState;
    use crate::state::{Attempt, StateChange};

    fn rec(hash: &str, state: Option<SlurmState>, history: Vec<(f64, SlurmState)>, wall: Option<f64>) -> ConfigRecord {
        ConfigRecord {
            hash: hash.into(),
            name: hash.into(),
            verdict: Some("fits".into()),
            predicted_gib: Some(1.0),
            attempts: vec![Attempt {
                submission: "s001-x".into(),
                task_id: 0,
                array_job_id: Some("7".into()),
                job_id: None,
                intended_at: 0.0,
                submitted_at: Some(0.0),
                state,
                history: history.into_iter().map(|(t, state)| StateChange { t, state, detail: None }).collect(),
                abandoned: false,
                worker: None,
            }],
            result: wall.map(|w| serde_json::json!({"event": "result", "status": "ok", "wall_s": w})),
        }
    }

    #[test]
    fn counts_and_eta_from_finished_durations() {
        let done = |h: &str, wall| rec(h, Some(SlurmState::Completed), vec![(1.0, SlurmState::Completed)], Some(wall));
        // Without a result the SLURM history gives the duration: RUNNING at 100, ended at 130.
        let failed = rec("f", Some(SlurmState::Failed), vec![(100.0, SlurmState::Running), (130.0, SlurmState::Failed)], None);
        let running = rec("r", Some(SlurmState::Running), vec![(5.0, SlurmState::Running)], None);
        let pending: Vec<ConfigRecord> = (0..3).map(|i| rec(&format!("p{i}"), Some(SlurmState::Pending), vec![], None)).collect();
        let mut never = rec("n", None, vec![], None);
        never.attempts.clear();
        let mut all = vec![done("a", 10.0), done("b", 20.0), failed, running, never];
        all.extend(pending);
        let p = sweep_progress(&all);
        assert_eq!(p.total, 8);
        assert_eq!(p.ended, 3);
        assert_eq!((p.running, p.waiting, p.never_submitted), (1, 3, 1));
        assert_eq!(p.counts["COMPLETED"], 2);
        assert_eq!(p.counts["PENDING"], 3);
        assert_eq!(p.counts["not submitted"], 1);
        assert_eq!(p.median_run_s, Some(20.0)); // of 10, 20, 30
        // 4 live configs, 1 at a time, 20 s each.
        assert_eq!(p.eta_s, Some(80.0));
        assert!(p.line().contains("ETA ~1m20s"), "{}", p.line());
    }

    #[test]
    fn no_eta_before_anything_finished_and_zero_when_settled() {
        let p = sweep_progress(&[rec("r", Some(SlurmState::Running), vec![], None)]);
        assert_eq!(p.eta_s, None);
        assert!(p.line().ends_with("ETA after the first run ends"));
        let p = sweep_progress(&[rec("a", Some(SlurmState::Completed), vec![], Some(3.0))]);
        assert_eq!(p.eta_s, Some(0.0));
        assert!(!p.line().contains("ETA"));
    }

    #[test]
    fn durations_read_humanly() {
        assert_eq!(human_duration(12.4), "12s");
        assert_eq!(human_duration(0.43), "0.4s");
        assert_eq!(human_duration(185.0), "3m05s");
        assert_eq!(human_duration(3720.0), "1h02m");
    }
}
