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
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::fsio::{self, now, read_json, write_json, FsError};

pub mod intent;
mod record;
mod submission;

pub use record::{Attempt, ConfigRecord, Live, StateChange, MISSING_GRACE_S};
pub use submission::Submission;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("experiment `{experiment}` is locked by another orchestrator ({holder}); wait for it or stop it (lock file {})", path.display())]
    Locked { experiment: String, holder: String, path: PathBuf },
    #[error("experiment name `{0}` cannot name a state directory (use letters, digits, `_`, `-`, `.`)")]
    BadName(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Fs(FsError::Io { path: path.to_path_buf(), source })
}

/// What the state directory stores about the sweep (`sweep.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredSweep {
    pub cluster: String,
    pub sweep: crate::sweep::Sweep,
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
        Ok(fsio::replace_json(&self.record_path(&r.hash), r)?)
    }

    pub fn load_submissions(&self) -> Result<Vec<Submission>, StateError> {
        let dir = self.root.join("submissions");
        let mut out = Vec::new();
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io(&dir)(e)),
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
        Ok(write_json(&self.submission_dir(&s.id).join("submission.json"), s)?)
    }

    /// Appends one JSON line to `journal.jsonl` (for humans and audits; the
    /// protocol's record is `submission.json`, so no fsync here).
    pub fn journal(&self, entry: serde_json::Value) -> Result<(), StateError> {
        Ok(fsio::append_jsonl(&self.root.join("journal.jsonl"), &entry)?)
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
    use super::intent::IntentState;
    use super::*;

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
