//! `orchestrator evidence --records FILE`: what active profiling would have
//! cost and how right it would have been, on recorded tables.
//!
//! For each source table in turn: the calibration refitted on every *other*
//! table (cross-validated bands, as `calibrate` ships them), then an active
//! sweep ([`crate::active`]) over that table's configs whose rounds run on the
//! replay cluster ([`crate::transport::replay`], answering from that table's
//! records only): each round is a job array (manifest and script), submitted,
//! polled, and its event streams read back through [`crate::collect`]. The
//! unmeasured configs' predictions are then scored against their records.
//!
//! `--experiments PATH...` instead runs each experiment file as a user's
//! `submit FILE --active --cluster replay` does ([`experiments`]);
//! `--savings PATH...` says what `plan`, held out, calls the configs of each
//! that ran out of memory or past the budget ([`savings`]); `--held-out`
//! how many recorded peaks, family by family, lie inside the bands of a
//! calibration fitted without their table ([`held_out`]).

pub mod experiments;
pub mod held_out;
mod replay_round;
pub mod savings;
mod score;

use std::collections::BTreeMap;
use std::path::Path;

use facts::record::MeasurementRecord;
use facts::RunConfig;

use crate::active::{self, Choice, Refit, Settings, Stop};
use crate::precheck::calibrate;
use crate::transport::replay::{Records, ReplayTransport};
use crate::transport::TransportError;

pub use experiments::{ExperimentRun, ExperimentTally};
pub use held_out::HeldOutTally;
pub use savings::{Savings, SavingsTally};
pub use score::{Score, Tally};

#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("{0}")]
    Replay(String),
}

/// One table's active sweep.
#[derive(Debug, Clone)]
pub struct TableRun {
    pub table: String,
    pub rounds: usize,
    pub stop: Stop,
    pub score: Score,
}

/// The configs of a table: one per record, named after it (file-safe).
fn configs(table: &str, recs: &[(usize, MeasurementRecord)]) -> Vec<(String, RunConfig, MeasurementRecord)> {
    recs.iter()
        .filter_map(|(_, r)| {
            let mut cfg = r.run_config().ok()?;
            cfg.experiment = table.to_string();
            cfg.name = r.id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
            Some((r.id.clone(), cfg, r.clone()))
        })
        .collect()
}

/// The records of `path` that still stand (not superseded), each with its
/// 1-based line.
fn standing_records(path: &Path) -> Result<Vec<(usize, MeasurementRecord)>, EvidenceError> {
    let text = std::fs::read_to_string(path).map_err(|e| EvidenceError::Replay(format!("{}: {e}", path.display())))?;
    Ok(facts::record::read_jsonl(&text)
        .map_err(|(line, e)| EvidenceError::Replay(format!("{}:{line}: {e}", path.display())))?
        .into_iter()
        .enumerate()
        .map(|(i, r)| (i + 1, r))
        .filter(|(_, r)| r.superseded.is_none())
        .collect())
}

/// Every table of `path` in turn (records with a `table`, not superseded).
pub fn run(path: &Path, settings: &Settings, work: &Path) -> Result<Vec<TableRun>, EvidenceError> {
    let all = standing_records(path)?;
    let mut tables: BTreeMap<String, Vec<(usize, MeasurementRecord)>> = BTreeMap::new();
    for (line, r) in &all {
        if let Some(t) = &r.table {
            tables.entry(t.clone()).or_default().push((*line, r.clone()));
        }
    }
    let mut out = Vec::new();
    for (table, recs) in &tables {
        let others: Vec<MeasurementRecord> =
            all.iter().filter(|(_, r)| r.table.as_deref() != Some(table)).map(|(_, r)| r.clone()).collect();
        let prior = calibrate::calibrate(&calibrate::samples(&others).0, true).calibration;
        let source = format!("{} (table {table})", path.display());
        let replay = ReplayTransport::with_records(Records::new(source, recs.iter().cloned()), &work.join(table))?;
        out.push(table_run(table, &configs(table, recs), &prior, settings, &replay)?);
    }
    Ok(out)
}

/// The active loop over one table, measuring on `replay`.
fn table_run(
    table: &str,
    configs: &[(String, RunConfig, MeasurementRecord)],
    prior: &crate::precheck::Calibration,
    settings: &Settings,
    replay: &ReplayTransport,
) -> Result<TableRun, EvidenceError> {
    let keyed: Vec<(String, RunConfig)> = configs.iter().map(|(k, c, _)| (k.clone(), c.clone())).collect();
    let mut measured: BTreeMap<String, MeasurementRecord> = BTreeMap::new();
    let mut rounds = 0;
    loop {
        let list: Vec<MeasurementRecord> = measured.values().cloned().collect();
        let refit = Refit::new(prior, &settings.runtime, &list);
        let answers = active::answers(&keyed, &measured, &refit, settings.target_error);
        match active::choose(&keyed, &answers, &refit, settings, measured.len(), &Default::default()) {
            Choice::Done(stop) => {
                let truth: BTreeMap<String, MeasurementRecord> =
                    configs.iter().map(|(k, _, r)| (k.clone(), r.clone())).collect();
                return Ok(TableRun { table: table.to_string(), rounds, stop, score: Score::of(&answers, &truth) });
            }
            Choice::Measure(keys) => {
                rounds += 1;
                let chosen: Vec<(String, RunConfig)> =
                    keyed.iter().filter(|(k, _)| keys.contains(k)).cloned().collect();
                let got = replay_round::measure(replay, table, rounds, &chosen)?;
                for (k, _) in &chosen {
                    // A config the replay could not answer is spent all the same: never chosen again.
                    let r = got.get(k).cloned().ok_or_else(|| {
                        EvidenceError::Replay(format!("table {table}: the replay answered nothing for `{k}`"))
                    })?;
                    measured.insert(k.clone(), r);
                }
            }
        }
    }
}
