//! The state directory's record of one config (`configs/<hash>.json`) and of
//! each of its attempts.

use serde::{Deserialize, Serialize};

use super::events_read::{ChainRead, EventsRead, Live};
use crate::precheck::VerdictKind;
use facts::event::{RunResult, RunStatus};

use crate::collect::WorkerOutcome;
use crate::slurm::{Activity, JobId, SlurmState};
use facts::run::ConfigHash;

/// A state change as observed by a poll.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateChange {
    pub t: f64,
    pub state: SlurmState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// One submission of one config: an array task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub(super) submission: String,
    pub(super) task_id: u32,
    /// The array's job id; `None` while only the intent is recorded.
    #[serde(default)]
    pub(super) array_job_id: Option<JobId>,
    /// The task's own job id (SLURM gives each array task one when it starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) job_id: Option<JobId>,
    pub(super) intended_at: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) submitted_at: Option<f64>,
    /// The latest state seen; `None` before the first poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) state: Option<SlurmState>,
    #[serde(default)]
    pub(super) history: Vec<StateChange>,
    /// The sbatch never happened (settled by `resume`: SLURM has no such job).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) abandoned: bool,
    /// What this attempt's worker wrote in its events (matched by SLURM job
    /// id): `started` once its `start` line is seen, then its result status
    /// (`ok`, `oom`, `failed`, `cancelled`). Absent: not seen (yet).
    #[serde(default, skip_serializing_if = "WorkerOutcome::is_not_started")]
    pub(super) worker: WorkerOutcome,
    /// Bytes of `events.jsonl` read while this attempt was the latest (the
    /// next read starts here: one poll reads only what is new).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) events_offset: u64,
    /// The last `start` line read was this attempt's own (its lines follow).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) events_mine: bool,
    /// The worker's last reported phase and peak, while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) live: Option<Live>,
    /// A chained run's segments, as its events said (absent: not a chain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) chain: Option<ChainRead>,
    /// How the run directory this attempt's worker writes is named (absent:
    /// by name, as every attempt recorded before runs were kept by content).
    #[serde(default, skip_serializing_if = "RunDirKey::is_name")]
    pub(super) run_dir: RunDirKey,
    /// The hash its run directory is named by where that is not the
    /// record's: an attempt made before one model had one hash, whose worker
    /// wrote `runs/<the hash as the config was written>/` ([`super::rehash`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) run_hash: Option<ConfigHash>,
    /// The last lines of the job's own log (`<task>.out`), read once when it
    /// ended without a result from the worker: why it failed before or
    /// outside the worker (`exec: worker: not found`, a module load error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) log_tail: Option<String>,
}

/// How a run directory under `runs/` is named. Runs are kept by what ran
/// (`runs/<hash>/`); attempts recorded before that wrote `runs/<name>/`,
/// and are still read there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunDirKey {
    /// `runs/<config name>/` (state directories written before runs were kept by content).
    #[default]
    Name,
    /// `runs/<config hash>/`.
    Hash,
}

impl RunDirKey {
    fn is_name(&self) -> bool {
        *self == RunDirKey::Name
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How long a submitted task may be absent from both squeue and sacct before
/// it counts as gone (slurmdbd may lag a few seconds behind the controller).
pub const MISSING_GRACE_S: f64 = 10.0;

impl Attempt {
    /// The intent to submit `task_id` of `submission`, before any sbatch:
    /// what every attempt starts as (the protocol fills in the rest).
    pub fn intended(submission: impl Into<String>, task_id: u32, intended_at: f64) -> Attempt {
        Attempt {
            submission: submission.into(),
            task_id,
            array_job_id: None,
            job_id: None,
            intended_at,
            submitted_at: None,
            state: None,
            history: vec![],
            abandoned: false,
            worker: WorkerOutcome::NotStarted,
            events_offset: 0,
            events_mine: false,
            chain: None,
            live: None,
            run_dir: RunDirKey::Hash,
            run_hash: None,
            log_tail: None,
        }
    }

    /// The job's log, relative to the experiment's state directory (where
    /// the built-in template writes it: `#SBATCH --output`).
    pub fn log_rel(&self) -> String {
        format!("submissions/{}/{}.out", self.submission, self.task_id)
    }

    /// The job's exit code says its script could not start the worker
    /// (`exec` of a missing or non-executable file: 127, 126): no result can
    /// come, however late the filesystem shows it.
    pub fn exec_failed(&self) -> bool {
        let code = self.history.iter().rev().find_map(|h| h.detail.as_deref());
        code.and_then(|c| c.split(':').next()).is_some_and(|rc| rc == "127" || rc == "126")
    }

    /// Whether this attempt still occupies the config (queued, running, or an
    /// unsettled intent): then nothing may submit it again.
    pub fn is_live(&self) -> bool {
        if self.abandoned {
            return false;
        }
        match &self.state {
            None => true,
            Some(s) => s.activity() != Activity::Ended,
        }
    }

    /// A complete poll (squeue and sacct both answered) did not list this task
    /// since `since` (kept in `missing.json`). A pending array task cancelled
    /// before it ever started leaves the queue without any accounting record
    /// (SLURM 22.05), so once the absence outlasts [`MISSING_GRACE_S`] the
    /// task counts as CANCELLED: returns that observation.
    pub fn gone(&self, since: f64, now: f64) -> Option<(SlurmState, String)> {
        if !self.is_live() || self.array_job_id.is_none() || now - since < MISSING_GRACE_S {
            return None;
        }
        Some((SlurmState::Cancelled, "left the queue without running; SLURM keeps no record of it".into()))
    }

    /// The key of this attempt in `missing.json`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.submission, self.task_id)
    }

    /// Whether a poll's view of this task (`state`, its own job id) tells
    /// anything new.
    pub fn would_observe(&self, state: &SlurmState, job_id: Option<&JobId>) -> bool {
        self.state.as_ref() != Some(state) || job_id.is_some_and(|j| self.job_id.as_ref() != Some(j))
    }

    /// Records `state` (seen at `t`) if it differs from the latest, and the
    /// task's job id; returns whether either changed.
    pub(super) fn observe(&mut self, state: SlurmState, detail: Option<String>, job_id: Option<JobId>, t: f64) -> bool {
        let changed = self.would_observe(&state, job_id.as_ref());
        if job_id.is_some() {
            self.job_id = job_id;
        }
        if self.state.as_ref() != Some(&state) {
            self.history.push(StateChange { t, state: state.clone(), detail });
            self.state = Some(state);
        }
        changed
    }

    /// What this attempt's events said so far (with the config's result).
    pub fn events_read(&self, result: Option<&RunResult>) -> EventsRead {
        EventsRead {
            worker: self.worker,
            offset: self.events_offset,
            mine: self.events_mine,
            live: self.live.clone(),
            result: result.cloned(),
            chain: self.chain.clone(),
        }
    }

    /// A chained run's segments so far (absent: not a chain).
    pub fn chain(&self) -> Option<&ChainRead> {
        self.chain.as_ref()
    }

    pub fn submission(&self) -> &str {
        &self.submission
    }
    pub fn task_id(&self) -> u32 {
        self.task_id
    }
    /// The array's job id; `None` while only the intent is recorded.
    pub fn array_job_id(&self) -> Option<&JobId> {
        self.array_job_id.as_ref()
    }
    /// The task's own job id (SLURM gives each array task one when it starts).
    pub fn job_id(&self) -> Option<&JobId> {
        self.job_id.as_ref()
    }
    pub fn submitted_at(&self) -> Option<f64> {
        self.submitted_at
    }
    /// The latest SLURM state seen; `None` before the first poll.
    pub fn state(&self) -> Option<&SlurmState> {
        self.state.as_ref()
    }
    /// Every SLURM state seen, in order.
    pub fn history(&self) -> &[StateChange] {
        &self.history
    }
    /// The sbatch never happened (settled by `resume`).
    pub fn abandoned(&self) -> bool {
        self.abandoned
    }
    /// What this attempt's worker wrote in its events.
    pub fn worker(&self) -> WorkerOutcome {
        self.worker
    }
    pub fn events_offset(&self) -> u64 {
        self.events_offset
    }
    /// The worker's last reported phase and peak, while it runs.
    pub fn live(&self) -> Option<&Live> {
        self.live.as_ref()
    }
    pub fn run_dir(&self) -> RunDirKey {
        self.run_dir
    }
    /// The last lines of the job's log, read when it ended without a result.
    pub fn log_tail(&self) -> Option<&str> {
        self.log_tail.as_deref()
    }
}

/// A config as the experiment file and the precheck see it ([`Change::Config`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Seen {
    pub hash: ConfigHash,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<VerdictKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_gib: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<String>,
}

/// The state directory's record of one config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigRecord {
    pub(super) hash: ConfigHash,
    pub(super) name: String,
    /// The precheck's verdict (`fits`, `risky`, `oom`, `invalid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) verdict: Option<VerdictKind>,
    /// The predicted peak: made before the config first ran, and kept after
    /// (a run is judged by the prediction made without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) predicted_gib: Option<f64>,
    /// The calibration that made `predicted_gib` (`shipped burn-flex/fp32`,
    /// `local burn-flex/fp32 on cpu, 6 runs`); absent in records written before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) calibration: Option<String>,
    #[serde(default)]
    pub(super) attempts: Vec<Attempt>,
    /// The worker's final `result` event of the latest attempt (its line's JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) result: Option<RunResult>,
}

impl ConfigRecord {
    pub fn latest(&self) -> Option<&Attempt> {
        self.attempts.iter().rev().find(|a| !a.abandoned)
    }
    /// Where `attempt`'s worker writes its events, relative to the state
    /// directory of the experiment (`None`: a name that cannot be a path).
    pub fn events_rel(&self, attempt: &Attempt) -> Option<String> {
        match attempt.run_dir {
            RunDirKey::Hash => Some(facts::run::events_rel(attempt.run_hash.as_ref().unwrap_or(&self.hash))),
            RunDirKey::Name => {
                crate::fsio::safe_component(&self.name).then(|| format!("runs/{}/events.jsonl", self.name))
            }
        }
    }
    /// Why the latest attempt failed, when it did: the worker's message, or,
    /// for a job that failed before or outside the worker, its exit code and
    /// its log's last line, then (further lines) the log's last lines.
    pub fn failure_cause(&self) -> Option<String> {
        match &self.result {
            Some(res) if res.status == RunStatus::Failed => return res.message.clone(),
            Some(_) => return None,
            None => {}
        }
        let a = self.latest()?;
        let tail = a.log_tail.as_deref()?;
        let code = a.history.iter().rev().find_map(|h| h.detail.as_deref()).unwrap_or("?");
        // The first line says it all (reports show only it); then the log's end.
        let log = a.log_rel();
        // A task of several configs logs each one's end (`<name>: Ok, …`):
        // another config's line is no cause of this one's.
        let others = |l: &&str| {
            l.split_once(": ").is_some_and(|(name, rest)| {
                name != self.name && ["Ok,", "Oom,", "Failed,", "Cancelled,"].iter().any(|s| rest.starts_with(s))
            })
        };
        Some(match (tail.lines().rev().find(|l| !others(l)), tail.lines().last()) {
            (_, None) => format!("exit code {code} and no result from the worker; its log {log} is empty or missing"),
            (None, Some(_)) => format!(
                "exit code {code} and no result from the worker for this config; the end of its task's log {log}:\n{tail}"
            ),
            (Some(last), _) if last == tail => {
                format!("{last} (exit code {code}, no result from the worker)\nlog: {log}")
            }
            (Some(last), _) => {
                format!("{last} (exit code {code}, no result from the worker)\nthe end of {log}:\n{tail}")
            }
        })
    }
    /// Some attempt still occupies the config (queued, running, or an
    /// unsettled intent): nothing may submit it again.
    pub fn occupied(&self) -> bool {
        self.attempts.iter().any(Attempt::is_live)
    }
    /// `oom` when the worker measured an out-of-memory.
    pub fn result_status(&self) -> Option<RunStatus> {
        self.result.as_ref().map(|r| r.status)
    }

    /// What the events of the latest attempt said so far (the default
    /// when nothing was submitted).
    pub fn events_read(&self) -> EventsRead {
        self.latest().map(|a| a.events_read(self.result.as_ref())).unwrap_or_default()
    }

    pub fn hash(&self) -> &ConfigHash {
        &self.hash
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The precheck's verdict.
    pub fn verdict(&self) -> Option<VerdictKind> {
        self.verdict
    }
    /// The predicted peak, made before the config first ran.
    pub fn predicted_gib(&self) -> Option<f64> {
        self.predicted_gib
    }
    /// The calibration that made [`ConfigRecord::predicted_gib`].
    pub fn calibration(&self) -> Option<&str> {
        self.calibration.as_deref()
    }
    /// Every attempt, abandoned ones included, oldest first.
    pub fn attempts(&self) -> &[Attempt] {
        &self.attempts
    }
    /// The worker's final `result` event of the latest attempt.
    pub fn result(&self) -> Option<&RunResult> {
        self.result.as_ref()
    }

    /// The attempt that array task `task` of `submission` runs (abandoned ones are not).
    pub(super) fn attempt_mut(&mut self, submission: &str, task: u32) -> Option<&mut Attempt> {
        self.attempts.iter_mut().find(|a| !a.abandoned && a.submission == submission && a.task_id == task)
    }

    /// A config first seen, not yet judged or submitted.
    pub(super) fn new(hash: impl Into<ConfigHash>, name: &str) -> ConfigRecord {
        ConfigRecord {
            hash: hash.into(),
            name: name.to_string(),
            verdict: None,
            predicted_gib: None,
            calibration: None,
            attempts: vec![],
            result: None,
        }
    }

    /// The record as the current file and precheck see it: its name, and,
    /// until it is first submitted, its verdict, prediction and the
    /// calibration that made them. Once submitted, the prediction stays the
    /// one made before the run (a later fit may include the run itself).
    /// Returns whether anything changed.
    pub(super) fn refresh(&mut self, seen: &Seen) -> bool {
        let before = (self.name.clone(), self.verdict, self.predicted_gib, self.calibration.clone());
        self.name.clone_from(&seen.name);
        if !self.attempts.iter().any(|a| !a.abandoned) {
            self.verdict = seen.verdict;
            self.predicted_gib = seen.predicted_gib;
            self.calibration.clone_from(&seen.calibration);
        }
        (self.name.clone(), self.verdict, self.predicted_gib, self.calibration.clone()) != before
    }

    /// Takes what the latest attempt's events said; returns whether anything changed.
    pub(super) fn set_events(&mut self, read: &EventsRead) -> bool {
        let Some(a) = self.attempts.iter_mut().rev().find(|a| !a.abandoned) else { return false };
        if a.events_read(self.result.as_ref()) == *read {
            return false;
        }
        a.worker = read.worker;
        a.events_offset = read.offset;
        a.events_mine = read.mine;
        a.live.clone_from(&read.live);
        a.chain.clone_from(&read.chain);
        self.result.clone_from(&read.result);
        true
    }

    /// Keeps the log's last lines as the latest attempt's; returns whether anything changed.
    pub(super) fn set_log_tail(&mut self, tail: &str) -> bool {
        match self.attempts.iter_mut().rev().find(|a| !a.abandoned) {
            Some(a) if a.log_tail.as_deref() != Some(tail) => {
                a.log_tail = Some(tail.to_string());
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_kept_by_content_and_old_attempts_still_read_by_name() {
        let mut r = ConfigRecord::new("0123456789ab", "unet_2L").with_attempt(Attempt::intended("s001-abcd", 0, 1.0));
        assert_eq!(r.events_rel(&r.attempts[0]).as_deref(), Some("runs/0123456789ab/events.jsonl"));
        // An attempt recorded before runs were kept by content has no `run_dir`: by name.
        let old: Attempt =
            serde_json::from_str(r#"{"submission":"s001-x","task_id":0,"array_job_id":"41","intended_at":1.0}"#)
                .expect("an old attempt");
        assert_eq!(old.run_dir, RunDirKey::Name);
        assert_eq!(r.events_rel(&old).as_deref(), Some("runs/unet_2L/events.jsonl"));
        r.name = "../x".into();
        assert_eq!(r.events_rel(&old), None, "a name that is not a safe path is never read");
    }

    #[test]
    fn a_prediction_is_the_one_made_before_the_run() {
        let seen = |name: &str, gib: f64, calibration: Option<&str>| Seen {
            hash: "0123456789ab".into(),
            name: name.into(),
            verdict: Some(VerdictKind::Fits),
            predicted_gib: Some(gib),
            calibration: calibration.map(str::to_string),
        };
        let mut r = ConfigRecord::new("0123456789ab", "a");
        assert!(r.refresh(&seen("a", 2.0, Some("shipped burn-flex/fp32"))));
        assert!(r.refresh(&seen("a", 2.1, Some("shipped burn-flex/fp32"))), "not run yet: the latest word");
        r.attempts.push(Attempt::intended("s001-abcd", 0, 1.0));
        // A refit that includes the run itself predicts it better: the record keeps the prediction it was judged by.
        assert!(!r.refresh(&seen("a", 2.5, Some("local burn-flex/fp32 on cpu, 6 runs"))));
        assert_eq!((r.predicted_gib, r.calibration.as_deref()), (Some(2.1), Some("shipped burn-flex/fp32")));
        assert!(r.refresh(&seen("b", 2.5, None)), "a rename is taken");
        assert_eq!(r.name, "b");
    }

    #[test]
    fn a_task_gone_from_squeue_and_sacct_counts_as_cancelled_after_the_grace() {
        let mut a = Attempt::intended("s", 2, 0.0).in_array("34").submitted(0.0).in_state(Some(SlurmState::Pending));
        assert_eq!(a.gone(100.0, 105.0), None, "within the grace");
        assert!(a.is_live());
        let (state, detail) = a.gone(100.0, 100.0 + MISSING_GRACE_S).expect("gone");
        assert_eq!(state, SlurmState::Cancelled);
        assert!(a.observe(state, Some(detail), None, 110.0));
        assert!(!a.is_live());
        assert_eq!(a.gone(100.0, 1000.0), None, "an ended attempt stays as it is");
    }

    #[test]
    fn another_configs_line_in_a_shared_task_log_is_not_the_cause() {
        let mut r = ConfigRecord::new("h", "slow").with_attempt(Attempt::intended("s001-x", 0, 0.0));
        r.attempts[0].history.push(StateChange { t: 1.0, state: SlurmState::Failed, detail: Some("0:9".into()) });
        r.attempts[0].log_tail = Some("first: Ok, 34752 params, peak 0.002 GiB".into());
        let cause = r.failure_cause().expect("a cause");
        assert!(cause.starts_with("exit code 0:9 and no result from the worker for this config;"), "{cause}");
        r.attempts[0].log_tail =
            Some("first: Ok, 1 params, peak 0.1 GiB\nslurmstepd: error: *** JOB 9 CANCELLED ***".into());
        let cause = r.failure_cause().expect("a cause");
        assert!(cause.starts_with("slurmstepd: error: *** JOB 9 CANCELLED *** (exit code 0:9"), "{cause}");
        // One config a task: the log's last line, as before.
        r.attempts[0].log_tail = Some("/w/job.sbatch: line 40: exec: worker: not found".into());
        let cause = r.failure_cause().expect("a cause");
        assert!(cause.starts_with("/w/job.sbatch: line 40: exec: worker: not found (exit code 0:9"), "{cause}");
    }

    /// A record as the version before typed records wrote it (its result a
    /// JSON value, keys sorted) reads and writes back as the same JSON.
    #[test]
    fn records_written_before_the_types_read_the_same() {
        let text = r#"{
  "hash": "0123456789ab",
  "name": "4L_tiny_lat4x",
  "verdict": "risky",
  "predicted_gib": 1.5,
  "attempts": [
    {
      "submission": "s001-x",
      "task_id": 0,
      "array_job_id": "41",
      "job_id": "42",
      "intended_at": 1.0,
      "submitted_at": 2.0,
      "state": "FAILED",
      "history": [{"t": 3.0, "state": "FAILED"}],
      "worker": "oom",
      "events_offset": 512,
      "events_mine": true
    },
    {"submission": "s002-y", "task_id": 3, "array_job_id": null, "intended_at": 4.0, "history": [], "worker": "started"}
  ],
  "result": {"event": "result", "message": "allocation refused", "params": 1, "peak_bytes": 4096,
             "peaks": {"bwd": 7, "fwd": 5}, "phase": "bwd", "status": "oom", "t": 3.0, "wall_s": 2.0}
}"#;
        let r: ConfigRecord = serde_json::from_str(text).expect("reads");
        assert_eq!(r.verdict, Some(VerdictKind::Risky));
        assert_eq!(r.attempts[0].worker, WorkerOutcome::Result(RunStatus::Oom));
        assert_eq!(r.attempts[1].worker, WorkerOutcome::NoResult);
        assert_eq!(r.result_status(), Some(RunStatus::Oom));
        let before: serde_json::Value = serde_json::from_str(text).expect("json");
        assert_eq!(serde_json::to_value(&r).expect("writes"), before);
        let not_started: Attempt = serde_json::from_str(r#"{"submission": "s", "task_id": 0, "intended_at": 0.0}"#)
            .expect("an attempt without a worker");
        assert_eq!(not_started.worker, WorkerOutcome::NotStarted);
        assert!(serde_json::to_value(&not_started).expect("writes").get("worker").is_none());
    }
}
