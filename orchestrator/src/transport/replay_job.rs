//! A replay job's record, `<state>/.replay-jobs/<id>.json`, and the lock its
//! answering holds (`<id>.lock`).
//!
//! A replay answers its tasks in the process that submits (there is nothing
//! to wait for), and that process may die at any instruction (Ctrl-C, a
//! kill). So a job is all or nothing, as `sbatch` makes one: its record, with
//! every task pending, is on disk (fsynced) before its first task is
//! answered, and the lock is held from before the record exists until its
//! last task's exit code is recorded. A poll that finds pending tasks and can
//! take the lock is looking at a job whose submitter died: it answers what
//! is left, as SLURM runs a job whose `sbatch` client went away. A config
//! whose events already hold this task's `start` keeps that answer: nothing
//! is answered twice.

use facts::event::{Event, RunStatus};
use fs2::FileExt;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::TransportError;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct ReplayJob {
    pub(super) id: u64,
    pub(super) name: String,
    /// Task id → exit code, of the tasks answered.
    pub(super) tasks: BTreeMap<u32, i32>,
    /// Tasks not answered yet: the submitter is answering them, or died
    /// doing so (then the next poll answers them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) pending: Vec<u32>,
    /// The manifest and the log pattern (`%A`, `%a`) pending tasks are answered from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) manifest: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) output: Option<String>,
}

impl ReplayJob {
    /// The log of task `t`: the job's `--output` with `%A` and `%a` filled in.
    pub(super) fn log(&self, t: u32) -> PathBuf {
        let pattern = self.output.as_deref().unwrap_or("%a.out");
        PathBuf::from(pattern.replace("%A", &self.id.to_string()).replace("%a", &t.to_string()))
    }

    /// The SLURM job id task `t` runs as (as the events and polls give it).
    pub(super) fn task_job_id(&self, t: u32) -> u64 {
        self.id + 1 + u64::from(t)
    }
}

/// The records of a replay cluster's jobs.
pub(super) struct Jobs {
    pub(super) dir: PathBuf,
}

fn ferr(path: &Path, e: impl std::fmt::Display) -> TransportError {
    TransportError::File { target: "replay".into(), path: path.display().to_string(), message: e.to_string() }
}

impl Jobs {
    fn path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Writes a job's record atomically and durably.
    pub(super) fn save(&self, job: &ReplayJob) -> Result<(), TransportError> {
        let path = self.path(job.id);
        crate::fsio::write_json(&path, job).map_err(|e| ferr(&path, e))
    }

    pub(super) fn load(&self, id: u64) -> Result<Option<ReplayJob>, TransportError> {
        let path = self.path(id);
        crate::fsio::read_json(&path).map_err(|e| ferr(&path, e))
    }

    /// Every job's record (files that are none, the id counter, locks, are passed over).
    pub(super) fn list(&self) -> Vec<ReplayJob> {
        let rd = std::fs::read_dir(&self.dir).into_iter().flatten().filter_map(|e| e.ok());
        rd.map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .filter_map(|p| crate::fsio::read_json::<ReplayJob>(&p).ok().flatten())
            .collect()
    }

    /// The lock of job `id`'s answering: waited for with `wait`, else `None`
    /// when another process holds it (its submitter, alive and answering).
    pub(super) fn lock(&self, id: u64, wait: bool) -> Result<Option<std::fs::File>, TransportError> {
        let path = self.dir.join(format!("{id}.lock"));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| ferr(&path, e))?;
        if wait {
            file.lock_exclusive().map_err(|e| ferr(&path, e))?;
            return Ok(Some(file));
        }
        match file.try_lock_exclusive() {
            Ok(()) => Ok(Some(file)),
            Err(e) if e.kind() == fs2::lock_contended_error().kind() => Ok(None),
            Err(e) => Err(ferr(&path, e)),
        }
    }
}

/// How the events file at `path` says task job `job_id` ended, when that
/// task already answered it: its `result`'s status, or `Failed` for a
/// `start` with no result after it (a write cut short). `None`: not answered.
pub(super) fn answered(path: &Path, job_id: u64) -> Result<Option<RunStatus>, TransportError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ferr(path, e)),
    };
    let id = job_id.to_string();
    let mut events = text.lines().filter_map(|l| serde_json::from_str::<Event>(l).ok());
    let ours = |e: &Event| matches!(e, Event::Start { env, .. } if env.slurm_job_id.as_deref() == Some(id.as_str()));
    if !events.any(|e| ours(&e)) {
        return Ok(None);
    }
    for e in events {
        match e {
            Event::Result { status, .. } => return Ok(Some(status)),
            Event::Start { .. } => break,
            _ => {}
        }
    }
    Ok(Some(RunStatus::Failed))
}
