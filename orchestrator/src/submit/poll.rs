//! One poll: one `squeue` and one `sacct` for the whole sweep, applied to
//! the records, then what the workers wrote pulled into the state, tolerant
//! of a lagging shared filesystem.
//!
//! Each poll reads, for the latest attempt of each config that runs, just
//! changed state, or ended without a visible result, only the bytes of its
//! `events.jsonl` past the attempt's offset (one poll costs O(running + newly
//! ended) small reads, not O(all events)). The new complete lines are parsed
//! by the one event parser ([`crate::collect`]), folded into the attempt
//! (live phase and peak, the worker's outcome, the result), appended to the
//! local copy, and a new measurement is appended to `measurements.jsonl`.
//!
//! A job that ended FAILED, OUT_OF_MEMORY or COMPLETED without a visible
//! result is read again on later polls for the grace period
//! ([`super::Options::result_grace`], [`result_grace_s`]) before `resume`
//! classifies it: on NFS or Lustre the worker's last line may reach the login
//! node seconds after SLURM says the job ended, and a measured `oom` must
//! never be retried.

use facts::event::RunResult;
use facts::run::ConfigHash;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

use super::{blocking, CommandError, Options, Target};
use crate::cluster::TransportKind;
use crate::collect::{complete_lines, parse_events, to_record, WorkerOutcome};
use crate::fsio;
use crate::slurm::{Activity, JobId, SlurmState};
use crate::state::intent::IntentState;
use crate::state::{Attempt, Change, EventsRead, StateDir};
use crate::sweep::Sweep;
use crate::transport::Poll;

/// Applies one poll to the records; returns the configs whose state changed.
/// Tasks a complete poll does not list are timed in `missing.json` (see
/// [`crate::state::Attempt::gone`]).
pub(crate) fn apply(st: &mut StateDir, poll: &Poll) -> Result<Vec<ConfigHash>, CommandError> {
    let now = fsio::now();
    let mut missing = st.missing()?;
    let missing_before = missing.clone();
    // One observation per array task (a task of several configs is one line).
    type Seen = (SlurmState, Option<String>, Option<JobId>);
    let mut seen: BTreeMap<(String, u32), Seen> = BTreeMap::new();
    let mut configs: BTreeMap<(String, u32), Vec<ConfigHash>> = BTreeMap::new();
    for r in st.records().values() {
        for a in r.attempts().iter().filter(|a| !a.abandoned()) {
            let Some(array) = a.array_job_id() else { continue };
            let key = (a.submission().to_string(), a.task_id());
            configs.entry(key.clone()).or_default().push(r.hash().clone());
            if let Some(o) = poll.tasks.get(&(array.clone(), a.task_id())) {
                missing.remove(&a.key());
                if a.would_observe(&o.state, o.job_id.as_ref()) {
                    seen.insert(key, (o.state.clone(), o.detail.clone(), o.job_id.clone()));
                }
            } else if poll.complete() && a.is_live() {
                let since = *missing.entry(a.key()).or_insert(now);
                if let Some((state, detail)) = a.gone(since, now) {
                    missing.remove(&a.key());
                    seen.insert(key, (state, Some(detail), None));
                }
            }
        }
    }
    let mut changed = Vec::new();
    for ((submission, task), (state, detail, job_id)) in seen {
        let configs = configs.remove(&(submission.clone(), task)).unwrap_or_default();
        changed.extend(st.apply(Change::Observed { submission, task, configs, state, detail, job_id })?);
    }
    if missing != missing_before {
        st.save_missing(&missing)?;
    }
    Ok(changed)
}

/// One poll (one squeue + one sacct for the whole sweep), applied; then the
/// worker's event files of configs that ran are pulled. `settle` (resume) also
/// re-reads the events of ended attempts whose worker result is not known yet,
/// since the retry decision depends on it.
pub(crate) async fn update(
    st: &mut StateDir,
    target: &Target,
    sweep: &Sweep,
    settle: bool,
    grace_s: f64,
) -> Result<PollSummary, CommandError> {
    let subs = st.load_submissions()?;
    let names: Vec<String> =
        subs.iter().filter(|s| s.state() != IntentState::Abandoned).map(|s| s.job_name.clone()).collect();
    let since = subs.iter().map(|s| s.intended_at).fold(f64::INFINITY, f64::min);
    let since = if since.is_finite() { since } else { fsio::now() };
    let poll = blocking(&target.transport, move |t| t.poll(&names, since)).await?;
    let changed = apply(st, &poll)?;
    let got = pull_events(st, target, sweep, &changed, settle, grace_s).await;
    pull_logs(st, target, grace_s).await;
    Ok(PollSummary {
        polled: true,
        local: target.config.transport == TransportKind::Local,
        replay: target.config.transport == TransportKind::Replay,
        commands: poll.commands,
        errors: poll.errors,
        changed: changed.len(),
        events_files: got.files,
        events_bytes: got.bytes,
    })
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct PollSummary {
    /// Whether a poll happened (not for a sweep never submitted).
    pub polled: bool,
    /// The built-in `local` cluster (processes on this machine, no SLURM).
    pub local: bool,
    /// A `replay` cluster (recorded measurements answer, nothing runs).
    pub replay: bool,
    /// Scheduler commands the poll ran (2 for SLURM: squeue + sacct).
    pub commands: u32,
    pub errors: Vec<String>,
    pub changed: usize,
    /// Event files read this poll, and the bytes read from them.
    pub events_files: u32,
    pub events_bytes: u64,
}

/// Seconds an ended job's missing result is awaited on `target`: the
/// `--result-grace` for a cluster whose files reach this machine through a
/// shared filesystem or SFTP, none for `local` processes writing this
/// machine's disk (nothing can arrive late there).
pub(crate) fn result_grace_s(opts: &Options, target: &Target) -> f64 {
    match target.config.transport {
        TransportKind::Local => 0.0,
        _ => opts.result_grace.as_secs_f64(),
    }
}

/// What one collection pass read.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Collected {
    pub files: u32,
    pub bytes: u64,
}

/// When SLURM's end of this attempt was first seen (the grace starts there).
fn ended_at(a: &Attempt) -> Option<f64> {
    a.history().iter().rev().find(|h| h.state.is_ended()).map(|h| h.t)
}

/// Whether an ended attempt's missing result may still arrive: the states a
/// worker that wrote its result ends in, within `grace_s` of the end; and a
/// cancelled or timed-out one whose worker started (in a task of several
/// configs, its result may have been written before the task was stopped).
pub(crate) fn awaiting_result(a: &Attempt, grace_s: f64, now: f64) -> bool {
    let Some(state) = a.state() else { return false };
    let stopped_after_start =
        matches!(state, SlurmState::Cancelled | SlurmState::Timeout) && a.worker() == WorkerOutcome::NoResult;
    (matches!(state, SlurmState::Failed | SlurmState::OutOfMemory | SlurmState::Completed) || stopped_after_start)
        && !matches!(a.worker(), WorkerOutcome::Result(_) | WorkerOutcome::SegmentEnded)
        && !a.exec_failed()
        && ended_at(a).is_some_and(|t| now - t < grace_s)
}

fn wants_read(a: &Attempt, changed: bool, settle: bool, grace_s: f64, now: f64) -> bool {
    let activity = a.state().map(SlurmState::activity);
    // A queued task's job id is its array's (squeue, sacct): its worker's
    // `start` (with the task's own id) could not be told apart. A task that
    // started between polls is read at the next one, under its own id.
    // A chain's task requeued after a segment keeps the id it ran under:
    // its segment's end is read while it waits for the next.
    let requeued = a.chain().is_some() && a.job_id().is_some();
    if matches!(activity, None | Some(Activity::Queued)) && !requeued {
        return false;
    }
    let no_result = !matches!(a.worker(), WorkerOutcome::Result(_));
    activity == Some(Activity::Running)
        || changed
        || awaiting_result(a, grace_s, now)
        || (settle && activity == Some(Activity::Ended) && a.job_id().is_some() && no_result)
}

/// Reads the new events of the configs that need it (see the module doc).
/// Failures only warn: the job states are what a poll must not lose.
pub(crate) async fn pull_events(
    st: &mut StateDir,
    target: &Target,
    sweep: &Sweep,
    changed: &[ConfigHash],
    settle: bool,
    grace_s: f64,
) -> Collected {
    let mut got = Collected::default();
    let Ok(remote_state) = blocking(&target.transport, |t| t.files().remote_state_root()).await else { return got };
    let configs: BTreeMap<&str, &facts::RunConfig> =
        sweep.configs.iter().map(|c| (c.hash.as_str(), &c.config)).collect();
    let now = fsio::now();
    let changed: BTreeSet<&ConfigHash> = changed.iter().collect();
    let due: Vec<ConfigHash> = st
        .records()
        .values()
        .filter(|r| {
            r.latest().is_some_and(|a| {
                a.array_job_id().is_some() && wants_read(a, changed.contains(r.hash()), settle, grace_s, now)
            })
        })
        .map(|r| r.hash().clone())
        .collect();
    for hash in due {
        let Some(cfg) = configs.get(hash.as_str()) else { continue };
        let Some((rel, job_id, read)) = events_to_read(st, &hash) else { continue };
        let remote = format!("{remote_state}/{}/{rel}", st.experiment());
        let offset = read.offset;
        let data = match blocking(&target.transport, {
            let remote = remote.clone();
            move |t| t.files().read_from(&remote, offset)
        })
        .await
        {
            Ok(Some(d)) => d,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!("cannot read {remote}: {e}");
                continue;
            }
        };
        got.files += 1;
        got.bytes += data.len() as u64;
        let (events, consumed, _) = complete_lines(&data);
        let mut after = read.clone();
        let used = after.fold(job_id.as_ref(), events).unwrap_or(consumed);
        after.offset = offset + used as u64;
        if used > 0 {
            if let Err(e) = st.keep_events(&rel, &remote, offset, &data[..used]) {
                tracing::warn!("{e}");
            }
        }
        let new_result = after.result.is_some() && after.result != read.result;
        if let Err(e) = st.apply(Change::Events { hash: hash.clone(), read: after }) {
            tracing::warn!("{e}");
        }
        if new_result {
            if let Err(e) = append_measurement(st, cfg, &rel) {
                tracing::warn!("{e}");
            }
        }
    }
    got
}

/// Where the latest attempt of config `hash` reads its events (relative to
/// the experiment's state directory), the SLURM job it ran as, and what it
/// read so far: a new attempt reads on from where the one before it (in the
/// same run directory) stopped. `None`: a run directory that is no safe path
/// (the worker cannot have written it either).
fn events_to_read(st: &StateDir, hash: &str) -> Option<(String, Option<JobId>, EventsRead)> {
    let r = st.record(hash)?;
    let latest = r.latest()?;
    let rel = r.events_rel(latest)?;
    let prev = r.attempts().iter().filter(|a| !a.abandoned()).rev().nth(1);
    let prev_offset = prev.filter(|a| a.run_dir() == latest.run_dir()).map_or(0, Attempt::events_offset);
    let mut read = r.events_read();
    read.offset = read.offset.max(prev_offset);
    Some((rel, latest.job_id().cloned(), read))
}

/// Lines of a job log kept as its cause of failure.
const LOG_TAIL_LINES: usize = 5;

/// Reads, once, the log tail of each latest attempt that ended without a
/// result from the worker and can get none any more (its grace is over, or
/// `exec` of the worker failed): what `status`, `--json` and the report show
/// as its cause. Returns how many were read.
pub(crate) async fn pull_logs(st: &mut StateDir, target: &Target, grace_s: f64) -> u32 {
    let Ok(remote_state) = blocking(&target.transport, |t| t.files().remote_state_root()).await else { return 0 };
    let now = fsio::now();
    let due: Vec<(ConfigHash, String, String)> = st
        .records()
        .values()
        .filter_map(|r| {
            let a = r.latest()?;
            let ended_without_result = a.state().is_some_and(|s| s.is_ended() && *s != SlurmState::Cancelled)
                && !matches!(a.worker(), WorkerOutcome::Result(_));
            (ended_without_result && a.log_tail().is_none() && !awaiting_result(a, grace_s, now))
                .then(|| (r.hash().clone(), r.name().to_string(), a.log_rel()))
        })
        .collect();
    let mut read = 0;
    for (hash, name, log) in due {
        let remote = format!("{remote_state}/{}/{log}", st.experiment());
        let bytes = match blocking(&target.transport, move |t| t.files().get_file(&remote)).await {
            Ok(b) => b.unwrap_or_default(),
            Err(e) => {
                tracing::warn!("cannot read the log of {name}: {e}");
                continue;
            }
        };
        read += 1;
        if let Err(e) = st.apply(Change::LogTail { hash, tail: log_tail(&bytes) }) {
            tracing::warn!("{e}");
        }
    }
    read
}

/// The last [`LOG_TAIL_LINES`] non-empty lines of a log ("" when it has none).
pub fn log_tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().map(str::trim_end).filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// Appends the measurement of a finished run to `measurements.jsonl` (read
/// from this one config's local events: O(one file) per new result).
fn append_measurement(st: &StateDir, cfg: &facts::RunConfig, rel: &str) -> Result<(), crate::state::StateError> {
    let (bytes, path) = st.view().events(rel);
    let bytes = bytes.map_err(fsio::io(&path))?;
    let Some(rec) = to_record(cfg, &parse_events(&bytes)) else { return Ok(()) };
    st.append_measurement(&rec)
}

/// What an events file says about the attempt that ran as SLURM job
/// `job_id`: whether its worker wrote `start`, and its `result` event (the
/// same fold a poll uses).
pub fn attempt_events(text: &str, job_id: Option<&str>) -> (bool, Option<RunResult>) {
    let mut read = EventsRead::default();
    let (events, _, _) = complete_lines(text.as_bytes());
    read.fold(job_id.map(JobId::from).as_ref(), events);
    (!read.worker.is_not_started(), read.result)
}

/// The `result` event of the last attempt in an events file, whichever job ran it.
pub fn last_result(text: &str) -> Option<RunResult> {
    crate::collect::last_result(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(job: Option<&str>, state: SlurmState) -> Attempt {
        Attempt::intended("s", 0, 0.0).in_array("1").ran_as(job).in_state(Some(state))
    }

    #[test]
    fn a_queued_task_is_not_read_its_job_id_is_the_arrays() {
        let q = attempt(Some("303"), SlurmState::Pending);
        assert!(!wants_read(&q, true, true, 120.0, 0.0), "pending: the id is the array's, not the task's");
        let r = attempt(Some("305"), SlurmState::Running);
        assert!(wants_read(&r, false, false, 120.0, 0.0));
    }

    #[test]
    fn an_ended_job_without_a_result_is_awaited_for_the_grace_only() {
        let failed = attempt(Some("11"), SlurmState::Failed).seen(SlurmState::Failed, 100.0, None);
        let a = failed.clone().with_worker(WorkerOutcome::NoResult);
        assert!(awaiting_result(&a, 120.0, 150.0));
        assert!(!awaiting_result(&a, 120.0, 221.0), "grace over: classified (killed)");
        let a = failed.with_worker(WorkerOutcome::from_word(Some("oom")));
        assert!(!awaiting_result(&a, 120.0, 150.0), "a result is final");
        let c = attempt(Some("11"), SlurmState::Cancelled).seen(SlurmState::Cancelled, 100.0, None);
        assert!(!awaiting_result(&c, 120.0, 150.0), "a cancelled task needs no result");
        // ... but one whose worker started may have written its result just before (a task of several configs).
        let c = c.with_worker(WorkerOutcome::NoResult);
        assert!(awaiting_result(&c, 120.0, 150.0));
        assert!(!awaiting_result(&c, 120.0, 221.0));
        // `exec` of the worker failed (exit 127: not found): no result can come.
        let e = attempt(Some("11"), SlurmState::Failed).seen(SlurmState::Failed, 100.0, Some("127:0"));
        assert!(e.exec_failed());
        assert!(!awaiting_result(&e, 120.0, 150.0), "the worker never ran");
    }

    const START_11: &str = "{\"event\":\"start\",\"t\":1.0,\"config\":\"n\",\"config_hash\":\"0\",\"env\":{\"host\":\"h\",\"device\":\"cpu\",\"backend\":\"flex\",\"dtype\":\"f32\",\"grad_ckpt\":false,\"slurm_job_id\":\"11\"}}\n";
    const START_12: &str = "{\"event\":\"start\",\"t\":5.0,\"config\":\"n\",\"config_hash\":\"0\",\"env\":{\"host\":\"h\",\"device\":\"cpu\",\"backend\":\"flex\",\"dtype\":\"f32\",\"grad_ckpt\":false,\"slurm_job_id\":\"12\"}}\n";
    const BEAT: &str =
        "{\"event\":\"heartbeat\",\"t\":2.0,\"phase\":\"fwd\",\"current_bytes\":10,\"peak_bytes\":2048}\n";
    const OOM: &str = "{\"event\":\"result\",\"t\":3.0,\"status\":\"oom\",\"params\":1,\"peaks\":{},\"peak_bytes\":4096,\"phase\":\"bwd\",\"wall_s\":2.0}\n";

    #[test]
    fn a_log_tail_is_its_last_non_empty_lines() {
        let log = b"line 1\nline 2\n\nline 3\nline 4\nline 5\n/w/job.sbatch: line 40: exec: worker: not found\n\n";
        assert_eq!(log_tail(log), "line 2\nline 3\nline 4\nline 5\n/w/job.sbatch: line 40: exec: worker: not found");
        assert_eq!(log_tail(b""), "");
    }

    #[test]
    fn events_are_matched_to_the_attempt_by_slurm_job_id() {
        let text = format!("{START_11}{OOM}{START_12}{BEAT}{{\"event\":\"resu");
        let (started, result) = attempt_events(&text, Some("11"));
        assert!(started);
        assert_eq!(result.map(|v| v.status.name()), Some("oom"));
        assert_eq!(attempt_events(&text, Some("12")), (true, None), "killed: started, no result");
        assert_eq!(attempt_events(&text, Some("13")), (false, None), "never started");
    }
}
