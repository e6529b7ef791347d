//! `cancel`: scancel every array of the experiment that still has live tasks.

use std::collections::BTreeSet;
use std::time::Duration;

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
    /// Each chained run stopped: (config, where it stopped: "segment 3 of ≤20, step 61/100").
    pub chains: Vec<(String, String)>,
}

/// How long `cancel` follows a chain's cancelled tasks until SLURM reports
/// them ended, and how often it polls meanwhile.
const CHAIN_SETTLE: Duration = Duration::from_secs(60);
const CHAIN_POLL: Duration = Duration::from_secs(2);

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
        let ids = send.clone();
        blocking(&target.transport, move |t| t.cancel(&ids)).await?;
    }
    let mut chains = Vec::new();
    if stored.sweep.experiment.command.as_ref().is_some_and(|c| c.chain.is_some()) && !send.is_empty() {
        settle_chains(&mut st, &target, &stored.sweep, &send, opts.result_grace.as_secs_f64()).await?;
        chains = where_chains_stopped(&st, &send);
    }
    Ok(Cancelled { new, again, chains })
}

/// Follows the cancelled arrays of a chained sweep until SLURM reports
/// every task ended, cancelling again any that comes back: a segment's
/// worker may be asking SLURM to requeue its job at the moment it is
/// cancelled (and SLURM requeues a finished batch job too).
async fn settle_chains(
    st: &mut StateDir,
    target: &super::Target,
    sweep: &crate::sweep::Sweep,
    arrays: &[JobId],
    grace_s: f64,
) -> Result<(), CommandError> {
    let deadline = std::time::Instant::now() + CHAIN_SETTLE;
    let mut quiet_polls = 0;
    while std::time::Instant::now() < deadline && quiet_polls < 2 {
        tokio::time::sleep(CHAIN_POLL).await;
        super::poll::update(st, target, sweep, false, grace_s).await?;
        let live: BTreeSet<JobId> = st
            .records()
            .values()
            .filter_map(|r| r.latest())
            .filter(|a| a.is_live())
            .filter_map(|a| a.array_job_id().filter(|j| arrays.contains(j)).cloned())
            .collect();
        if live.is_empty() {
            quiet_polls += 1;
            continue;
        }
        quiet_polls = 0;
        let ids: Vec<JobId> = live.into_iter().collect();
        tracing::info!("a chain's task is still queued or running after `cancel`: cancelling {ids:?} again");
        blocking(&target.transport, move |t| t.cancel(&ids)).await?;
    }
    Ok(())
}

/// Where each chained config of the cancelled `arrays` stopped.
fn where_chains_stopped(st: &StateDir, arrays: &[JobId]) -> Vec<(String, String)> {
    let cancelled = |r: &&crate::state::ConfigRecord| {
        r.latest().is_some_and(|a| a.array_job_id().is_some_and(|j| arrays.contains(j)))
    };
    st.records()
        .values()
        .filter(cancelled)
        .filter_map(|r| {
            let c = super::segments::chain_status(r)?;
            Some((r.name().to_string(), c.words_then("the next had not started")))
        })
        .collect()
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
