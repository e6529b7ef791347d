//! Every file under `state/<experiment>/`, named here and only here, with
//! its typed read and write: the orchestrator writes the directory only
//! through the store, which hands out what is in it (and, for `render/` and
//! `report/`, the directory a command writes its output to). The precheck's
//! local overlay gets every experiment's `measurements.jsonl` from the store
//! too, which keeps it in `<state>/calibration.json` (`overlay.rs`). One
//! reader sits below the store in the layers and reads on its own: the
//! clusters' side, the worker and the replay, which write `runs/` where the
//! cluster's state root is (this one, for `local` and `replay`).
//!
//! ```text
//! state/<experiment>/
//!   lock                        held (flock) by the one orchestrator working on it
//!   sweep.json                  the resolved sweep: experiment settings and every config
//!   journal.jsonl               typed, versioned log of every change (journal.rs; replays to the submissions)
//!   configs/<hash>.json         one record per config: verdict, attempts, SLURM state history, result
//!   submissions/<sid>/          one per job array: submission.json (the protocol's record),
//!                               job.sbatch, manifest.json(l) (copies of what was sent), <task>.out (SLURM's logs)
//!   missing.json                tasks a complete poll did not list, since when (Attempt::gone)
//!   runs/<hash>/events.jsonl    the worker's event stream (pulled from the cluster)
//!   measurements.jsonl          one record per finished run (facts::record), appended as results arrive
//!   active.json                 how an active sweep ended (active::ActiveReport)
//!   render/                     scripts printed by `orchestrator render`
//!   report/                     what `orchestrator report` writes
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use facts::record::MeasurementRecord;

use super::{io, StateDir, StateError, StoredSweep, View};
use crate::active::ActiveReport;
use crate::fsio::{self, read_json, write_json};

pub(super) const SWEEP: &str = "sweep.json";
pub(super) const JOURNAL: &str = "journal.jsonl";
pub(super) const LOCK: &str = "lock";
pub(super) const CONFIGS: &str = "configs";
pub(super) const SUBMISSIONS: &str = "submissions";
pub(super) const SUBMISSION: &str = "submission.json";
const MISSING: &str = "missing.json";
const RUNS: &str = "runs";
const EVENTS: &str = "events.jsonl";
pub(super) const MEASUREMENTS: &str = "measurements.jsonl";
const ACTIVE: &str = "active.json";
const RENDER: &str = "render";
const REPORT: &str = "report";

/// What a file under `state/<experiment>/` is (see the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFile {
    Lock,
    Sweep,
    Journal,
    Record,
    Submission,
    /// `job.sbatch`, `manifest.json`, `manifest.jsonl`: copies of what was sent.
    SentCopy,
    /// `submissions/<sid>/<task>.out`, written by SLURM on the cluster.
    TaskLog,
    Missing,
    Events,
    Measurements,
    Active,
    /// Anything under `render/`.
    Render,
    /// Anything under `report/`.
    Report,
}

impl StateFile {
    /// What `rel` (relative to the experiment's directory) is; `None`: a file
    /// the store does not know.
    pub fn of(rel: &Path) -> Option<StateFile> {
        let parts: Vec<&str> = rel
            .components()
            .map(|c| match c {
                Component::Normal(s) => s.to_str(),
                _ => None,
            })
            .collect::<Option<_>>()?;
        let json = |name: &str| name.strip_suffix(".json").is_some_and(fsio::safe_component);
        Some(match parts.as_slice() {
            [LOCK] => StateFile::Lock,
            [SWEEP] => StateFile::Sweep,
            [JOURNAL] => StateFile::Journal,
            [MISSING] => StateFile::Missing,
            [MEASUREMENTS] => StateFile::Measurements,
            [ACTIVE] => StateFile::Active,
            [CONFIGS, name] if json(name) => StateFile::Record,
            [SUBMISSIONS, _, SUBMISSION] => StateFile::Submission,
            [SUBMISSIONS, _, "job.sbatch" | "manifest.json" | "manifest.jsonl"] => StateFile::SentCopy,
            [SUBMISSIONS, _, log] if log.strip_suffix(".out").is_some_and(|t| t.parse::<u32>().is_ok()) => {
                StateFile::TaskLog
            }
            [RUNS, _, EVENTS] => StateFile::Events,
            [RENDER, ..] if parts.len() > 1 => StateFile::Render,
            [REPORT, ..] if parts.len() > 1 => StateFile::Report,
            _ => return None,
        })
    }
}

impl View {
    /// Whether the experiment was ever submitted (its `sweep.json` exists).
    pub fn has_sweep(&self) -> bool {
        self.file(SWEEP).exists()
    }

    /// The stored sweep's `array_parallelism`, read loosely: whatever version
    /// wrote `sweep.json`, only this field is needed (progress lines).
    pub fn array_parallelism(&self) -> Result<Option<u32>, StateError> {
        let sweep: Option<serde_json::Value> = read_json(&self.file(SWEEP))?;
        Ok(sweep
            .as_ref()
            .and_then(|v| v.pointer("/sweep/experiment/array_parallelism"))
            .and_then(|v| v.as_u64())
            .map(|n| n as u32))
    }

    /// `measurements.jsonl`: every finished run's record, in the order they
    /// arrived (empty before the first). A torn last line (being appended)
    /// is left for the next read.
    pub fn measurements(&self) -> Result<Vec<MeasurementRecord>, StateError> {
        let path = self.file(MEASUREMENTS);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&path)(e)),
        };
        facts::record::read_jsonl(&text).map_err(|(line, source)| StateError::Line { path, line, source })
    }

    /// `active.json`: how the experiment's active sweep ended (`None`: it
    /// never ran actively).
    pub fn active(&self) -> Result<Option<ActiveReport>, StateError> {
        Ok(read_json(&self.file(ACTIVE))?)
    }

    /// The events file `rel` ([`super::ConfigRecord::events_rel`]): its bytes
    /// and where it is (for messages). A path that names no events file is
    /// refused.
    pub fn events(&self, rel: &str) -> (std::io::Result<Vec<u8>>, PathBuf) {
        let path = self.file(rel);
        (events_rel_checked(rel).and_then(|()| std::fs::read(&path)), path)
    }

    /// The bytes of every events file under `runs/` (unreadable ones skipped).
    pub fn every_events_file(&self) -> Vec<Vec<u8>> {
        let dirs = std::fs::read_dir(self.file(RUNS)).into_iter().flatten().filter_map(|e| e.ok());
        dirs.filter_map(|d| std::fs::read(d.path().join(EVENTS)).ok()).collect()
    }

    /// Where `orchestrator render` writes its scripts.
    pub fn render_dir(&self) -> PathBuf {
        self.file(RENDER)
    }

    /// Where `orchestrator report` writes, unless told otherwise.
    pub fn report_dir(&self) -> PathBuf {
        self.file(REPORT)
    }
}

impl StateDir {
    /// Stores the sweep (`sweep.json`).
    pub fn save_sweep(&self, sweep: &StoredSweep) -> Result<(), StateError> {
        Ok(write_json(&self.view().file(SWEEP), sweep)?)
    }

    /// `missing.json`: since when each task (by [`super::Attempt::key`]) was
    /// missing from complete polls.
    pub fn missing(&self) -> Result<BTreeMap<String, f64>, StateError> {
        Ok(read_json(&self.view().file(MISSING))?.unwrap_or_default())
    }

    pub fn save_missing(&self, missing: &BTreeMap<String, f64>) -> Result<(), StateError> {
        Ok(write_json(&self.view().file(MISSING), missing)?)
    }

    /// Appends one finished run's record to `measurements.jsonl`.
    pub fn append_measurement(&self, record: &MeasurementRecord) -> Result<(), StateError> {
        Ok(fsio::append_jsonl(&self.view().file(MEASUREMENTS), record)?)
    }

    /// Stores how the active sweep ended (`active.json`).
    pub fn save_active(&self, report: &ActiveReport) -> Result<(), StateError> {
        Ok(write_json(&self.view().file(ACTIVE), report)?)
    }

    /// Keeps a copy of `name` (`job.sbatch`, a manifest) as sent for
    /// submission `sid`: replaced atomically, not fsynced (the intent is the
    /// durable record). Returns where it is.
    pub fn keep_sent(&self, sid: &str, name: &str, bytes: &[u8]) -> Result<PathBuf, StateError> {
        let path = self.submission_dir(sid).join(name);
        fsio::write_replace(&path, bytes)?;
        Ok(path)
    }

    /// Removes what was kept for a submission that was never sent.
    pub fn forget_unsent(&self, sid: &str) {
        let _ = std::fs::remove_dir_all(self.submission_dir(sid));
    }

    /// Appends the bytes of events file `rel` read on the cluster from
    /// `offset` to the local copy (which then holds exactly the bytes read so
    /// far; a copy out of step is rewritten by the next read from 0). Nothing
    /// to do when `remote` is this very file (a cluster whose state root is
    /// this one).
    pub fn keep_events(&self, rel: &str, remote: &str, offset: u64, bytes: &[u8]) -> Result<(), StateError> {
        let local = self.view().file(rel);
        if std::path::absolute(&local).is_ok_and(|p| p == Path::new(remote)) {
            return Ok(());
        }
        events_rel_checked(rel).and_then(|()| append_at(&local, offset, bytes)).map_err(|e| io(&local)(e))
    }
}

/// `Ok` when `rel` names an events file (`runs/<hash>/events.jsonl`).
fn events_rel_checked(rel: &str) -> std::io::Result<()> {
    match StateFile::of(Path::new(rel)) {
        Some(StateFile::Events) => Ok(()),
        _ => Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{rel:?} names no events file"))),
    }
}

fn append_at(local: &Path, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(d) = local.parent() {
        std::fs::create_dir_all(d)?;
    }
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(local)?;
    if f.metadata()?.len() != offset {
        // Out of step (an older copy, a first read): start over from the cluster's bytes.
        drop(f);
        if offset != 0 {
            return Ok(()); // the next full read (offset 0) rewrites it
        }
        return std::fs::write(local, bytes);
    }
    f.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_of_the_table_is_known_and_nothing_else() {
        let known = [
            ("lock", StateFile::Lock),
            ("sweep.json", StateFile::Sweep),
            ("journal.jsonl", StateFile::Journal),
            ("configs/0123abcd.json", StateFile::Record),
            ("submissions/s001-ab12/submission.json", StateFile::Submission),
            ("submissions/s001-ab12/manifest.jsonl", StateFile::SentCopy),
            ("submissions/s001-ab12/17.out", StateFile::TaskLog),
            ("missing.json", StateFile::Missing),
            ("runs/0123abcd/events.jsonl", StateFile::Events),
            ("measurements.jsonl", StateFile::Measurements),
            ("active.json", StateFile::Active),
            ("render/s001-ab12/job.sbatch", StateFile::Render),
            ("report/report.md", StateFile::Report),
        ];
        for (rel, what) in known {
            assert_eq!(StateFile::of(Path::new(rel)), Some(what), "{rel}");
        }
        for rel in
            ["sweep.json.tmp", "configs/x.txt", "runs/h/log", "submissions/s/x.out", "render", "../lock", "notes.md"]
        {
            assert_eq!(StateFile::of(Path::new(rel)), None, "{rel}");
        }
    }
}
