//! What `submission.json` says about one job array.

use serde::{Deserialize, Serialize};

use super::intent::IntentState;
use crate::fsio::now;
use crate::slurm::JobId;

/// One job array, as `submission.json` keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Submission {
    pub id: String,
    /// Unique on the cluster: how `resume` finds the job if its id was never recorded.
    pub job_name: String,
    pub comment: String,
    pub array: String,
    /// Config hash of each task, task id = index.
    pub tasks: Vec<String>,
    pub intended_at: f64,
    #[serde(default)]
    pub array_job_id: Option<JobId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_at: Option<f64>,
    /// Settled by resume: SLURM never saw it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub abandoned: bool,
    /// The script's path on the cluster.
    pub remote_script: String,
    /// Where the submission protocol has it ([`crate::submit::protocol`]);
    /// `array_job_id` and `abandoned` mirror its final states.
    #[serde(default)]
    pub intent: IntentState,
}

impl Submission {
    /// The protocol state (files written before the protocol had states say
    /// it only through `array_job_id` and `abandoned`).
    pub fn state(&self) -> IntentState {
        match (&self.array_job_id, self.abandoned) {
            (Some(id), _) => IntentState::Submitted { job_id: id.clone() },
            (None, true) => IntentState::Abandoned,
            (None, false) => self.intent.clone(),
        }
    }

    /// Moves to `s`, keeping the mirrored fields in step.
    pub fn set_state(&mut self, s: IntentState) {
        match &s {
            IntentState::Submitted { job_id } => {
                self.array_job_id = Some(job_id.clone());
                self.submitted_at = Some(now());
            }
            IntentState::Abandoned => self.abandoned = true,
            _ => {}
        }
        self.intent = s;
    }
}
