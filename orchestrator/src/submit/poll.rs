//! One poll: one `squeue` and one `sacct` for the whole sweep, applied to
//! the records, then the workers' new events collected.

use serde::Serialize;
use std::collections::BTreeMap;

use super::pull::{pull_events, pull_logs};
use super::{blocking, CommandError, Target};
use crate::fsio;
use crate::state::intent::IntentState;
use crate::state::{ConfigRecord, StateDir};
use crate::sweep::Sweep;
use crate::transport::Poll;

/// Applies one poll to the records; returns the configs whose state changed.
/// Tasks a complete poll does not list are timed in `missing.json` (see
/// [`crate::state::Attempt::missing`]).
pub(crate) fn apply(
    st: &StateDir,
    records: &mut BTreeMap<String, ConfigRecord>,
    poll: &Poll,
) -> Result<Vec<String>, CommandError> {
    let mut changed = Vec::new();
    let now = fsio::now();
    let missing_path = st.path("missing.json");
    let mut missing: BTreeMap<String, f64> = fsio::read_json(&missing_path)?.unwrap_or_default();
    let missing_before = missing.clone();
    for r in records.values_mut() {
        let mut dirty = false;
        for a in r.attempts.iter_mut().filter(|a| !a.abandoned) {
            let Some(array) = &a.array_job_id else { continue };
            if let Some(o) = poll.tasks.get(&(array.clone(), a.task_id)) {
                missing.remove(&a.key());
                if a.observe(o.state.clone(), o.detail.clone(), o.job_id.clone()) {
                    dirty = true;
                }
            } else if poll.complete() && a.is_live() {
                let since = *missing.entry(a.key()).or_insert(now);
                if a.missing(since, now) {
                    missing.remove(&a.key());
                    dirty = true;
                }
            }
        }
        if dirty {
            st.save_record(r)?;
            changed.push(r.hash.clone());
        }
    }
    if missing != missing_before {
        fsio::write_json(&missing_path, &missing)?;
    }
    Ok(changed)
}

/// One poll (one squeue + one sacct for the whole sweep), applied; then the
/// worker's event files of configs that ran are pulled. `settle` (resume) also
/// re-reads the events of ended attempts whose worker result is not known yet,
/// since the retry decision depends on it.
pub(crate) async fn update(
    st: &StateDir,
    target: &Target,
    records: &mut BTreeMap<String, ConfigRecord>,
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
    let changed = apply(st, records, &poll)?;
    let got = pull_events(st, target, records, sweep, &changed, settle, grace_s).await;
    pull_logs(st, target, records, &sweep.experiment.name, grace_s).await;
    Ok(PollSummary {
        polled: true,
        local: target.config.transport == crate::cluster::TransportKind::Local,
        replay: target.config.transport == crate::cluster::TransportKind::Replay,
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
