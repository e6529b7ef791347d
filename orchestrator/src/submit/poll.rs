//! One poll: one `squeue` and one `sacct` for the whole sweep, applied to
//! the records, then the workers' new events collected.

use serde::Serialize;
use spec::run::ConfigHash;
use std::collections::BTreeMap;

use super::pull::{pull_events, pull_logs};
use super::{blocking, CommandError, Target};
use crate::fsio;
use crate::slurm::{JobId, SlurmState};
use crate::state::intent::IntentState;
use crate::state::{Change, StateDir};
use crate::sweep::Sweep;
use crate::transport::Poll;

/// Applies one poll to the records; returns the configs whose state changed.
/// Tasks a complete poll does not list are timed in `missing.json` (see
/// [`crate::state::Attempt::gone`]).
pub(crate) fn apply(st: &mut StateDir, poll: &Poll) -> Result<Vec<ConfigHash>, CommandError> {
    let now = fsio::now();
    let mut missing = st.missing()?;
    let missing_before = missing.clone();
    // One observation per array task (a task of several configs is one line).
    type Seen = (SlurmState, Option<String>, Option<JobId>);
    let mut seen: BTreeMap<(String, u32), Seen> = BTreeMap::new();
    let mut configs: BTreeMap<(String, u32), Vec<ConfigHash>> = BTreeMap::new();
    for r in st.records().values() {
        for a in r.attempts().iter().filter(|a| !a.abandoned()) {
            let Some(array) = a.array_job_id() else { continue };
            let key = (a.submission().to_string(), a.task_id());
            configs.entry(key.clone()).or_default().push(r.hash().clone());
            if let Some(o) = poll.tasks.get(&(array.clone(), a.task_id())) {
                missing.remove(&a.key());
                if a.would_observe(&o.state, o.job_id.as_ref()) {
                    seen.insert(key, (o.state.clone(), o.detail.clone(), o.job_id.clone()));
                }
            } else if poll.complete() && a.is_live() {
                let since = *missing.entry(a.key()).or_insert(now);
                if let Some((state, detail)) = a.gone(since, now) {
                    missing.remove(&a.key());
                    seen.insert(key, (state, Some(detail), None));
                }
            }
        }
    }
    let mut changed = Vec::new();
    for ((submission, task), (state, detail, job_id)) in seen {
        let configs = configs.remove(&(submission.clone(), task)).unwrap_or_default();
        changed.extend(st.apply(Change::Observed { submission, task, configs, state, detail, job_id })?);
    }
    if missing != missing_before {
        st.save_missing(&missing)?;
    }
    Ok(changed)
}

/// One poll (one squeue + one sacct for the whole sweep), applied; then the
/// worker's event files of configs that ran are pulled. `settle` (resume) also
/// re-reads the events of ended attempts whose worker result is not known yet,
/// since the retry decision depends on it.
pub(crate) async fn update(
    st: &mut StateDir,
    target: &Target,
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
    let changed = apply(st, &poll)?;
    let got = pull_events(st, target, sweep, &changed, settle, grace_s).await;
    pull_logs(st, target, &sweep.experiment.name, grace_s).await;
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
