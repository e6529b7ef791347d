//! `status`: the table (SLURM state, live phase and peak, results), its JSON
//! rows, and `--watch`.

use facts::event::RunStatus;
use facts::run::ConfigHash;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::interrupt::Interrupt;
use super::poll::awaiting_result;
use super::poll::result_grace_s;
use super::poll::{update, PollSummary};
use super::{open_target, protocol, stored_sweep, CommandError, Options};
use crate::fsio;
use crate::precheck::Verdict;
use crate::slurm::Activity;
use crate::state::{ConfigRecord, StateDir};
use crate::sweep::Sweep;

/// One line of `status`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusRow {
    pub name: String,
    pub hash: ConfigHash,
    pub verdict: String,
    pub predicted_gib: Option<f64>,
    /// SLURM state of the latest attempt (`-` never submitted, `SUBMITTING` unsettled intent).
    pub state: String,
    pub job: Option<String>,
    pub attempts: usize,
    pub result: Option<String>,
    /// The measured peak once there is a result; while RUNNING, the peak so far.
    pub peak_gib: Option<f64>,
    /// The phase the worker reports (live while RUNNING, where it stopped after).
    pub phase: Option<String>,
    /// Why the latest attempt failed: the worker's message, or, for a job
    /// that failed before or outside the worker, its log's last lines.
    pub cause: Option<String>,
    /// Never submitted, answered by an active sweep's prediction (`"source":
    /// "predicted"`, with its interval, verdict and whether it settles the config).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<crate::active::Answer>,
    /// SLURM's state where it contradicts the worker's own result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// A chained run's segment (the one running, or the last).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain: Option<super::segments::ChainStatus>,
}

/// The result column: the result and its peak; live, the phase (a chain's
/// segment) and the peak so far.
fn result_cell(r: &StatusRow) -> String {
    let mem = crate::precheck::memory;
    let phase = match (&r.chain, &r.phase) {
        (Some(c), _) => Some(c.words()),
        (None, ph) => ph.clone(),
    };
    match (&r.result, r.peak_gib, phase) {
        _ if r.answer.is_some() => r.answer.as_ref().and_then(|a| a.predicted_words()).unwrap_or_default(),
        (Some(st), peak, _) => {
            let peak = peak.map(|p| format!(" {}", mem(p))).unwrap_or_default();
            let after = r.chain.as_ref().map(|c| format!(" after segment {}", c.segment)).unwrap_or_default();
            format!("{st}{peak}{after}")
        }
        (None, Some(p), Some(ph)) => format!("{ph} {}", mem(p)),
        (None, None, Some(ph)) => ph,
        _ => "-".into(),
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct StatusReport {
    pub rows: Vec<StatusRow>,
    pub poll: PollSummary,
    /// Whether no config is queued, running or being submitted.
    pub settled: bool,
    /// `--watch` ended by Ctrl-C (the sweep goes on).
    #[serde(skip)]
    pub interrupted: bool,
}

impl StatusReport {
    pub fn count(&self, state: &str) -> usize {
        self.rows.iter().filter(|r| r.state == state).count()
    }

    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<28} {:<12} {:<8} {:>8} {:<14} {:<12} {:>3} {:<10}\n",
            "config", "hash", "verdict", "predicted", "state", "job", "try", "result"
        );
        for r in &self.rows {
            s += &format!(
                "{:<28} {:<12} {:<8} {:>8} {:<14} {:<12} {:>3} {:<10}\n",
                r.name,
                r.hash,
                r.verdict,
                r.predicted_gib.map(crate::precheck::memory).unwrap_or_else(|| "-".into()),
                r.state,
                r.job.clone().unwrap_or_else(|| "-".into()),
                r.attempts,
                result_cell(r),
            );
        }
        s += &self.causes();
        for r in self.rows.iter().filter(|r| r.note.is_some()) {
            s += &format!("note: {}: {}\n", r.name, r.note.as_deref().unwrap_or_default());
        }
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &self.rows {
            let state = match (r.state.as_str(), &r.answer) {
                ("-", Some(_)) => "predicted by the active sweep",
                ("-", None) => "not submitted",
                (s, _) => s,
            };
            *counts.entry(state).or_default() += 1;
        }
        let polled = match (self.poll.polled, self.poll.local, self.poll.replay) {
            (false, _, _) => "nothing submitted, nothing polled".to_string(),
            (true, true, _) => "local processes, no SLURM".to_string(),
            (true, _, true) => "replayed from recorded measurements: no SLURM, no GPU run".to_string(),
            (true, false, false) => format!("{} SLURM commands this poll", self.poll.commands),
        };
        s += &format!(
            "{} configs: {}; {polled}{}\n",
            self.rows.len(),
            counts.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join(", "),
            if self.poll.errors.is_empty() {
                String::new()
            } else {
                format!(" (warnings: {})", self.poll.errors.join("; "))
            }
        );
        s
    }

    /// Why configs failed, those failing alike (a missing library) under one heading.
    fn causes(&self) -> String {
        let mut causes: Vec<(&str, Vec<&str>)> = Vec::new();
        for r in &self.rows {
            let Some(cause) = r.cause.as_deref() else { continue };
            match causes.iter_mut().find(|(c, _)| c.lines().next() == cause.lines().next()) {
                Some((_, names)) => names.push(&r.name),
                None => causes.push((cause, vec![&r.name])),
            }
        }
        let mut s = String::new();
        for (cause, names) in causes {
            s += &match names.len() {
                1 => format!("why {} failed:\n", names[0]),
                n => format!("why {n} configs failed ({}), as {} did:\n", names.join(", "), names[0]),
            };
            for line in cause.lines() {
                s += &format!("  {line}\n");
            }
        }
        s
    }
}

fn rows(sweep: &Sweep, records: &BTreeMap<ConfigHash, ConfigRecord>) -> Vec<StatusRow> {
    let mut seen = BTreeSet::new();
    let mut names = BTreeSet::new();
    let mut out = Vec::new();
    for c in &sweep.configs {
        if !seen.insert(&c.hash) {
            continue;
        }
        let Some(r) = records.get(&c.hash) else { continue };
        let latest = r.latest();
        // The record keeps the last result a worker wrote; an attempt made
        // since (a resume) whose worker has not started yet has none of its own.
        let stale = latest.is_some_and(|a| a.worker().is_not_started())
            && r.attempts().iter().any(|a| !a.worker().is_not_started());
        let result = r.result().filter(|_| !stale);
        let (state, note) = row_state(latest, result);
        let job = latest.and_then(|a| a.array_job_id().map(|j| format!("{j}_{}", a.task_id())));
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let live =
            latest.filter(|a| a.state().is_some_and(|s| s.activity() == Activity::Running)).and_then(|a| a.live());
        // A run that failed or was cancelled measured nothing: no figure (the
        // report shows none either), its cause below the table. An OOM shows
        // the peak it reached, where one is known (a replayed record's OOM
        // often has none).
        // A chain's peak is its highest segment's, not its last one's.
        let segments_peak = r.attempts().iter().filter_map(|a| a.chain()).flat_map(|c| &c.ended).map(|e| e.peak_bytes);
        let chain_peak = segments_peak.max().unwrap_or(0);
        let peak = match result {
            Some(v) if v.status == RunStatus::Ok => Some(gib(v.peak_bytes.max(chain_peak))),
            Some(v) if v.status == RunStatus::Oom && v.peak_bytes > 0 => Some(gib(v.peak_bytes)),
            Some(_) => None,
            None => live.map(|l| gib(l.peak_bytes)),
        };
        let phase = match result {
            Some(v) => v.phase.map(|p| p.name().to_string()),
            None => live.map(|l| l.phase.name().to_string()),
        };
        // The stored sweep lists the file's configs first, then those the
        // file no longer has: an edited config's earlier version, named so
        // (as the report names it).
        let name = match names.insert(r.name().to_string()) {
            true => r.name().to_string(),
            false => format!("{} (earlier version)", r.name()),
        };
        out.push(StatusRow {
            name,
            hash: r.hash().clone(),
            verdict: r.verdict().map(|v| v.to_string()).unwrap_or_default(),
            predicted_gib: r.predicted_gib(),
            state,
            job,
            attempts: r.attempts().iter().filter(|a| !a.abandoned()).count(),
            result: result.map(|v| v.status.name().to_string()),
            peak_gib: peak,
            phase,
            cause: if stale { None } else { r.failure_cause() },
            note,
            answer: None,
            chain: super::segments::chain_status(r),
        });
    }
    out
}

/// The state column and, where SLURM's word for the task contradicts the
/// worker's own result, a note of SLURM's: a config the worker ended `ok` in
/// a task SLURM calls FAILED (another config of the task, or the script
/// after the worker, failed) reads `ENDED`, not FAILED.
fn row_state(
    latest: Option<&crate::state::Attempt>,
    result: Option<&facts::event::RunResult>,
) -> (String, Option<String>) {
    let Some(a) = latest else { return ("-".into(), None) };
    let Some(slurm) = a.state() else {
        return (if a.array_job_id().is_none() { "SUBMITTING" } else { "SUBMITTED" }.into(), None);
    };
    if a.array_job_id().is_none() {
        return ("SUBMITTING".into(), None);
    }
    match result {
        Some(res)
            if slurm.activity() == Activity::Ended
                && *slurm != crate::slurm::SlurmState::Completed
                && res.status == facts::event::RunStatus::Ok =>
        {
            let note = format!("the worker ended ok; SLURM calls its task {slurm}");
            ("ENDED".into(), Some(note))
        }
        _ => (slurm.to_string(), None),
    }
}

/// The status of a sweep never submitted: every config `-`, with its verdict.
pub fn unsubmitted(sweep: &Sweep, state_root: &std::path::Path) -> StatusReport {
    let v = super::judge::verdicts(sweep, state_root);
    let mut seen = BTreeSet::new();
    let rows = sweep
        .configs
        .iter()
        .filter(|c| seen.insert(&c.hash))
        .map(|c| {
            let verdict = v.get(&c.hash);
            StatusRow {
                name: c.name.clone(),
                hash: c.hash.clone(),
                verdict: verdict.map(|v| v.name().to_string()).unwrap_or_default(),
                predicted_gib: verdict.and_then(Verdict::predicted_gib),
                state: "-".into(),
                job: None,
                attempts: 0,
                result: None,
                peak_gib: None,
                phase: None,
                cause: None,
                note: None,
                answer: None,
                chain: None,
            }
        })
        .collect();
    StatusReport { rows, poll: PollSummary::default(), settled: true, interrupted: false }
}

/// `--watch` pacing: polls every `min`, stretching ×1.5 up to `max` while nothing changes.
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    pub min: Duration,
    pub max: Duration,
    /// Stop after this many polls (tests); `None` = until settled or Ctrl-C.
    pub max_polls: Option<u32>,
}

impl Default for Watch {
    fn default() -> Self {
        Watch { min: Duration::from_secs(5), max: Duration::from_secs(60), max_polls: None }
    }
}

/// `status`: one poll (or, with `watch`, polls until every config settled),
/// printing the table after each through `print`. Watching, Ctrl-C ends the
/// watch ([`Interrupt`], listened for from here on; a second press does
/// nothing more: use [`status_until`] to leave at once).
pub async fn status(
    experiment: &str,
    opts: &Options,
    watch: Option<Watch>,
    print: &mut (dyn FnMut(&StatusReport) + Send),
) -> Result<StatusReport, CommandError> {
    let interrupt = watch.and_then(|_| Interrupt::listen(|_| {}));
    status_until(experiment, opts, watch, interrupt.as_ref(), print).await
}

/// [`status`] watching until every config settled or `interrupt` (Ctrl-C):
/// a press during a wait ends it at once; one during a poll, once the poll
/// is applied ([`StatusReport::interrupted`]).
pub async fn status_until(
    experiment: &str,
    opts: &Options,
    watch: Option<Watch>,
    interrupt: Option<&Interrupt>,
    print: &mut (dyn FnMut(&StatusReport) + Send),
) -> Result<StatusReport, CommandError> {
    let stored = stored_sweep(&opts.state_root, experiment)?;
    let target = open_target(opts, &opts.cluster.clone().unwrap_or(stored.cluster.clone()))?;
    let mut interval = watch.map(|w| w.min).unwrap_or_default();
    let mut polls = 0u32;
    let interrupt = interrupt.filter(|_| watch.is_some());
    loop {
        polls += 1;
        if let Some(i) = interrupt {
            i.at("watch:polling").await;
        }
        // The lock only while touching the state: cancel/resume may run between polls.
        let result: Result<StatusReport, CommandError> = async {
            let mut st = StateDir::open(&opts.state_root, experiment, opts.lock_wait)?;
            protocol::reconcile(&mut st, &target, false).await?;
            let grace = result_grace_s(opts, &target);
            let poll = update(&mut st, &target, &stored.sweep, false, grace).await?;
            let mut rows = rows(&stored.sweep, st.records());
            if let Some(a) = st.view().active()? {
                super::active::annotate(&mut rows, &a);
            }
            // Settled: nothing queued, running or unresolved, and no ended job's result still in flight.
            let now = fsio::now();
            let settled = !st
                .records()
                .values()
                .any(|r| r.occupied() || r.latest().is_some_and(|a| awaiting_result(a, grace, now)));
            Ok(StatusReport { rows, poll, settled, interrupted: false })
        }
        .await;
        let Some(w) = watch else { return result };
        match &result {
            Ok(rep) => {
                print(rep);
                if rep.settled || w.max_polls.is_some_and(|m| polls >= m) {
                    return result;
                }
                interval = if rep.poll.changed > 0 { w.min } else { (interval.mul_f64(1.5)).min(w.max) };
            }
            Err(CommandError::Transport(e)) => {
                // The connection or the controller is down: keep watching, more slowly.
                tracing::warn!("poll failed, retrying in {:?}: {e}", interval);
                eprintln!("status: poll failed ({e}); retrying");
                if w.max_polls.is_some_and(|m| polls >= m) {
                    return result;
                }
                interval = (interval.mul_f64(1.5)).min(w.max);
            }
            Err(_) => return result,
        }
        let Some(i) = interrupt else {
            tokio::time::sleep(interval).await;
            continue;
        };
        i.at("watch:waiting").await;
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            () = i.wait() => return result.map(|r| StatusReport { interrupted: true, ..r }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::SlurmState;
    use crate::state::{Attempt, Live};
    use facts::event::Phase;

    fn demo() -> Sweep {
        crate::sweep::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments/demo.yaml"), &[])
            .expect("demo loads")
    }

    fn attempt(state: SlurmState, live: Option<Live>) -> Attempt {
        Attempt::intended("s001-x", 0, 0.0)
            .in_array("7")
            .ran_as(Some("8"))
            .submitted(0.0)
            .in_state(Some(state))
            .with_worker(crate::collect::WorkerOutcome::NoResult)
            .with_live(live)
    }

    #[test]
    fn running_configs_show_their_live_phase_and_peak() {
        let sweep = demo();
        let c = &sweep.configs[0];
        let live = Live { phase: Phase::Bwd, peak_bytes: 3 << 30, started_t: Some(1.0), t: 2.0 };
        let r = ConfigRecord::fixture(&c.hash, &c.name)
            .with_verdict(Some(crate::precheck::VerdictKind::Fits), Some(4.0))
            .with_attempt(attempt(SlurmState::Running, Some(live)));
        let records = BTreeMap::from([(c.hash.clone(), r)]);
        let rows = rows(&sweep, &records);
        assert_eq!(rows[0].phase.as_deref(), Some("bwd"));
        assert_eq!(rows[0].peak_gib, Some(3.0));
        let json = serde_json::to_value(&rows[0]).expect("json");
        assert_eq!(json["phase"], "bwd");
        assert_eq!(json["peak_gib"], 3.0);
        let report = StatusReport { rows, poll: PollSummary::default(), settled: false, interrupted: false };
        let line = report.table().lines().nth(1).expect("row").to_string();
        assert!(line.contains("RUNNING") && line.trim_end().ends_with("bwd 3.0G"), "{line}");
    }

    #[test]
    fn an_ended_config_shows_its_result_not_its_last_heartbeat() {
        let sweep = demo();
        let c = &sweep.configs[0];
        let live = Live { phase: Phase::Fwd, peak_bytes: 1 << 30, started_t: None, t: 2.0 };
        let result = serde_json::from_value(serde_json::json!({
            "event": "result", "t": 0.0, "status": "ok", "params": 0, "peaks": {}, "peak_bytes": 2u64 << 30,
            "wall_s": 0.0
        }))
        .expect("a result");
        let r = ConfigRecord::fixture(&c.hash, &c.name)
            .with_verdict(Some(crate::precheck::VerdictKind::Fits), None)
            .with_attempt(attempt(SlurmState::Completed, Some(live)))
            .with_result(Some(result));
        let rows = rows(&sweep, &BTreeMap::from([(c.hash.clone(), r)]));
        assert_eq!(rows[0].result.as_deref(), Some("ok"));
        assert_eq!(rows[0].peak_gib, Some(2.0));
        assert_eq!(rows[0].phase, None);
    }

    fn result_of(status: &str) -> facts::event::RunResult {
        serde_json::from_value(serde_json::json!({
            "event": "result", "t": 0.0, "status": status, "params": 0, "peaks": {}, "peak_bytes": 3u64 << 29,
            "wall_s": 0.0
        }))
        .expect("a result")
    }

    /// Right after `resume`: the new attempt runs, its worker has not
    /// started yet; the cancelled run before it is not this row's result.
    #[test]
    fn a_resumed_configs_row_shows_its_new_attempt_not_the_old_result() {
        let sweep = demo();
        let c = &sweep.configs[0];
        let old = attempt(SlurmState::Cancelled, None)
            .with_worker(crate::collect::WorkerOutcome::Result(facts::event::RunStatus::Cancelled));
        let new = attempt(SlurmState::Running, None).with_worker(crate::collect::WorkerOutcome::NotStarted);
        let r = ConfigRecord::fixture(&c.hash, &c.name)
            .with_verdict(Some(crate::precheck::VerdictKind::Fits), Some(4.0))
            .with_attempt(old)
            .with_attempt(new)
            .with_result(Some(result_of("cancelled")));
        let rows = rows(&sweep, &BTreeMap::from([(c.hash.clone(), r)]));
        assert_eq!((rows[0].state.as_str(), rows[0].attempts), ("RUNNING", 2));
        assert_eq!(rows[0].result, None, "{:?}", rows[0]);
        assert_eq!(rows[0].peak_gib, None, "{:?}", rows[0]);
    }

    /// A failed run measured nothing: its row reads `failed`, no `0.0000G`,
    /// and the table says why below.
    #[test]
    fn a_failed_run_shows_its_cause_and_no_figure() {
        let sweep = demo();
        let c = &sweep.configs[0];
        let a = attempt(SlurmState::Failed, None).with_worker(crate::collect::WorkerOutcome::Result(RunStatus::Failed));
        let mut failed = result_of("failed");
        failed.peak_bytes = 0;
        failed.message = Some("replay: no record of this config".into());
        let r = ConfigRecord::fixture(&c.hash, &c.name)
            .with_verdict(Some(crate::precheck::VerdictKind::Fits), Some(4.0))
            .with_attempt(a)
            .with_result(Some(failed));
        let rows = rows(&sweep, &BTreeMap::from([(c.hash.clone(), r)]));
        assert_eq!((rows[0].result.as_deref(), rows[0].peak_gib), (Some("failed"), None), "{:?}", rows[0]);
        let report = StatusReport { rows, poll: PollSummary::default(), settled: true, interrupted: false };
        let table = report.table();
        let line = table.lines().nth(1).expect("row");
        assert!(line.trim_end().ends_with(" failed") && !line.contains("0.0000G"), "{table}");
        assert!(table.contains(&format!("why {} failed:\n  replay: no record of this config\n", c.name)), "{table}");
    }

    /// An OOM without a figure (a replayed record that reports none) reads
    /// `oom`, not `oom 0.0000G`; one with a figure keeps it.
    #[test]
    fn an_oom_without_a_figure_shows_none() {
        let sweep = demo();
        let c = &sweep.configs[0];
        let row = |peak_bytes: u64| {
            let a =
                attempt(SlurmState::Failed, None).with_worker(crate::collect::WorkerOutcome::Result(RunStatus::Oom));
            let mut oom = result_of("oom");
            oom.peak_bytes = peak_bytes;
            let r = ConfigRecord::fixture(&c.hash, &c.name)
                .with_verdict(Some(crate::precheck::VerdictKind::Risky), Some(68.0))
                .with_attempt(a)
                .with_result(Some(oom));
            let rows = rows(&sweep, &BTreeMap::from([(c.hash.clone(), r)]));
            let report = StatusReport { rows, poll: PollSummary::default(), settled: true, interrupted: false };
            report.table().lines().nth(1).expect("row").trim_end().to_string()
        };
        let none = row(0);
        assert!(none.ends_with(" oom") && !none.contains("0.0000G"), "{none}");
        assert!(row(3 << 30).ends_with(" oom 3.0G"), "{}", row(3 << 30));
    }

    /// The worker wrote `ok`; SLURM calls the task FAILED (another config of
    /// the task failed after it): the row reads the worker's word.
    #[test]
    fn a_config_the_worker_ended_ok_does_not_read_failed() {
        let sweep = demo();
        let c = &sweep.configs[0];
        let a = attempt(SlurmState::Failed, None)
            .with_worker(crate::collect::WorkerOutcome::Result(facts::event::RunStatus::Ok));
        let r = ConfigRecord::fixture(&c.hash, &c.name)
            .with_verdict(Some(crate::precheck::VerdictKind::Fits), Some(4.0))
            .with_attempt(a)
            .with_result(Some(result_of("ok")));
        let rows = rows(&sweep, &BTreeMap::from([(c.hash.clone(), r)]));
        assert_eq!(rows[0].result.as_deref(), Some("ok"));
        let report = StatusReport { rows, poll: PollSummary::default(), settled: true, interrupted: false };
        let table = report.table();
        assert!(!table.contains("FAILED ") || table.contains("SLURM calls its task FAILED"), "{table}");
        let line = table.lines().nth(1).expect("row");
        assert!(!line.contains("FAILED") && line.contains(" ok "), "{table}");
        assert!(table.contains("note: ") && table.contains("SLURM calls its task FAILED"), "{table}");
    }

    /// After an edit, the stored sweep holds the config's new version and
    /// the earlier one under one name: their rows must not read alike.
    #[test]
    fn an_edited_configs_earlier_version_is_named_so() {
        let mut sweep = demo();
        let mut earlier = sweep.configs[0].clone();
        earlier.hash.0 = "0123456789ab".into();
        sweep.configs.push(earlier.clone());
        let records: BTreeMap<ConfigHash, ConfigRecord> = [&sweep.configs[0], &earlier]
            .into_iter()
            .map(|c| (c.hash.clone(), ConfigRecord::fixture(&c.hash, &c.name)))
            .collect();
        let rows = rows(&sweep, &records);
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        let first = sweep.configs[0].name.clone();
        assert_eq!(names, [first.clone(), format!("{first} (earlier version)")]);
    }

    #[test]
    fn a_file_never_submitted_lists_every_config_unsubmitted() {
        let sweep = demo();
        let r = unsubmitted(&sweep, std::path::Path::new("/nonexistent"));
        assert_eq!(r.rows.len(), sweep.configs.len());
        assert!(r.rows.iter().all(|x| x.state == "-" && !x.verdict.is_empty()));
    }
}
