//! The state directory `state/<experiment>/`: everything the orchestrator knows
//! about a sweep, as plain JSON readable with `jq`, written so that a crash at
//! any instant leaves it consistent.
//!
//! Its files, each with its typed read and write, are listed in `files.rs` ([`StateFile`]).
//!
//! Crash safety rests on one rule: a submission's intent (`submission.json`
//! with no job id) is on disk, fsynced, *before* `sbatch` runs. A crash after
//! sbatch returns but before the job id is recorded leaves an intent that
//! `resume` settles by asking SLURM for the submission's unique job name.

use facts::run::ConfigHash;
use fs2::FileExt;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::fsio::{self, now, read_json, write_json, FsError};
use crate::util::failpoint;

mod events_read;
mod files;
#[cfg(test)]
mod fixture;
pub mod intent;
pub mod journal;
mod overlay;
mod record;
mod rehash;
mod submission;

pub use events_read::{ChainRead, EventsRead, Live};
pub use files::StateFile;
pub use journal::Change;
pub use overlay::{local_overlay, overlay, overlay_path, OVERLAY};
pub use record::{Attempt, ConfigRecord, RunDirKey, Seen, StateChange, MISSING_GRACE_S};
pub use submission::{ArrayJob, Submission};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("experiment `{experiment}` is locked by another orchestrator ({holder}); wait for it or stop it (lock file {})", path.display())]
    Locked { experiment: String, holder: String, path: PathBuf },
    #[error("experiment name `{0}` cannot name a state directory (use letters, digits, `_`, `-`, `.`)")]
    BadName(String),
    #[error("{}:{line}: {source}", path.display())]
    Line { path: PathBuf, line: usize, source: serde_json::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Fs(FsError::Io { path: path.to_path_buf(), source })
}

/// What the state directory stores about the sweep (`sweep.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredSweep {
    pub cluster: String,
    pub sweep: crate::sweep::Sweep,
    /// The clusters file it was submitted with, absolute (none: no file was
    /// read, or a state written before it was kept): where `status`,
    /// `resume` and `cancel` look for its cluster when none is named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters_file: Option<PathBuf>,
}

/// A state directory read without its lock: what `report`, progress and
/// `status` of another orchestrator's sweep see. Every file in it is replaced
/// atomically, so each read sees a config whole.
#[derive(Debug, Clone)]
pub struct View {
    root: PathBuf,
}

impl View {
    /// `<state_root>/<experiment>` (which need not exist).
    pub fn new(state_root: &Path, experiment: &str) -> Result<View, StateError> {
        if !valid_experiment_name(experiment) {
            return Err(StateError::BadName(experiment.to_string()));
        }
        Ok(View { root: state_root.join(experiment) })
    }

    /// The directory, for messages (its files are read through the methods here and in `files.rs`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn file(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// `sweep.json`, each config keyed by its hash now ([`rehash`]); `None`
    /// before the first submission.
    pub fn sweep(&self) -> Result<Option<StoredSweep>, StateError> {
        Ok(read_json::<StoredSweep>(&self.file(files::SWEEP))?.map(|s| s.rehashed().0))
    }

    /// [`View::sweep`] where it holds the sweep to its cluster: once a
    /// submission may have reached it (any not positively abandoned). A
    /// `submit` that never reached its host submitted nothing: the sweep is
    /// stored, but it may go elsewhere next (`None`).
    pub fn pinned_sweep(&self) -> Result<Option<StoredSweep>, StateError> {
        let pinned = self.submissions()?.iter().any(|s| s.state() != intent::IntentState::Abandoned);
        Ok(if pinned { self.sweep()? } else { None })
    }

    /// [`View::sweep`] and [`View::records`] keyed alike: in a directory not
    /// yet opened since one model has one hash, the records of configs that
    /// moved are read under their hash now (nothing is written).
    pub fn sweep_and_records(&self) -> Result<(Option<StoredSweep>, BTreeMap<ConfigHash, ConfigRecord>), StateError> {
        let stored = read_json::<StoredSweep>(&self.file(files::SWEEP))?.map(StoredSweep::rehashed);
        let mut records = self.records()?;
        if let Some((_, aliases)) = &stored {
            rehash::move_records(&mut records, aliases);
        }
        Ok((stored.map(|(s, _)| s), records))
    }

    /// Every `configs/*.json`, by hash.
    pub fn records(&self) -> Result<BTreeMap<ConfigHash, ConfigRecord>, StateError> {
        let dir = self.file(files::CONFIGS);
        let mut out = BTreeMap::new();
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io(&dir)(e)),
        };
        for entry in entries {
            let path = entry.map_err(io(&dir))?.path();
            if path.extension().is_some_and(|e| e == "json") {
                if let Some(r) = read_json::<ConfigRecord>(&path)? {
                    out.insert(r.hash.clone(), r);
                }
            }
        }
        Ok(out)
    }

    /// Every `submissions/*/submission.json`, by id.
    pub fn submissions(&self) -> Result<Vec<Submission>, StateError> {
        let dir = self.file(files::SUBMISSIONS);
        let mut out = Vec::new();
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io(&dir)(e)),
        };
        for entry in entries {
            let p = entry.map_err(io(&dir))?.path().join(files::SUBMISSION);
            if let Some(s) = read_json::<Submission>(&p)? {
                out.push(s);
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// The typed lines of `journal.jsonl` (empty when there is none).
    pub fn journal(&self) -> Result<Vec<journal::Line>, StateError> {
        Ok(journal::read(&self.file(files::JOURNAL))?.unwrap_or_default())
    }
}

/// An open state directory, locked for the lifetime of this value: the one
/// writer. It owns the config records; they and the submissions change only
/// through [`StateDir::apply`].
pub struct StateDir {
    view: View,
    experiment: String,
    records: BTreeMap<ConfigHash, ConfigRecord>,
    _lock: File,
}

/// Whether `name` is usable as one path component (and in SLURM job names).
pub fn valid_experiment_name(name: &str) -> bool {
    fsio::safe_component(name)
}

impl StateDir {
    /// Opens (creating) `<state_root>/<experiment>` and takes its lock, waiting
    /// up to `wait` for another orchestrator to let go.
    pub fn open(state_root: &Path, experiment: &str, wait: Duration) -> Result<StateDir, StateError> {
        let view = View::new(state_root, experiment)?;
        let root = view.root();
        fs::create_dir_all(root.join(files::CONFIGS)).map_err(io(root))?;
        let lock_path = root.join(files::LOCK);
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
        let mut st = StateDir { view, experiment: experiment.to_string(), records: BTreeMap::new(), _lock: lock };
        st.repair()?;
        Ok(st)
    }

    /// The directory read as anyone may read it.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// The directory, for messages.
    pub fn root(&self) -> &Path {
        self.view.root()
    }

    pub fn experiment(&self) -> &str {
        &self.experiment
    }

    fn record_path(&self, hash: &str) -> PathBuf {
        self.view.file(files::CONFIGS).join(format!("{hash}.json"))
    }

    fn submission_dir(&self, id: &str) -> PathBuf {
        self.view.file(files::SUBMISSIONS).join(id)
    }

    /// Every config's record, by hash.
    pub fn records(&self) -> &BTreeMap<ConfigHash, ConfigRecord> {
        &self.records
    }

    pub fn record(&self, hash: &str) -> Option<&ConfigRecord> {
        self.records.get(hash)
    }

    /// Records are rebuilt from the submissions by [`StateDir::repair`] and
    /// re-polled from SLURM, so they are replaced atomically but not fsynced.
    fn save_record(&self, hash: &str) -> Result<(), StateError> {
        match self.records.get(hash) {
            Some(r) => Ok(fsio::replace_json(&self.record_path(hash), r)?),
            None => Ok(()),
        }
    }

    pub fn load_submissions(&self) -> Result<Vec<Submission>, StateError> {
        self.view.submissions()
    }

    /// Applies one change ([`Change::apply_to`]): the submission it names
    /// saved first (fsynced: the protocol's record), the journal line
    /// appended, and the records it changed saved. A change of the records
    /// that changes nothing writes nothing. Returns the hashes of the
    /// records it changed.
    pub fn apply(&mut self, change: Change) -> Result<Vec<ConfigHash>, StateError> {
        let t = now();
        let op = change.op();
        if let Some(s) = change.submission() {
            write_json(&self.submission_dir(&s.id).join(files::SUBMISSION), s)?;
            failpoint::hit_at(op, "submission-written");
        }
        let changed = change.apply_to(&mut self.records, t);
        if changed.is_empty() && change.records_only() {
            return Ok(changed);
        }
        // For humans, audits and replay; `submission.json` is the record, so no fsync here.
        fsio::append_jsonl(&self.view.file(files::JOURNAL), &journal::Line { v: journal::VERSION, t, change })?;
        failpoint::hit_at(op, "journaled");
        for (i, hash) in changed.iter().enumerate() {
            if i == 1 {
                failpoint::hit_at(op, "between-records");
            }
            self.save_record(hash)?;
        }
        Ok(changed)
    }

    /// Reads the records and brings them in line with the submissions (the
    /// intent and job id live in `submission.json` first; a crash may have
    /// stopped before the records were updated), saving those it changed.
    fn repair(&mut self) -> Result<(), StateError> {
        self.records = self.view.records()?;
        self.rehash()?;
        for s in self.load_submissions()? {
            for hash in (Change::Intent { submission: s }).apply_to(&mut self.records, now()) {
                self.save_record(&hash)?;
            }
        }
        Ok(())
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
            other => panic!("expected Locked, got {:?}", other.map(|s| s.root().to_path_buf())),
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

    fn seen(hash: &str) -> Change {
        Change::Config(Seen {
            hash: hash.into(),
            name: hash.into(),
            verdict: Some(crate::precheck::VerdictKind::Fits),
            predicted_gib: Some(1.5),
            calibration: Some("shipped burn-flex/fp32".into()),
        })
    }

    fn submission(id: &str, tasks: &[&str]) -> Submission {
        let job = ArrayJob {
            job_name: format!("job-{id}"),
            comment: "c".into(),
            array: format!("0-{}", tasks.len() - 1),
            configs: tasks.iter().map(|t| ConfigHash::from(*t)).collect(),
            configs_per_task: 1,
        };
        let mut s = Submission::new(id.into(), job, "/x".into());
        s.intended_at = 1.0;
        s
    }

    #[test]
    fn opening_repairs_records_from_submissions() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut st = StateDir::open(d.path(), "e", Duration::ZERO).expect("open");
        st.apply(seen("aaa")).expect("seen");
        drop(st);
        // A crash after the intent was saved, before the records were.
        let mut sub = submission("s001-x", &["aaa"]);
        let sub_path = d.path().join("e/submissions/s001-x/submission.json");
        write_json(&sub_path, &sub).expect("sub");
        let st = StateDir::open(d.path(), "e", Duration::ZERO).expect("open");
        assert_eq!(st.records()["aaa"].attempts().len(), 1);
        assert!(st.records()["aaa"].occupied(), "an unsettled intent occupies the config");
        assert_eq!(st.view().records().expect("records"), *st.records(), "and saved");
        drop(st);
        sub.set_state(IntentState::Submitted { job_id: "42".into() });
        write_json(&sub_path, &sub).expect("sub");
        let st = StateDir::open(d.path(), "e", Duration::ZERO).expect("open");
        let r = &st.records()["aaa"];
        assert_eq!(r.attempts().len(), 1, "no second attempt");
        assert_eq!(r.attempts()[0].array_job_id().map(|j| j.as_str()), Some("42"));
    }

    #[test]
    fn the_journal_replays_to_the_state_directory() {
        use crate::collect::WorkerOutcome;
        use crate::slurm::{JobId, SlurmState};
        let d = tempfile::tempdir().expect("tempdir");
        let mut st = StateDir::open(d.path(), "e", Duration::ZERO).expect("open");
        // Old lines (before the journal was typed) are kept but not replayed.
        fsio::append_jsonl(&st.view().file(files::JOURNAL), &serde_json::json!({"t": 0.5, "op": "intent"}))
            .expect("old");
        for h in ["a", "b", "c"] {
            st.apply(seen(h)).expect("seen");
        }
        assert!(st.apply(seen("a")).expect("seen again").is_empty(), "nothing new: no line");
        let mut s1 = submission("s001", &["a", "b"]);
        st.apply(Change::Intent { submission: s1.clone() }).expect("intent");
        let from = s1.state();
        s1.set_state(IntentState::Submitted { job_id: JobId::from("41") });
        st.apply(Change::Move { from, submission: s1.clone() }).expect("submitted");
        let observed = |task: u32, state, job: &str| Change::Observed {
            submission: "s001".into(),
            task,
            configs: vec![["a", "b"][task as usize].into()],
            state,
            detail: None,
            job_id: Some(JobId::from(job)),
        };
        st.apply(observed(0, SlurmState::Running, "42")).expect("running");
        st.apply(observed(1, SlurmState::Failed, "43")).expect("failed");
        let ok = serde_json::from_value(serde_json::json!({
            "event": "result", "t": 3.0, "status": "ok", "params": 1, "peaks": {}, "peak_bytes": 4096, "wall_s": 2.0
        }))
        .expect("a result");
        let read = EventsRead {
            worker: WorkerOutcome::Result(facts::event::RunStatus::Ok),
            offset: 812,
            mine: true,
            live: None,
            result: Some(ok),
            chain: None,
        };
        st.apply(Change::Events { hash: "a".into(), read }).expect("events");
        st.apply(observed(0, SlurmState::Completed, "42")).expect("completed");
        st.apply(Change::LogTail { hash: "b".into(), tail: "exec: worker: not found".into() }).expect("log");
        let mut s2 = submission("s002", &["c"]);
        st.apply(Change::Intent { submission: s2.clone() }).expect("intent");
        st.apply(Change::SbatchError { submission: s2.id.clone(), error: "timeout".into() }).expect("error");
        for next in [IntentState::Unresolved, IntentState::Absent { since: 3.0 }, IntentState::Abandoned] {
            let from = s2.state();
            s2.set_state(next);
            st.apply(Change::Move { from, submission: s2.clone() }).expect("move");
        }
        st.apply(Change::Cancel { jobs: vec![JobId::from("41")] }).expect("cancel");

        let lines = st.view().journal().expect("journal");
        assert_eq!(lines.len(), 16, "every change a line, the old one and the no-op left out");
        assert!(lines.iter().all(|l| l.v == journal::VERSION));
        let records = st.records().clone();
        assert_eq!(records["a"].result_status(), Some(facts::event::RunStatus::Ok));
        assert_eq!(records["b"].latest().and_then(Attempt::log_tail), Some("exec: worker: not found"));
        assert!(records["c"].attempts()[0].abandoned() && !records["c"].occupied());
        drop(st);
        // What is on disk, read afresh, is what the journal replays to.
        let view = View::new(d.path(), "e").expect("view");
        let on_disk: BTreeMap<String, Submission> =
            view.submissions().expect("submissions").into_iter().map(|s| (s.id.clone(), s)).collect();
        let replayed = journal::replay(&view.journal().expect("journal"));
        assert_eq!(replayed.submissions, on_disk);
        assert_eq!(replayed.records, view.records().expect("records"));
    }

    /// A crash can cut the journal's last line at any byte (an append is one
    /// `write`, but the disk may keep part of it): every cut reads, and
    /// replays to the state before that line, or with it once it is whole.
    #[test]
    fn the_journal_cut_at_every_byte_of_its_last_line_replays_consistently() {
        use crate::slurm::JobId;
        let d = tempfile::tempdir().expect("tempdir");
        let mut st = StateDir::open(d.path(), "e", Duration::ZERO).expect("open");
        for h in ["a", "b"] {
            st.apply(seen(h)).expect("seen");
        }
        let mut s1 = submission("s001", &["a", "b"]);
        st.apply(Change::Intent { submission: s1.clone() }).expect("intent");
        let from = s1.state();
        s1.set_state(IntentState::Submitted { job_id: JobId::from("41") });
        st.apply(Change::Move { from, submission: s1 }).expect("submitted");
        let path = st.view().file(files::JOURNAL);
        drop(st);
        let bytes = std::fs::read(&path).expect("journal");
        let whole = journal::replay(&journal::read(&path).expect("read").expect("a journal"));
        let last = bytes[..bytes.len() - 1].iter().rposition(|&b| b == b'\n').expect("several lines") + 1;
        std::fs::write(&path, &bytes[..last]).expect("cut");
        let before = journal::replay(&journal::read(&path).expect("read").expect("a journal"));
        assert_ne!(before, whole, "the last line changes something");
        for cut in last..=bytes.len() {
            std::fs::write(&path, &bytes[..cut]).expect("cut");
            let lines = journal::read(&path).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
            let replayed = journal::replay(&lines.expect("a journal"));
            if cut < bytes.len() - 1 {
                assert_eq!(replayed, before, "cut at byte {cut} of {}", bytes.len());
            } else {
                assert!(replayed == before || replayed == whole, "cut at byte {cut} of {}", bytes.len());
            }
        }
    }

    /// `Change::op` names the failpoints of `apply`: it is the journal's tag.
    #[test]
    fn a_change_s_op_is_its_journal_tag() {
        use crate::slurm::{JobId, SlurmState};
        let mut s = submission("s001", &["a"]);
        let from = s.state();
        s.set_state(IntentState::Submitted { job_id: JobId::from("41") });
        let changes = [
            seen("a"),
            Change::Intent { submission: submission("s001", &["a"]) },
            Change::Move { from, submission: s },
            Change::NotSent { submission: "s001".into(), error: "e".into() },
            Change::SbatchError { submission: "s001".into(), error: "e".into() },
            Change::Cancel { jobs: vec![JobId::from("41")] },
            Change::ActiveRound { round: 1, chosen: vec![], measured: 0, open: 0 },
            Change::Observed {
                submission: "s001".into(),
                task: 0,
                configs: vec![],
                state: SlurmState::Running,
                detail: None,
                job_id: None,
            },
            Change::LogTail { hash: "a".into(), tail: String::new() },
            Change::Rehash { aliases: BTreeMap::new() },
        ];
        for c in changes {
            assert_eq!(serde_json::to_value(&c).expect("json")["op"], c.op(), "{c:?}");
        }
    }
}
