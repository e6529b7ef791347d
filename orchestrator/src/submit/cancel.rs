//! `cancel`: scancel every array of the experiment that still has live tasks.

use std::collections::BTreeSet;

use super::{blocking, open_target, protocol, stored_sweep, CommandError, Options};

use crate::slurm::JobId;
use crate::state::{Change, StateDir};

/// What `cancel` did: the arrays it asked SLURM to cancel for the first time,
/// and those an earlier `cancel` already asked for that SLURM has not yet
/// reported ended (asked again: scancel of a cancelled job is harmless).
#[derive(Debug, Default)]
pub struct Cancelled {
    pub new: Vec<JobId>,
    pub again: Vec<JobId>,
}

/// `cancel`: scancel every array of the experiment that still has live tasks.
pub async fn cancel(experiment: &str, opts: &Options) -> Result<Cancelled, CommandError> {
    let stored = stored_sweep(&opts.state_root, experiment)?;
    let target = open_target(opts, &opts.cluster.clone().unwrap_or(stored.cluster.clone()))?;
    let mut st = StateDir::open(&opts.state_root, experiment, opts.lock_wait)?;
    protocol::reconcile(&mut st, &target, false).await?;
    let ids: BTreeSet<JobId> = st
        .records()
        .values()
        .flat_map(|r| r.attempts())
        .filter(|a| a.is_live())
        .filter_map(|a| a.array_job_id().cloned())
        .collect();
    let asked = asked_to_cancel(st.view())?;
    let (again, new): (Vec<JobId>, Vec<JobId>) = ids.into_iter().partition(|j| asked.contains(j));
    if !new.is_empty() {
        st.apply(Change::Cancel { jobs: new.clone() })?;
    }
    let send: Vec<JobId> = new.iter().chain(&again).cloned().collect();
    if !send.is_empty() {
        blocking(&target.transport, move |t| t.cancel(&send)).await?;
    }
    Ok(Cancelled { new, again })
}

/// The job arrays an earlier `cancel` asked SLURM to cancel (its journal lines).
pub(super) fn asked_to_cancel(view: &crate::state::View) -> Result<BTreeSet<JobId>, CommandError> {
    Ok(view
        .journal()?
        .into_iter()
        .filter_map(|l| match l.change {
            Change::Cancel { jobs } => Some(jobs),
            _ => None,
        })
        .flatten()
        .collect())
}

/// Whether `r`'s last attempt ended CANCELLED in an array `cancel` asked to
/// cancel (`asked`): a person stopped it, and `resume` runs it again only
/// with `--retry-cancelled`.
pub(super) fn cancelled_by_cancel(r: &crate::state::ConfigRecord, asked: &BTreeSet<JobId>) -> bool {
    let Some(last) = r.attempts().iter().rev().find(|a| !a.abandoned()) else { return false };
    last.state() == Some(&crate::slurm::SlurmState::Cancelled) && last.array_job_id().is_some_and(|j| asked.contains(j))
}
