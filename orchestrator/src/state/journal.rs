//! `journal.jsonl`: every change to the submissions of a state directory, one
//! typed, versioned line each, appended by [`super::StateDir::apply`] after
//! the change is saved. [`replay`] rebuilds the submissions from it: the
//! journal holds everything `submissions/*/submission.json` does, in order.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

use super::intent::IntentState;
use super::submission::Submission;
use super::StateError;
use crate::fsio;
use crate::slurm::JobId;

/// The format of the lines this version writes (lines without `v`, written
/// before the journal was typed, hold too little to replay and are skipped).
pub const VERSION: u32 = 1;

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
    ActiveRound { round: u32, chosen: Vec<String>, measured: usize, open: usize },
}

/// A journal line: the format version, when, and the change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    pub v: u32,
    pub t: f64,
    #[serde(flatten)]
    pub change: Change,
}

/// The typed lines of a journal (by [`spec::jsonl`]'s rule for a torn last
/// line); lines of an earlier format are left out. `None`: no journal.
pub fn read(path: &Path) -> Result<Option<Vec<Line>>, StateError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fsio::io(path)(e).into()),
    };
    let mut out = Vec::new();
    for l in spec::jsonl::read::<serde_json::Value>(&bytes).all() {
        let value = l.value.map_err(|source| fsio::FsError::Json { path: path.into(), source })?;
        if value.get("v").is_none() {
            continue; // written before the journal was typed
        }
        out.push(serde_json::from_value(value).map_err(|source| fsio::FsError::Json { path: path.into(), source })?);
    }
    Ok(Some(out))
}

/// The submissions the journal's lines leave, by id.
pub fn replay(lines: &[Line]) -> BTreeMap<String, Submission> {
    let mut subs = BTreeMap::new();
    for l in lines {
        match &l.change {
            Change::Intent { submission } | Change::Move { submission, .. } => {
                subs.insert(submission.id.clone(), submission.clone());
            }
            Change::NotSent { .. }
            | Change::SbatchError { .. }
            | Change::Cancel { .. }
            | Change::ActiveRound { .. } => {}
        }
    }
    subs
}
