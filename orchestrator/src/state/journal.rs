//! `journal.jsonl`: every change to a state directory, one typed, versioned
//! line each, appended by [`super::StateDir::apply`] as the change is saved.
//! [`Change::apply_to`] is the one function that changes the config records;
//! [`replay`] runs it over the journal's lines and rebuilds what
//! `submissions/*/submission.json` and `configs/*.json` hold.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

use super::events_read::EventsRead;
use super::intent::IntentState;
use super::record::{ConfigRecord, Seen};
use super::submission::Submission;
use super::StateError;
use crate::fsio;
use crate::slurm::{JobId, SlurmState};
use facts::run::ConfigHash;

/// The format of the lines this version writes. Version 1 lines (the
/// submissions' changes only) read as before; lines without `v`, written
/// before the journal was typed, hold too little to replay and are skipped.
/// A journal begun at version 2 replays to the records too.
pub const VERSION: u32 = 2;

/// One change to the state directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Change {
    /// A submission's intent, durable before its `sbatch` runs; its configs
    /// gain an attempt each.
    Intent { submission: Submission },
    /// A submission moved in the protocol ([`super::intent`]): `submission`
    /// as it is now, `from` the state it left.
    Move { from: IntentState, submission: Submission },
    /// `sbatch` failed before its request left: why (the move to abandoned follows).
    NotSent { submission: String, error: String },
    /// `sbatch` failed: why (the intent stays unresolved until SLURM answers by name).
    SbatchError { submission: String, error: String },
    /// `cancel` asked SLURM to cancel these job arrays.
    Cancel { jobs: Vec<JobId> },
    /// An active sweep's round: the configs (hashes) it chose to measure, and
    /// how many it had measured and left unsettled when it chose them.
    ActiveRound { round: u32, chosen: Vec<ConfigHash>, measured: usize, open: usize },
    /// A config as the experiment file and the precheck see it now (its
    /// record made on first sight).
    Config(Seen),
    /// A poll saw array task `task` of `submission` in `state` (with the
    /// task's own job id once it has one); `configs`: the hashes of the
    /// configs the task runs, whose attempts take the state.
    Observed {
        submission: String,
        task: u32,
        configs: Vec<ConfigHash>,
        state: SlurmState,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        job_id: Option<JobId>,
    },
    /// New lines of a config's events were read: its latest attempt as they leave it.
    Events { hash: ConfigHash, read: EventsRead },
    /// The last lines of the log of a config's latest attempt, which ended
    /// without a result from the worker.
    LogTail { hash: ConfigHash, tail: String },
    /// Configs stored under the hash of the notation they were written in,
    /// moved to the hash of their one notation (hash as stored → hash now):
    /// records, submissions' task lists and `sweep.json` ([`super::rehash`]).
    Rehash { aliases: BTreeMap<ConfigHash, ConfigHash> },
}

impl Change {
    /// Its `op` as the journal writes it (`intent`, `move`, ...): the
    /// failpoints of [`super::StateDir::apply`] are named by it (a test holds
    /// it to serde's tag).
    pub fn op(&self) -> &'static str {
        match self {
            Change::Intent { .. } => "intent",
            Change::Move { .. } => "move",
            Change::NotSent { .. } => "not_sent",
            Change::SbatchError { .. } => "sbatch_error",
            Change::Cancel { .. } => "cancel",
            Change::ActiveRound { .. } => "active_round",
            Change::Config(_) => "config",
            Change::Observed { .. } => "observed",
            Change::Events { .. } => "events",
            Change::LogTail { .. } => "log_tail",
            Change::Rehash { .. } => "rehash",
        }
    }

    /// The submission this change saves, if any.
    pub(super) fn submission(&self) -> Option<&Submission> {
        match self {
            Change::Intent { submission } | Change::Move { submission, .. } => Some(submission),
            _ => None,
        }
    }

    /// Whether the change is only about the records (then one that changes
    /// nothing is not written down).
    pub(super) fn records_only(&self) -> bool {
        matches!(self, Change::Config(_) | Change::Observed { .. } | Change::Events { .. } | Change::LogTail { .. })
    }

    /// Applies the change, made at time `t`, to the config records: the one
    /// place records change. Returns the hashes of those it changed.
    pub fn apply_to(&self, records: &mut BTreeMap<ConfigHash, ConfigRecord>, t: f64) -> Vec<ConfigHash> {
        let mut changed = Vec::new();
        match self {
            Change::Intent { submission } | Change::Move { submission, .. } => {
                for (i, hash) in submission.tasks.iter().enumerate() {
                    if let Some(r) = records.get_mut(hash) {
                        if submission.settle(r, submission.task_of(i)) {
                            changed.push(hash.clone());
                        }
                    }
                }
            }
            Change::Config(seen) => {
                let mut fresh = false;
                let r = records.entry(seen.hash.clone()).or_insert_with(|| {
                    fresh = true;
                    ConfigRecord::new(seen.hash.clone(), &seen.name)
                });
                if r.refresh(seen) || fresh {
                    changed.push(seen.hash.clone());
                }
            }
            Change::Observed { submission, task, configs, state, detail, job_id } => {
                for hash in configs {
                    let Some(r) = records.get_mut(hash) else { continue };
                    let Some(a) = r.attempt_mut(submission, *task) else { continue };
                    if a.observe(state.clone(), detail.clone(), job_id.clone(), t) {
                        changed.push(hash.clone());
                    }
                }
            }
            Change::Events { hash, read } => {
                if records.get_mut(hash).is_some_and(|r| r.set_events(read)) {
                    changed.push(hash.clone());
                }
            }
            Change::LogTail { hash, tail } => {
                if records.get_mut(hash).is_some_and(|r| r.set_log_tail(tail)) {
                    changed.push(hash.clone());
                }
            }
            Change::Rehash { aliases } => changed = super::rehash::move_records(records, aliases),
            Change::NotSent { .. }
            | Change::SbatchError { .. }
            | Change::Cancel { .. }
            | Change::ActiveRound { .. } => {}
        }
        changed
    }
}

/// A journal line: the format version, when, and the change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    pub v: u32,
    pub t: f64,
    #[serde(flatten)]
    pub change: Change,
}

/// The typed lines of a journal (by [`facts::jsonl`]'s rule for a torn last
/// line); lines of an earlier format are left out. `None`: no journal.
pub fn read(path: &Path) -> Result<Option<Vec<Line>>, StateError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fsio::io(path)(e).into()),
    };
    let mut out = Vec::new();
    for l in facts::jsonl::read::<serde_json::Value>(&bytes).all() {
        let value = l.value.map_err(|source| fsio::FsError::Json { path: path.into(), source })?;
        if value.get("v").is_none() {
            continue; // written before the journal was typed
        }
        out.push(serde_json::from_value(value).map_err(|source| fsio::FsError::Json { path: path.into(), source })?);
    }
    Ok(Some(out))
}

/// What a journal's lines leave: the submissions by id, the config records by hash.
#[derive(Debug, Default, PartialEq)]
pub struct Replayed {
    pub submissions: BTreeMap<String, Submission>,
    pub records: BTreeMap<ConfigHash, ConfigRecord>,
}

/// Applies every line, in order, to an empty state directory.
pub fn replay(lines: &[Line]) -> Replayed {
    let mut out = Replayed::default();
    for l in lines {
        if let Some(s) = l.change.submission() {
            out.submissions.insert(s.id.clone(), s.clone());
        }
        if let Change::Rehash { aliases } = &l.change {
            out.submissions.values_mut().for_each(|s| _ = s.rehash(aliases));
        }
        l.change.apply_to(&mut out.records, l.t);
    }
    out
}
