//! The submission protocol: how an intent to submit one job array becomes a
//! job SLURM runs exactly once, even when `sbatch`'s outcome is unknown. The
//! states and their rules are [`crate::state::intent`]; this module applies
//! what `sbatch` and polls answered to the state directory.
//!
//! Before an intent is abandoned (the cluster answered twice, by job name,
//! that it has no such job), the run directories of its configs are read:
//! a `start` there from a job none of the config's attempts ran as says the
//! cluster got the submission after all (a cluster whose `sbatch` is not all
//! or nothing, or whose accounting lost the job). Then, or when those files
//! cannot be read, the intent stays open and the reason is said: the tool
//! never guesses "never got it".

use std::collections::BTreeSet;

use super::{blocking, CommandError, Target};
use crate::collect::complete_lines;
use crate::fsio;
use crate::slurm::JobId;
use crate::state::intent::{IntentEvent, IntentState, CONFIRM_S};
use crate::state::{Change, StateDir, Submission};
use crate::transport::Poll;
use facts::event::Event;

/// What one reconciliation did, by submission id.
#[derive(Debug, Clone, Default)]
pub struct Settled {
    pub adopted: Vec<String>,
    pub abandoned: Vec<String>,
    /// Still open (SLURM did not answer, or the answer awaits confirmation).
    pub unresolved: Vec<String>,
    /// Of the unresolved, those the cluster denies having while their configs'
    /// run directories say it ran them, or cannot be read to tell: (id, what
    /// was found).
    pub ran_anyway: Vec<(String, String)>,
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
        settled.ran_anyway.clear();
        for mut s in open {
            let ids: BTreeSet<JobId> =
                poll.tasks.values().filter(|o| o.name == s.job_name).map(|o| o.array_job_id.clone()).collect();
            let event = if ids.is_empty() {
                IntentEvent::NotListed { complete: poll.complete(), at }
            } else {
                IntentEvent::Found(ids)
            };
            if s.state().next(&event).is_ok_and(|n| n == IntentState::Abandoned) {
                if let Some(found) = ran_anyway(st, target, &s).await {
                    tracing::warn!("submission {} stays unresolved: {found}", s.id);
                    settled.unresolved.push(s.id.clone());
                    settled.ran_anyway.push((s.id.clone(), found));
                    continue;
                }
            }
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

/// Whether a task of submission `sub` ran although the cluster lists no job
/// of its name: `Some(what)` when a run directory of its configs holds a
/// `start` past what was read of it, from a job none of the config's
/// attempts ran as, or when one cannot be read (then nothing is known).
async fn ran_anyway(st: &StateDir, target: &Target, sub: &Submission) -> Option<String> {
    let root = match blocking(&target.transport, |t| t.files().remote_state_root()).await {
        Ok(r) => r,
        Err(e) => return Some(format!("its configs' run directories cannot be read to tell ({e})")),
    };
    let mut seen = BTreeSet::new();
    for hash in sub.tasks.iter().filter(|h| seen.insert(*h)) {
        let Some(r) = st.record(hash) else { continue };
        let Some(ours) = r.attempts().iter().find(|a| a.submission() == sub.id) else { continue };
        let Some(rel) = r.events_rel(ours) else { continue };
        let same_dir = r.attempts().iter().filter(|a| a.run_dir() == ours.run_dir());
        let offset = same_dir.clone().map(|a| a.events_offset()).max().unwrap_or(0);
        let known: BTreeSet<&str> = same_dir.filter_map(|a| a.job_id()).map(|j| j.as_str()).collect();
        let path = format!("{root}/{}/{rel}", st.experiment());
        let data = match blocking(&target.transport, {
            let path = path.clone();
            move |t| t.files().read_from(&path, offset)
        })
        .await
        {
            Ok(d) => d.unwrap_or_default(),
            Err(e) => return Some(format!("{path} cannot be read to tell ({e})")),
        };
        let (events, _, _) = complete_lines(&data);
        let start = events.iter().find_map(|(e, _)| match e {
            Event::Start { env, .. } => match env.slurm_job_id.as_deref() {
                Some(j) if known.contains(j) => None,
                Some(j) => Some(format!("job {j}")),
                None => Some("a job that gave no id".to_string()),
            },
            _ => None,
        });
        if let Some(job) = start {
            return Some(format!("{path} holds a run of config {} by {job}", r.name()));
        }
    }
    None
}
