//! The submission protocol: how an intent to submit one job array becomes a
//! job SLURM runs exactly once, even when `sbatch`'s outcome is unknown. The
//! states and their rules are [`crate::state::intent`]; this module applies
//! what `sbatch` and polls answered to the state directory.

use std::collections::BTreeSet;

use super::{blocking, CommandError, Target};
use crate::fsio;
use crate::slurm::JobId;
use crate::state::intent::{IntentEvent, IntentState, CONFIRM_S};
use crate::state::{Change, StateDir, Submission};
use crate::transport::Poll;

/// What one reconciliation did, by submission id.
#[derive(Debug, Clone, Default)]
pub struct Settled {
    pub adopted: Vec<String>,
    pub abandoned: Vec<String>,
    /// Still open (SLURM did not answer, or the answer awaits confirmation).
    pub unresolved: Vec<String>,
}

/// Applies `event` to submission `sub`: the protocol's next state, applied
/// to the state directory ([`StateDir::apply`]: `submission.json`, the
/// journal, the records' attempts).
pub(crate) fn advance(st: &mut StateDir, sub: &mut Submission, event: &IntentEvent) -> Result<(), CommandError> {
    let before = sub.state();
    let next = before
        .next(event)
        .map_err(|e| CommandError::Refused(format!("submission {} (job name {}): {e}", sub.id, sub.job_name)))?;
    if next == before {
        return Ok(());
    }
    sub.set_state(next);
    st.apply(Change::Move { from: before, submission: sub.clone() })?;
    Ok(())
}

/// Asks SLURM by job name about every open intent (one squeue + one sacct
/// for all of them) and moves each on. With `wait_confirm` (`submit`,
/// `resume`), an intent seen absent once is asked again after [`CONFIRM_S`]
/// within this call, so a resume after a stall can resubmit at once.
pub(crate) async fn reconcile(st: &mut StateDir, target: &Target, wait_confirm: bool) -> Result<Settled, CommandError> {
    let mut settled = Settled::default();
    for round in 0..3 {
        let open: Vec<Submission> = st.load_submissions()?.into_iter().filter(|s| s.state().is_open()).collect();
        if open.is_empty() {
            settled.unresolved.clear();
            return Ok(settled);
        }
        let names: Vec<String> = open.iter().map(|s| s.job_name.clone()).collect();
        let since = open.iter().map(|s| s.intended_at).fold(f64::INFINITY, f64::min);
        let poll = match blocking(&target.transport, move |t| t.poll(&names, since)).await {
            Ok(p) => p,
            Err(e) => {
                // Neither view answered: nothing is known, everything stays open.
                tracing::warn!("cannot settle {} open submission(s): {e}", open.len());
                Poll { errors: vec![e.to_string()], ..Poll::default() }
            }
        };
        let at = fsio::now();
        let mut next_confirm = f64::INFINITY;
        settled.unresolved.clear();
        for mut s in open {
            let ids: BTreeSet<JobId> =
                poll.tasks.values().filter(|o| o.name == s.job_name).map(|o| o.array_job_id.clone()).collect();
            let event = if ids.is_empty() {
                IntentEvent::NotListed { complete: poll.complete(), at }
            } else {
                IntentEvent::Found(ids)
            };
            advance(st, &mut s, &event)?;
            match s.state() {
                IntentState::Submitted { .. } => settled.adopted.push(s.id.clone()),
                IntentState::Abandoned => settled.abandoned.push(s.id.clone()),
                open => {
                    if let Some(t) = open.confirm_at() {
                        next_confirm = next_confirm.min(t);
                    }
                    settled.unresolved.push(s.id.clone());
                }
            }
        }
        if !wait_confirm || round == 2 || !next_confirm.is_finite() || !poll.complete() {
            break;
        }
        let wait = (next_confirm - fsio::now()).max(0.0) + 0.1;
        tokio::time::sleep(std::time::Duration::from_secs_f64(wait.min(2.0 * CONFIRM_S))).await;
    }
    Ok(settled)
}
