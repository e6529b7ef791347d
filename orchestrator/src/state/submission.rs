//! What `submission.json` says about one job array.

use serde::{Deserialize, Serialize};

use super::intent::IntentState;
use super::record::{Attempt, ConfigRecord};
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
    /// The protocol's state and its mirrors change only through
    /// [`Submission::set_state`] (read them with [`Submission::state`]).
    #[serde(default)]
    pub(super) array_job_id: Option<JobId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) submitted_at: Option<f64>,
    /// Settled by resume: SLURM never saw it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) abandoned: bool,
    /// The script's path on the cluster.
    pub remote_script: String,
    /// Where the submission protocol has it ([`crate::submit::protocol`]);
    /// `array_job_id` and `abandoned` mirror its final states.
    #[serde(default)]
    pub(super) intent: IntentState,
}

impl Submission {
    /// A submission not yet intended: its job array as rendered, the script
    /// at `remote_script` on the cluster. [`Change::Intent`](super::Change)
    /// makes it durable, with its time.
    pub fn new(
        id: String,
        job_name: String,
        comment: String,
        array: String,
        tasks: Vec<String>,
        remote_script: String,
    ) -> Self {
        Submission {
            id,
            job_name,
            comment,
            array,
            tasks,
            intended_at: 0.0,
            array_job_id: None,
            submitted_at: None,
            abandoned: false,
            remote_script,
            intent: IntentState::Intended,
        }
    }

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

    /// Brings config `r`'s attempt for task `task` in line with this
    /// submission: created when missing (a crash between the two writes),
    /// the array's job id adopted, abandoned with it. Returns whether `r` changed.
    pub fn settle(&self, r: &mut ConfigRecord, task: u32) -> bool {
        let before = r.clone();
        match r.attempts.iter_mut().find(|a| a.submission == self.id && a.task_id == task) {
            Some(a) => {
                if a.array_job_id.is_none() && self.array_job_id.is_some() {
                    a.array_job_id = self.array_job_id.clone();
                    a.submitted_at = self.submitted_at;
                }
                if self.abandoned {
                    a.abandoned = true;
                }
            }
            None => r.attempts.push(Attempt {
                array_job_id: self.array_job_id.clone(),
                submitted_at: self.submitted_at,
                abandoned: self.abandoned,
                ..Attempt::intended(self.id.clone(), task, self.intended_at)
            }),
        }
        *r != before
    }
}
