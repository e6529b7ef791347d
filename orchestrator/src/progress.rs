//! Progress for the long commands: indicatif bars (submit, event collection,
//! `status --watch`) and the one-line sweep summary `status` prints, with an
//! ETA from the durations of the runs that finished.
//!
//! Bars draw on stderr and only when it is a terminal, so piped output
//! (`status --json | jq`, CI logs) stays exactly the tables.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal;
use std::path::Path;

use crate::fsio;
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
    let style =
        ProgressStyle::with_template("{spinner} {msg} {elapsed}").unwrap_or_else(|_| ProgressStyle::default_spinner());
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
    /// Time to the last live config ending, seconds, as of `at`; `None`
    /// until [`RUNS_FOR_ETA`] runs (or all submitted) have ended: one run's
    /// time says too little, and an ETA that jumps is worse than none.
    pub eta_s: Option<f64>,
    /// When these figures were taken (Unix seconds): the ETA counts down from here.
    pub at: f64,
}

/// Finished runs an ETA needs (fewer when fewer were submitted).
pub const RUNS_FOR_ETA: usize = 3;

/// How long a finished attempt ran: the worker's own wall time when there is a
/// result, else from the first RUNNING to the end in the SLURM history.
fn duration(r: &ConfigRecord) -> Option<f64> {
    if let Some(res) = &r.result() {
        return Some(res.wall_s);
    }
    let a = r.latest()?;
    let end = a.history().last().filter(|c| c.state.activity() == Activity::Ended)?.t;
    let start =
        a.history().iter().find(|c| c.state.activity() == Activity::Running).map(|c| c.t).or(a.submitted_at())?;
    (end >= start).then_some(end - start)
}

/// When the latest attempt started running (the worker's start, else SLURM's RUNNING).
fn started(r: &ConfigRecord) -> Option<f64> {
    let a = r.latest()?;
    a.live()
        .as_ref()
        .and_then(|l| l.started_t)
        .or_else(|| a.history().iter().find(|c| c.state.activity() == Activity::Running).map(|c| c.t))
}

/// The array tasks, as (submission, task id), that run more than one of
/// these configs (`configs_per_task` above 1).
fn shared_tasks(records: &[&ConfigRecord]) -> BTreeSet<(String, u32)> {
    let mut seen = BTreeSet::new();
    let mut shared = BTreeSet::new();
    for a in records.iter().filter_map(|r| r.latest()) {
        let key = (a.submission().to_string(), a.task_id());
        if !seen.insert(key.clone()) {
            shared.insert(key);
        }
    }
    shared
}

/// Where a config of a RUNNING task stands: its own run may have ended (its
/// result is in) or, in a task of several configs, not begun.
fn in_running_task(r: &ConfigRecord, shared: &BTreeSet<(String, u32)>) -> Activity {
    let Some(a) = r.latest() else { return Activity::Queued };
    if r.result().is_some() {
        Activity::Ended
    } else if a.worker().is_not_started() && shared.contains(&(a.submission().to_string(), a.task_id())) {
        Activity::Queued
    } else {
        Activity::Running
    }
}

/// Counts and ETA over the records of a sweep, as of `now`.
///
/// Run time grows with the model, so the finished runs give seconds per
/// predicted GiB (their median), and each config still to run is expected
/// to take its prediction times that (the median run time where a config
/// has no prediction). A running config needs its expected time less what
/// it already ran. The ETA is the remaining work divided by the array's
/// parallelism (`array_parallelism`, or as many as run now), and never less
/// than the longest single remaining run. In a task of several configs,
/// each counts as its own run: ended once its result is in, waiting until
/// its worker reaches it. A config never submitted counts as `predicted by
/// the active sweep` when an active sweep answered it by a prediction
/// (`predicted`: their names), as `status`'s table counts it, else as `not
/// submitted`.
pub fn sweep_progress<'a>(
    records: impl IntoIterator<Item = &'a ConfigRecord>,
    parallelism: Option<u32>,
    now: f64,
    predicted: &BTreeSet<&str>,
) -> SweepProgress {
    let records: Vec<&ConfigRecord> = records.into_iter().collect();
    let shared = shared_tasks(&records);
    let mut p = SweepProgress { at: now, ..SweepProgress::default() };
    let mut durations = Vec::new();
    let mut per_gib = Vec::new();
    // (predicted GiB, seconds already run) of each live config.
    let mut live: Vec<(Option<f64>, f64)> = Vec::new();
    // The seconds left of each running chain that reports its progress.
    let mut chains: Vec<f64> = Vec::new();
    for r in records {
        p.total += 1;
        // A live config that has run `ran` seconds: a chain that reports its
        // progress goes on at its own pace (requeued between segments too),
        // any other is expected to take what the ended runs took.
        let mut go_on = |ran: f64| match chain_left(r, now) {
            Some(left) => chains.push(left),
            None => live.push((r.predicted_gib(), ran)),
        };
        let state = match r.latest() {
            None => {
                p.never_submitted += 1;
                if predicted.contains(r.name()) { "predicted by the active sweep" } else { "not submitted" }.to_string()
            }
            Some(a) if a.array_job_id().is_none() => {
                p.waiting += 1;
                go_on(0.0);
                "SUBMITTING".to_string()
            }
            Some(a) => match a.state() {
                None => {
                    p.waiting += 1;
                    go_on(0.0);
                    "SUBMITTED".to_string()
                }
                Some(s) => {
                    let activity = match s.activity() {
                        Activity::Running => in_running_task(r, &shared),
                        other => other,
                    };
                    match activity {
                        Activity::Queued => {
                            p.waiting += 1;
                            go_on(0.0);
                        }
                        Activity::Running => {
                            p.running += 1;
                            go_on(started(r).map_or(0.0, |t| (now - t).max(0.0)));
                        }
                        Activity::Ended => {
                            p.ended += 1;
                            if let Some(d) = duration(r) {
                                durations.push(d);
                                if let Some(g) = r.predicted_gib().filter(|g| *g > 0.0) {
                                    per_gib.push(d / g);
                                }
                            }
                        }
                    }
                    s.to_string()
                }
            },
        };
        *p.counts.entry(state).or_default() += 1;
    }
    p.median_run_s = median(&mut durations);
    // The running chains know their own pace; the sweep ends with the last of them (they run at once).
    p.eta_s = match (
        chains.iter().copied().reduce(f64::max),
        eta(&p, &live, durations.len(), median(&mut per_gib), parallelism),
    ) {
        (None, others) => others,
        (Some(chain), _) if live.is_empty() => Some(chain),
        (Some(chain), others) => others.map(|e| e.max(chain)),
    };
    p
}

/// The median of `v` (its upper one for an even count), sorting it.
fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// The seconds a running chained run has left, from the progress its
/// command reports (`step 40/100`, `Epoch  12/500`: the last `N/M` of the
/// line) and the time since its first segment began running, over every
/// attempt (queueing between segments included): that time per step done,
/// times the steps to go. `None` when it is not a chain or reports no such progress.
fn chain_left(r: &ConfigRecord, now: f64) -> Option<f64> {
    let chain = r.latest()?.chain()?;
    let progress = chain.progress.as_deref().or_else(|| chain.ended.last()?.progress.as_deref())?;
    let (done, total) = fraction(progress)?;
    let began = r
        .attempts()
        .iter()
        .filter_map(|a| a.history().iter().find(|c| c.state.activity() == Activity::Running).map(|c| c.t))
        .reduce(f64::min)?;
    let per_step = (now - began).max(0.0) / done as f64;
    Some(per_step * total.saturating_sub(done) as f64)
}

/// The last `N/M` of a progress line, with 0 < N <= M.
fn fraction(line: &str) -> Option<(u64, u64)> {
    static N_OF_M: std::sync::OnceLock<regex_lite::Regex> = std::sync::OnceLock::new();
    let re = N_OF_M.get_or_init(|| regex_lite::Regex::new(r"(\d+)\s*/\s*(\d+)").expect("a constant pattern"));
    let last = re.captures_iter(line).last()?;
    let (done, total): (u64, u64) = (last[1].parse().ok()?, last[2].parse().ok()?);
    (done > 0 && done <= total).then_some((done, total))
}

/// Seconds until every live config (predicted GiB, seconds already run)
/// has ended: each expected to run the sweep's seconds per predicted GiB
/// (else the median run) less what it ran, spread over the tasks that run
/// at once. `None` until [`RUNS_FOR_ETA`] runs have ended.
fn eta(
    p: &SweepProgress,
    live: &[(Option<f64>, f64)],
    ended_runs: usize,
    s_per_gib: Option<f64>,
    parallelism: Option<u32>,
) -> Option<f64> {
    let submitted = p.total - p.never_submitted;
    match p.median_run_s {
        _ if live.is_empty() => Some(0.0),
        None => None,
        Some(_) if ended_runs < RUNS_FOR_ETA.min(submitted) => None,
        Some(m) => {
            let expect = |g: Option<f64>| match (g, s_per_gib) {
                (Some(g), Some(k)) if g > 0.0 => g * k,
                _ => m,
            };
            let left: Vec<f64> = live.iter().map(|&(g, ran)| (expect(g) - ran).max(0.0)).collect();
            let width = parallelism.map_or(0, |n| n as usize).max(p.running).max(1) as f64;
            let longest = left.iter().copied().fold(0.0, f64::max);
            Some((left.iter().sum::<f64>() / width).max(longest))
        }
    }
}

/// The progress of experiment `experiment` under `state_root`, read without
/// the lock (`predicted`: the configs an active sweep answered by a prediction).
pub fn read(
    state_root: &Path,
    experiment: &str,
    predicted: &BTreeSet<&str>,
) -> Result<SweepProgress, state::StateError> {
    let view = state::View::new(state_root, experiment)?;
    let parallelism = view.array_parallelism()?;
    let records: Vec<ConfigRecord> = view.records()?.into_values().collect();
    Ok(sweep_progress(&records, parallelism, fsio::now(), predicted))
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
            None if self.running + self.waiting > 0 => s.push_str(&format!("; ETA after {RUNS_FOR_ETA} runs end")),
            _ => {}
        }
        s
    }

    /// The ETA at time `now`: it counts down between polls.
    pub fn eta_left(&self, now: f64) -> Option<f64> {
        self.eta_s.map(|e| (e - (now - self.at).max(0.0)).max(0.0))
    }

    /// Shows this progress on a [`watch_bar`] (length = submitted configs),
    /// `running` (the running configs' phase and peak) beside it; the ETA
    /// moves halfway from the one shown towards the new estimate each poll.
    pub fn show_on(&self, bar: &WatchBar, running: &str) {
        bar.bar.set_length((self.total - self.never_submitted) as u64);
        bar.bar.set_position(self.ended as u64);
        bar.bar.set_prefix(format!("{} running{running}", self.running));
        if let Ok(mut g) = bar.progress.lock() {
            let shown = g.as_ref().and_then(|p| p.eta_left(self.at));
            let mut next = self.clone();
            next.eta_s = smooth(shown, self.eta_s);
            *g = Some(next);
        }
    }
}

/// The ETA to show: halfway from the one shown (`shown`, counted down to
/// now) to the new estimate, so one poll's news never makes it jump.
pub fn smooth(shown: Option<f64>, estimate: Option<f64>) -> Option<f64> {
    match (shown, estimate) {
        (Some(old), Some(new)) if new > 0.0 => Some(old + (new - old) / 2.0),
        (_, new) => new,
    }
}

/// The `status --watch` bar: its elapsed clock and ETA tick every second,
/// between polls too.
pub struct WatchBar {
    pub bar: ProgressBar,
    progress: std::sync::Arc<std::sync::Mutex<Option<SweepProgress>>>,
}

/// A [`WatchBar`] (hidden when stderr is not a terminal).
pub fn watch_bar() -> WatchBar {
    let progress: std::sync::Arc<std::sync::Mutex<Option<SweepProgress>>> = Default::default();
    let shared = progress.clone();
    let b = ProgressBar::with_draw_target(Some(0), target());
    let style = ProgressStyle::with_template("{msg:>16} [{bar:30}] {pos}/{len} {elapsed_precise} {prefix}{eta_left}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
        .with_key("eta_left", move |_: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
            let p = shared.lock().ok().and_then(|g| g.clone());
            if let Some(p) = p.filter(|p| p.running + p.waiting > 0) {
                let _ = match p.eta_left(fsio::now()) {
                    Some(e) => write!(w, ", ETA ~{}", human_duration(e)),
                    None => write!(w, ", ETA after {RUNS_FOR_ETA} runs end"),
                };
            }
        });
    b.set_style(style);
    b.set_message("configs ended");
    b.enable_steady_tick(std::time::Duration::from_secs(1));
    WatchBar { bar: b, progress }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::WorkerOutcome;
    use crate::slurm::SlurmState;
    use crate::state::Attempt;

    /// An attempt as array task `task`, seen in the states of `history`, then `state`.
    fn attempt(task: u32, state: Option<SlurmState>, history: Vec<(f64, SlurmState)>) -> Attempt {
        let a = Attempt::intended("s001-x", task, 0.0).in_array("7").submitted(0.0);
        history.into_iter().fold(a, |a, (t, s)| a.seen(s, t, None)).in_state(state)
    }

    fn ok(wall: f64) -> facts::event::RunResult {
        serde_json::from_value(serde_json::json!({
            "event": "result", "t": 0.0, "status": "ok", "params": 0, "peaks": {}, "peak_bytes": 0, "wall_s": wall
        }))
        .expect("a result")
    }

    /// A config predicted at `gib` with attempt `a`, and a result of `wall` seconds.
    fn rec_of(hash: &str, gib: f64, a: Option<Attempt>, wall: Option<f64>) -> ConfigRecord {
        let r = ConfigRecord::fixture(hash, hash).with_verdict(Some(crate::precheck::VerdictKind::Fits), Some(gib));
        let r = match a {
            Some(a) => r.with_attempt(a),
            None => r,
        };
        r.with_result(wall.map(ok))
    }

    fn rec(hash: &str, state: Option<SlurmState>, history: Vec<(f64, SlurmState)>, wall: Option<f64>) -> ConfigRecord {
        // A task of its own (by its name), as with one config per task.
        let task = hash.bytes().fold(0u32, |t, b| t.wrapping_mul(31).wrapping_add(b.into()));
        rec_of(hash, 1.0, Some(attempt(task, state, history)), wall)
    }

    #[test]
    fn counts_and_eta_from_finished_durations() {
        let done = |h: &str, wall| rec(h, Some(SlurmState::Completed), vec![(1.0, SlurmState::Completed)], Some(wall));
        // Without a result the SLURM history gives the duration: RUNNING at 100, ended at 130.
        let failed =
            rec("f", Some(SlurmState::Failed), vec![(100.0, SlurmState::Running), (130.0, SlurmState::Failed)], None);
        let running = rec("r", Some(SlurmState::Running), vec![(5.0, SlurmState::Running)], None);
        let pending: Vec<ConfigRecord> =
            (0..3).map(|i| rec(&format!("p{i}"), Some(SlurmState::Pending), vec![], None)).collect();
        let never = rec_of("n", 1.0, None, None);
        let mut all = vec![done("a", 10.0), done("b", 20.0), failed, running, never];
        all.extend(pending);
        let p = sweep_progress(&all, None, 1000.0, &BTreeSet::new());
        assert_eq!(p.total, 8);
        assert_eq!(p.ended, 3);
        assert_eq!((p.running, p.waiting, p.never_submitted), (1, 3, 1));
        assert_eq!(p.counts["COMPLETED"], 2);
        assert_eq!(p.counts["PENDING"], 3);
        assert_eq!(p.counts["not submitted"], 1);
        assert_eq!(p.median_run_s, Some(20.0)); // of 10, 20, 30
                                                // 20 s per predicted GiB (all predict 1 GiB): 4 live configs, 1 at a
                                                // time; the running one has run 995 s, longer than expected: 0 left.
        assert_eq!(p.eta_s, Some(60.0));
        assert!(p.line().contains("ETA ~1m00s"), "{}", p.line());
        // It counts down between polls, to zero, never below.
        assert_eq!(p.eta_left(1010.0), Some(50.0));
        assert_eq!(p.eta_left(2000.0), Some(0.0));
    }

    /// A config an active sweep answered by a prediction is not "not
    /// submitted" beside "N predicted" (issue 32): it counts as predicted.
    #[test]
    fn a_config_answered_by_a_prediction_counts_as_predicted() {
        let all = vec![rec_of("n", 1.0, None, None), rec_of("m", 1.0, None, None)];
        let p = sweep_progress(&all, None, 0.0, &BTreeSet::from(["n"]));
        assert_eq!(
            (p.counts["predicted by the active sweep"], p.counts["not submitted"], p.never_submitted),
            (1, 1, 2)
        );
        assert!(p.line().starts_with("2 configs: 1 not submitted, 1 predicted by the active sweep"), "{}", p.line());
    }

    /// The case seen in the field: the small configs finish first; the big
    /// ones take longer in proportion to their predicted memory, and the
    /// array runs 2 at a time.
    #[test]
    fn eta_scales_with_the_prediction_and_divides_by_the_parallelism() {
        let small: Vec<ConfigRecord> =
            (0..3).map(|i| rec(&format!("s{i}"), Some(SlurmState::Completed), vec![], Some(2.0))).collect();
        let big: Vec<ConfigRecord> = (0..4)
            .map(|i| rec_of(&format!("b{i}"), 10.0, Some(attempt(100 + i, Some(SlurmState::Pending), vec![])), None))
            .collect();
        // One finished run says too little for an ETA.
        let one: Vec<ConfigRecord> = small[..1].iter().chain(&big).cloned().collect();
        assert_eq!(sweep_progress(&one, Some(2), 0.0, &BTreeSet::new()).eta_s, None);
        let all: Vec<ConfigRecord> = small.into_iter().chain(big).collect();
        // 2 s per GiB: each big one 20 s; 4 of them 2 at a time: 40 s (a median-run ETA would say 4 s).
        let p = sweep_progress(&all, Some(2), 0.0, &BTreeSet::new());
        assert_eq!(p.eta_s, Some(40.0));
        let p = sweep_progress(&all, None, 0.0, &BTreeSet::new());
        assert_eq!(p.eta_s, Some(80.0), "no parallelism known, none running: one at a time");
    }

    #[test]
    fn configs_of_one_running_task_count_as_ended_running_or_waiting_each() {
        // One task runs a, b, c in turn: a has its result, b runs, c waits its turn.
        let task = |h: &str, worker: WorkerOutcome, wall: Option<f64>| {
            let a = attempt(7, Some(SlurmState::Running), vec![(5.0, SlurmState::Running)]).with_worker(worker);
            rec_of(h, 1.0, Some(a), wall)
        };
        let a = task("a", WorkerOutcome::NotStarted, Some(4.0));
        let b = task("b", WorkerOutcome::NoResult, None);
        let c = task("c", WorkerOutcome::NotStarted, None);
        let p = sweep_progress(&[a, b, c.clone()], Some(1), 100.0, &BTreeSet::new());
        assert_eq!((p.ended, p.running, p.waiting), (1, 1, 1));
        assert_eq!(p.counts["RUNNING"], 3, "SLURM's state, per config");
        // Alone in its task, a config its worker has not started yet runs (the worker is loading).
        let p = sweep_progress(&[c], Some(1), 100.0, &BTreeSet::new());
        assert_eq!((p.running, p.waiting), (1, 0));
    }

    #[test]
    fn no_eta_before_anything_finished_and_zero_when_settled() {
        let p = sweep_progress(&[rec("r", Some(SlurmState::Running), vec![], None)], None, 0.0, &BTreeSet::new());
        assert_eq!(p.eta_s, None);
        assert!(p.line().ends_with("ETA after 3 runs end"));
        let p =
            sweep_progress(&[rec("a", Some(SlurmState::Completed), vec![], Some(3.0))], None, 0.0, &BTreeSet::new());
        assert_eq!(p.eta_s, Some(0.0));
        assert!(!p.line().contains("ETA"));
    }

    #[test]
    fn a_new_estimate_moves_the_shown_eta_halfway() {
        // Shown 90 s; the next poll estimates 8 s: 49 s, then 28.5 s, not a jump to 8.
        assert_eq!(smooth(Some(90.0), Some(8.0)), Some(49.0));
        assert_eq!(smooth(Some(49.0), Some(8.0)), Some(28.5));
        assert_eq!(smooth(None, Some(8.0)), Some(8.0), "the first estimate as it is");
        assert_eq!(smooth(Some(30.0), Some(0.0)), Some(0.0), "done is done");
        assert_eq!(smooth(Some(30.0), None), None);
    }

    #[test]
    fn durations_read_humanly() {
        assert_eq!(human_duration(12.4), "12s");
        assert_eq!(human_duration(0.43), "0.4s");
        assert_eq!(human_duration(185.0), "3m05s");
        assert_eq!(human_duration(3720.0), "1h02m");
    }

    /// A chained run seen RUNNING from `began`, its command's last progress `progress`.
    fn chain_rec(hash: &str, state: SlurmState, began: f64, progress: &str) -> ConfigRecord {
        let chain = crate::state::ChainRead { progress: Some(progress.into()), ..Default::default() };
        let history = vec![(began, SlurmState::Running), (began + 50.0, state.clone())];
        let a = attempt(u32::from(hash.as_bytes()[0]), Some(state), history).with_chain(Some(chain));
        rec_of(hash, 1.0, Some(a), None)
    }

    /// Training chains end after days, so no three runs end before the first
    /// ETA: each running or requeued chain's own pace says when it ends
    /// (seconds since its first segment began, per step done, times the
    /// steps left), and the sweep ends with the slowest.
    #[test]
    fn chains_give_an_eta_from_their_own_progress_before_any_run_ends() {
        let records = [
            chain_rec("a", SlurmState::Running, 100.0, "step 40/100"),
            chain_rec("b", SlurmState::Pending, 0.0, "Epoch  10/20"),
        ];
        let p = sweep_progress(records.iter(), None, 500.0, &BTreeSet::new());
        // a: 400 s for 40 steps, 60 to go: 600 s; b: 500 s for 10 epochs, 10 to go: 500 s.
        assert_eq!(p.eta_s, Some(600.0));
        assert!(p.line().ends_with("; ETA ~10m00s"), "{}", p.line());
        // Without progress a chain is a run like any other: no ETA before three end.
        let plain = [chain_rec("a", SlurmState::Running, 100.0, "loading data")];
        assert_eq!(sweep_progress(plain.iter(), None, 500.0, &BTreeSet::new()).eta_s, None);
    }

    #[test]
    fn a_progress_fraction_is_the_last_n_of_m_of_the_line() {
        assert_eq!(fraction("Epoch  12/500"), Some((12, 500)));
        assert_eq!(fraction("epoch 12 / 500, batch 3/40"), Some((3, 40)));
        assert_eq!(fraction("step 0/10"), None, "nothing done: no pace yet");
        assert_eq!(fraction("step 11/10"), None);
        assert_eq!(fraction("loss 0.5/x"), None);
        assert_eq!(fraction("no progress"), None);
    }
}
