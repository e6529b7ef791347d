//! `cancel`: scancel every array of the experiment that still has live tasks.

use std::collections::BTreeSet;

use super::{blocking, open_target, protocol, stored_sweep, CommandError, Options};

use crate::slurm::JobId;
use crate::state::{Change, StateDir};

/// `cancel`: scancel every array of the experiment that still has live tasks.
pub async fn cancel(experiment: &str, opts: &Options) -> Result<Vec<JobId>, CommandError> {
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
    let ids: Vec<JobId> = ids.into_iter().collect();
    st.apply(Change::Cancel { jobs: ids.clone() })?;
    let send = ids.clone();
    blocking(&target.transport, move |t| t.cancel(&send)).await?;
    Ok(ids)
}
