//! `submit`'s last stages, for each array in turn once its intent is
//! recorded ([`super::intend`]): `sbatch` of its script ([`sbatch`]), then
//! what it answered, moved through the submission protocol
//! ([`super::protocol`]) into the state directory ([`record_answer`]). A job
//! id makes the submission `submitted`; an `sbatch` that surely sent nothing
//! frees its configs; any other error leaves the intent unresolved, asks
//! SLURM by job name at once, and stops the command unless SLURM has the job
//! after all (the controller is likely not answering).

use super::judge::Site;
use super::protocol::{self, Settled};
use super::{blocking, CommandError};
use crate::slurm::JobId;
use crate::state::intent::{IntentEvent, IntentState};
use crate::state::{Change, StateDir, Submission};
use crate::transport::TransportError;
use crate::util::failpoint;

/// A submission and what `sbatch` answered for it.
pub(crate) struct Answered {
    pub sub: Submission,
    pub answer: Result<JobId, TransportError>,
}

/// Submits `sub`'s script to the cluster.
pub(crate) async fn sbatch(sub: Submission, site: &Site) -> Answered {
    let script = sub.remote_script.clone();
    let answer = blocking(&site.target.transport, move |t| t.submit(&script)).await;
    failpoint::hit("sbatch:answered");
    Answered { sub, answer }
}

/// A submission SLURM has: its job, its configs' names, and what asking
/// SLURM by name settled on the way (after an `sbatch` error).
pub(crate) struct Recorded {
    pub job_id: JobId,
    pub configs: Vec<String>,
    pub settled: Option<Settled>,
}

/// Records `sbatch`'s answer; `Err` where the command stops.
pub(crate) async fn record_answer(answered: Answered, site: &mut Site) -> Result<Recorded, CommandError> {
    let Answered { mut sub, answer } = answered;
    let st = &mut site.st;
    let e = match answer {
        Ok(job_id) => {
            protocol::advance(st, &mut sub, &IntentEvent::SbatchOk(job_id.clone()))?;
            tracing::info!(submission = %sub.id, job = %job_id, "submitted {} configs", sub.tasks.len());
            return Ok(Recorded { job_id, configs: names(st, &sub), settled: None });
        }
        Err(e @ TransportError::NotSent(_)) => {
            protocol::advance(st, &mut sub, &IntentEvent::NotSent)?;
            st.apply(Change::NotSent { submission: sub.id.clone(), error: e.to_string() })?;
            return Err(CommandError::Refused(format!(
                "submitting {} ({} configs) failed: {e}; its configs are free to submit again",
                sub.id,
                sub.tasks.len()
            )));
        }
        Err(e) => e,
    };
    protocol::advance(st, &mut sub, &IntentEvent::SbatchFailed)?;
    st.apply(Change::SbatchError { submission: sub.id.clone(), error: e.to_string() })?;
    // Did it reach SLURM anyway? Ask by name now; whatever stays open, every later command asks again.
    let settled = match protocol::reconcile(st, &site.target, false).await {
        Ok(settled) => Some(settled),
        Err(asking) => {
            tracing::warn!(submission = %sub.id, "asking SLURM by job name after the sbatch error failed: {asking}");
            None
        }
    };
    let state = st.load_submissions()?.into_iter().find(|s| s.id == sub.id).map(|s| s.state());
    if let Some(IntentState::Submitted { job_id }) = state {
        return Ok(Recorded { job_id, configs: names(st, &sub), settled });
    }
    Err(CommandError::Refused(format!(
        "submitting {} ({} configs) failed: {e}. SLURM may still have created the job: \
         its configs stay reserved until SLURM answers by the job name {} \
         (`orchestrator status` or `resume` asks again; nothing is submitted twice)",
        sub.id,
        sub.tasks.len(),
        sub.job_name
    )))
}

/// The names of `sub`'s configs.
fn names(st: &StateDir, sub: &Submission) -> Vec<String> {
    sub.tasks.iter().filter_map(|h| st.record(h).map(|r| r.name().to_string())).collect()
}
