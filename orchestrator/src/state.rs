//! The state directory `state/<experiment>/`: everything the orchestrator knows
//! about a sweep, as plain JSON readable with `jq`, written so that a crash at
//! any instant leaves it consistent.
//!
//! ```text
//! state/<experiment>/
//!   lock                      held (flock) by the one orchestrator working on it
//!   sweep.json                the resolved sweep: experiment settings and every config
//!   configs/<hash>.json       one record per config: verdict, attempts, SLURM state history, result
//!   submissions/<sid>/        one per job array: submission.json, job.sbatch, manifest.json(l)
//!   journal.jsonl             append-only log of intents and outcomes (for humans and audits)
//!   runs/<config>/events.jsonl  the worker's event stream (pulled from the cluster)
//!   render/                   scripts printed by `orchestrator render`
//! ```
//!
//! Crash safety rests on one rule: a submission's intent (`submission.json`
//! with no job id) is on disk, fsynced, *before* `sbatch` runs. A crash after
//! sbatch returns but before the job id is recorded leaves an intent that
//! `resume` settles by asking SLURM for the submission's unique job name.

use fs2::FileExt;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::slurm::{Activity, SlurmState, WorkerOutcome};
use crate::submit::protocol::IntentState;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: not valid state JSON: {source}", path.display())]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("experiment `{experiment}` is locked by another orchestrator ({holder}); wait for it or stop it (lock file {})", path.display())]
    Locked { experiment: String, holder: String, path: PathBuf },
    #[error("experiment name `{0}` cannot name a state directory (use letters, digits, `_`, `-`, `.`)")]
    BadName(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io { path: path.to_path_buf(), source }
}

/// Seconds since the Unix epoch (what every timestamp in the state is).
pub fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Writes `bytes` to `path` so that readers see the old or the new file, never
/// a torn one, even across a power cut: temp file, fsync, rename, fsync dir.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    write_file(path, bytes, 0o644, true)
}

/// [`write_atomic`] with the file's mode set on the temp file, before the
/// rename (an executable is never visible without its `x` bits).
pub fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<(), StateError> {
    write_file(path, bytes, mode, true)
}

/// Temp file and rename without fsync: readers never see a torn file, but a
/// power cut may lose it. For files derived from durable ones (records are
/// repaired from `submission.json`) and for rendered copies.
pub fn write_replace(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    write_file(path, bytes, 0o644, false)
}

fn write_file(path: &Path, bytes: &[u8], mode: u32, durable: bool) -> Result<(), StateError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(io(dir))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    {
        let mut f = File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(bytes).map_err(io(&tmp))?;
        f.set_permissions(fs::Permissions::from_mode(mode)).map_err(io(&tmp))?;
        if durable {
            f.sync_all().map_err(io(&tmp))?;
        }
    }
    fs::rename(&tmp, path).map_err(io(path))?;
    if durable {
        sync_dir(dir)?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), StateError> {
    // Directories can be opened read-only and fsynced on Unix; that makes the rename durable.
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), StateError> {
    let mut bytes =
        serde_json::to_vec_pretty(value).map_err(|source| StateError::Json { path: path.into(), source })?;
    bytes.push(b'\n');
    write_atomic(path, &bytes)
}

pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, StateError> {
    match fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|source| StateError::Json { path: path.into(), source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StateError::Io { path: path.into(), source: e }),
    }
}

/// What the state directory stores about the sweep (`sweep.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredSweep {
    pub cluster: String,
    pub sweep: crate::sweep::Sweep,
}

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
    pub submission: String,
    pub task_id: u32,
    /// The array's job id; `None` while only the intent is recorded.
    #[serde(default)]
    pub array_job_id: Option<String>,
    /// The task's own job id (SLURM gives each array task one when it starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    pub intended_at: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_at: Option<f64>,
    /// The latest state seen; `None` before the first poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<SlurmState>,
    #[serde(default)]
    pub history: Vec<StateChange>,
    /// The sbatch never happened (settled by `resume`: SLURM has no such job).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub abandoned: bool,
    /// What this attempt's worker wrote in its events (matched by SLURM job
    /// id): `started` once its `start` line is seen, then its result status
    /// (`ok`, `oom`, `failed`, `cancelled`). `None`: not seen (yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// Bytes of `events.jsonl` read while this attempt was the latest (the
    /// next read starts here: one poll reads only what is new).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub events_offset: u64,
    /// The last `start` line read was this attempt's own (its lines follow).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub events_mine: bool,
    /// The worker's last reported phase and peak, while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<Live>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Live progress of a running attempt, from its heartbeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Live {
    pub phase: spec::event::Phase,
    pub peak_bytes: u64,
    /// When the worker started (its `start` line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_t: Option<f64>,
    /// Time of the last event.
    pub t: f64,
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
            worker: None,
            events_offset: 0,
            events_mine: false,
            live: None,
        }
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

    /// A complete poll (squeue and sacct both answered) did not list this task.
    /// A pending array task cancelled before it ever started leaves the queue
    /// without any accounting record (SLURM 22.05), so once the absence
    /// outlasts [`MISSING_GRACE_S`] the task is recorded as CANCELLED. Returns
    /// whether the state changed.
    /// `since` is when the absence was first seen (kept in `missing.json`).
    pub fn missing(&mut self, since: f64, now: f64) -> bool {
        if !self.is_live() || self.array_job_id.is_none() || now - since < MISSING_GRACE_S {
            return false;
        }
        self.observe(
            SlurmState::Cancelled,
            Some("left the queue without running; SLURM keeps no record of it".into()),
            None,
        )
    }

    /// The worker's side of this attempt, for [`crate::slurm::RetryPolicy::refusal`].
    pub fn worker_outcome(&self) -> WorkerOutcome {
        use spec::event::RunStatus;
        match self.worker.as_deref() {
            None => WorkerOutcome::NotStarted,
            Some("ok") => WorkerOutcome::Result(RunStatus::Ok),
            Some("oom") => WorkerOutcome::Result(RunStatus::Oom),
            Some("failed") => WorkerOutcome::Result(RunStatus::Failed),
            Some("cancelled") => WorkerOutcome::Result(RunStatus::Cancelled),
            Some(_) => WorkerOutcome::NoResult,
        }
    }

    /// The key of this attempt in `missing.json`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.submission, self.task_id)
    }

    /// Records `state` if it differs from the latest; returns whether it changed.
    pub fn observe(&mut self, state: SlurmState, detail: Option<String>, job_id: Option<String>) -> bool {
        if job_id.is_some() && self.job_id != job_id {
            self.job_id = job_id;
        }
        if self.state.as_ref() == Some(&state) {
            return false;
        }
        self.history.push(StateChange { t: now(), state: state.clone(), detail });
        self.state = Some(state);
        true
    }
}

/// The state directory's record of one config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigRecord {
    pub hash: String,
    pub name: String,
    /// The precheck's verdict name (`fits`, `risky`, `oom`, `invalid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_gib: Option<f64>,
    #[serde(default)]
    pub attempts: Vec<Attempt>,
    /// The worker's final `result` event of the latest attempt, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
}

impl ConfigRecord {
    pub fn latest(&self) -> Option<&Attempt> {
        self.attempts.iter().rev().find(|a| !a.abandoned)
    }
    pub fn live(&self) -> bool {
        self.attempts.iter().any(Attempt::is_live)
    }
    /// `oom` when the worker measured an out-of-memory.
    pub fn result_status(&self) -> Option<&str> {
        self.result.as_ref()?.get("status")?.as_str()
    }
}

/// What `submission.json` says about one job array.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Submission {
    pub id: String,
    /// Unique on the cluster: how `resume` finds the job if its id was never recorded.
    pub job_name: String,
    pub comment: String,
    pub array: String,
    /// Config hash of each task, task id = index.
    pub tasks: Vec<String>,
    pub intended_at: f64,
    #[serde(default)]
    pub array_job_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_at: Option<f64>,
    /// Settled by resume: SLURM never saw it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub abandoned: bool,
    /// The script's path on the cluster.
    pub remote_script: String,
    /// Where the submission protocol has it ([`crate::submit::protocol`]);
    /// `array_job_id` and `abandoned` mirror its final states.
    #[serde(default)]
    pub intent: IntentState,
}

impl Submission {
    /// The protocol state (files written before the protocol had states say
    /// it only through `array_job_id` and `abandoned`).
    pub fn state(&self) -> IntentState {
        match (&self.array_job_id, self.abandoned) {
            (Some(id), _) => IntentState::Submitted { job_id: id.clone() },
            (None, true) => IntentState::Abandoned,
            (None, false) => self.intent.clone(),
        }
    }

    /// Moves to `s`, keeping the mirrored fields in step.
    pub fn set_state(&mut self, s: IntentState) {
        match &s {
            IntentState::Submitted { job_id } => {
                self.array_job_id = Some(job_id.clone());
                self.submitted_at = Some(now());
            }
            IntentState::Abandoned => self.abandoned = true,
            _ => {}
        }
        self.intent = s;
    }
}

/// An open state directory, locked for the lifetime of this value.
pub struct StateDir {
    pub root: PathBuf,
    pub experiment: String,
    _lock: File,
}

/// Whether `name` is usable as one path component (and in SLURM job names).
pub fn valid_experiment_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && name != "."
        && name != ".."
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

impl StateDir {
    /// Opens (creating) `<state_root>/<experiment>` and takes its lock, waiting
    /// up to `wait` for another orchestrator to let go.
    pub fn open(state_root: &Path, experiment: &str, wait: Duration) -> Result<StateDir, StateError> {
        if !valid_experiment_name(experiment) {
            return Err(StateError::BadName(experiment.to_string()));
        }
        let root = state_root.join(experiment);
        fs::create_dir_all(root.join("configs")).map_err(io(&root))?;
        let lock_path = root.join("lock");
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        let start = Instant::now();
        loop {
            match lock.try_lock_exclusive() {
                Ok(()) => break,
                Err(_) if start.elapsed() < wait => std::thread::sleep(Duration::from_millis(100)),
                Err(_) => {
                    let holder = fs::read_to_string(&lock_path).unwrap_or_default().trim().to_string();
                    return Err(StateError::Locked {
                        experiment: experiment.to_string(),
                        holder: if holder.is_empty() { "unknown process".into() } else { holder },
                        path: lock_path,
                    });
                }
            }
        }
        // Who holds it, for the message another orchestrator prints (not a lock itself).
        let _ = lock.set_len(0);
        let _ = writeln!(lock, "pid {} since {:.0}", std::process::id(), now());
        Ok(StateDir { root, experiment: experiment.to_string(), _lock: lock })
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub fn record_path(&self, hash: &str) -> PathBuf {
        self.root.join("configs").join(format!("{hash}.json"))
    }

    pub fn submission_dir(&self, id: &str) -> PathBuf {
        self.root.join("submissions").join(id)
    }

    pub fn load_records(&self) -> Result<BTreeMap<String, ConfigRecord>, StateError> {
        let dir = self.root.join("configs");
        let mut out = BTreeMap::new();
        for entry in fs::read_dir(&dir).map_err(io(&dir))? {
            let path = entry.map_err(io(&dir))?.path();
            if path.extension().is_some_and(|e| e == "json") {
                if let Some(r) = read_json::<ConfigRecord>(&path)? {
                    out.insert(r.hash.clone(), r);
                }
            }
        }
        Ok(out)
    }

    /// Records are rebuilt from the submissions by [`StateDir::repair`] and
    /// re-polled from SLURM, so they are replaced atomically but not fsynced.
    pub fn save_record(&self, r: &ConfigRecord) -> Result<(), StateError> {
        let path = self.record_path(&r.hash);
        let mut bytes =
            serde_json::to_vec_pretty(r).map_err(|source| StateError::Json { path: path.clone(), source })?;
        bytes.push(b'\n');
        write_replace(&path, &bytes)
    }

    pub fn load_submissions(&self) -> Result<Vec<Submission>, StateError> {
        let dir = self.root.join("submissions");
        let mut out = Vec::new();
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(StateError::Io { path: dir, source: e }),
        };
        for entry in entries {
            let p = entry.map_err(io(&dir))?.path().join("submission.json");
            if let Some(s) = read_json::<Submission>(&p)? {
                out.push(s);
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    pub fn save_submission(&self, s: &Submission) -> Result<(), StateError> {
        write_json(&self.submission_dir(&s.id).join("submission.json"), s)
    }

    /// Appends one JSON line to `journal.jsonl` (for humans and audits; the
    /// protocol's record is `submission.json`, so no fsync here).
    pub fn journal(&self, entry: serde_json::Value) -> Result<(), StateError> {
        let path = self.root.join("journal.jsonl");
        let mut line = serde_json::to_vec(&entry).map_err(|source| StateError::Json { path: path.clone(), source })?;
        line.push(b'\n');
        let mut f = OpenOptions::new().create(true).append(true).open(&path).map_err(io(&path))?;
        f.write_all(&line).map_err(io(&path))
    }

    /// Brings the per-config records in line with the submissions (the intent
    /// and job id live in `submission.json` first; a crash may have stopped
    /// before the records were updated). Returns the records, saved.
    pub fn repair(&self) -> Result<BTreeMap<String, ConfigRecord>, StateError> {
        let mut records = self.load_records()?;
        for s in self.load_submissions()? {
            for (task, hash) in s.tasks.iter().enumerate() {
                let Some(r) = records.get_mut(hash) else { continue };
                let task_id = task as u32;
                let before = r.clone();
                match r.attempts.iter_mut().find(|a| a.submission == s.id && a.task_id == task_id) {
                    Some(a) => {
                        if a.array_job_id.is_none() && s.array_job_id.is_some() {
                            a.array_job_id = s.array_job_id.clone();
                            a.submitted_at = s.submitted_at;
                        }
                        if s.abandoned {
                            a.abandoned = true;
                        }
                    }
                    None => r.attempts.push(Attempt {
                        array_job_id: s.array_job_id.clone(),
                        submitted_at: s.submitted_at,
                        abandoned: s.abandoned,
                        ..Attempt::intended(s.id.clone(), task_id, s.intended_at)
                    }),
                }
                if *r != before {
                    self.save_record(r)?;
                }
            }
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_whole_file() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("a/b.json");
        write_json(&p, &serde_json::json!({"x": 1})).expect("write");
        write_json(&p, &serde_json::json!({"x": 2})).expect("rewrite");
        let v: serde_json::Value = read_json(&p).expect("read").expect("exists");
        assert_eq!(v["x"], 2);
        let leftovers: Vec<_> = fs::read_dir(p.parent().expect("dir"))
            .expect("ls")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty(), "no temp files left");
    }

    #[test]
    fn second_orchestrator_is_refused() {
        let d = tempfile::tempdir().expect("tempdir");
        let first = StateDir::open(d.path(), "exp9", Duration::ZERO).expect("first");
        // flock is per open file description, so a second open in one process conflicts too.
        let second = StateDir::open(d.path(), "exp9", Duration::from_millis(200));
        match second {
            Err(StateError::Locked { experiment, holder, .. }) => {
                assert_eq!(experiment, "exp9");
                assert!(holder.contains(&std::process::id().to_string()), "{holder}");
            }
            other => panic!("expected Locked, got {:?}", other.map(|s| s.root)),
        }
        drop(first);
        // Another test's fork may still hold the file description for a moment
        // (until its exec closes it): wait briefly, as a second orchestrator would.
        StateDir::open(d.path(), "exp9", Duration::from_secs(5)).expect("free after drop");
    }

    #[test]
    fn names_that_escape_the_state_dir_are_refused() {
        let d = tempfile::tempdir().expect("tempdir");
        for bad in ["..", "a/b", "$(x)", "", "a b"] {
            assert!(matches!(StateDir::open(d.path(), bad, Duration::ZERO), Err(StateError::BadName(_))), "{bad}");
        }
    }

    #[test]
    fn a_task_gone_from_squeue_and_sacct_counts_as_cancelled_after_the_grace() {
        let mut a = Attempt {
            array_job_id: Some("34".into()),
            submitted_at: Some(0.0),
            state: Some(SlurmState::Pending),
            ..Attempt::intended("s", 2, 0.0)
        };
        assert!(!a.missing(100.0, 105.0), "within the grace");
        assert!(a.is_live());
        assert!(a.missing(100.0, 100.0 + MISSING_GRACE_S), "gone");
        assert_eq!(a.state, Some(SlurmState::Cancelled));
        assert!(!a.is_live());
        assert!(!a.missing(100.0, 1000.0), "an ended attempt stays as it is");
    }

    #[test]
    fn repair_fills_records_from_submissions() {
        let d = tempfile::tempdir().expect("tempdir");
        let st = StateDir::open(d.path(), "e", Duration::ZERO).expect("open");
        let rec = ConfigRecord {
            hash: "aaa".into(),
            name: "c".into(),
            verdict: None,
            predicted_gib: None,
            attempts: vec![],
            result: None,
        };
        st.save_record(&rec).expect("save");
        let mut sub = Submission {
            id: "s001-x".into(),
            job_name: "n".into(),
            comment: "c".into(),
            array: "0".into(),
            tasks: vec!["aaa".into()],
            intended_at: 1.0,
            array_job_id: None,
            submitted_at: None,
            abandoned: false,
            remote_script: "/x".into(),
            intent: IntentState::Intended,
        };
        st.save_submission(&sub).expect("sub");
        let r = st.repair().expect("repair");
        assert_eq!(r["aaa"].attempts.len(), 1);
        assert!(r["aaa"].live(), "an unsettled intent occupies the config");
        sub.array_job_id = Some("42".into());
        st.save_submission(&sub).expect("sub");
        let r = st.repair().expect("repair");
        assert_eq!(r["aaa"].attempts.len(), 1, "no second attempt");
        assert_eq!(r["aaa"].attempts[0].array_job_id.as_deref(), Some("42"));
    }
}
