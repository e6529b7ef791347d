//! What `submission.json` says about one job array.

use serde::{Deserialize, Serialize};

use super::intent::IntentState;
use super::record::{Attempt, ConfigRecord};
use crate::fsio::now;
use crate::slurm::JobId;
use facts::run::ConfigHash;

/// One job array, as `submission.json` keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Submission {
    pub id: String,
    /// Unique on the cluster: how `resume` finds the job if its id was never recorded.
    pub job_name: String,
    pub comment: String,
    pub array: String,
    /// The hash of each config, in manifest order: config `i` runs in array
    /// task `i / configs_per_task` (task id = index when one config a task).
    pub tasks: Vec<ConfigHash>,
    /// How many configs one array task runs (absent in files written before: 1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub configs_per_task: u32,
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

fn one() -> u32 {
    1
}

fn is_one(k: &u32) -> bool {
    *k == 1
}

/// A job array as rendered: its unique name, comment and `--array`, and its
/// configs (hashes in manifest order) with how many one task runs.
#[derive(Debug, Clone)]
pub struct ArrayJob {
    pub job_name: String,
    pub comment: String,
    pub array: String,
    pub configs: Vec<ConfigHash>,
    pub configs_per_task: u32,
}

impl Submission {
    /// A submission not yet intended: its job array as rendered, the script
    /// at `remote_script` on the cluster. [`Change::Intent`](super::Change)
    /// makes it durable, with its time.
    pub fn new(id: String, job: ArrayJob, remote_script: String) -> Self {
        Submission {
            id,
            job_name: job.job_name,
            comment: job.comment,
            array: job.array,
            tasks: job.configs,
            configs_per_task: job.configs_per_task.max(1),
            intended_at: 0.0,
            array_job_id: None,
            submitted_at: None,
            abandoned: false,
            remote_script,
            intent: IntentState::Intended,
        }
    }

    /// The array task that runs config `index` of [`Submission::tasks`].
    pub fn task_of(&self, index: usize) -> u32 {
        (index / self.configs_per_task.max(1) as usize) as u32
    }

    /// The hashes of the configs array task `task` runs, in order (empty
    /// for a task outside the array).
    pub fn configs_of(&self, task: u32) -> &[ConfigHash] {
        let k = self.configs_per_task.max(1) as usize;
        let first = (task as usize).saturating_mul(k).min(self.tasks.len());
        &self.tasks[first..first.saturating_add(k).min(self.tasks.len())]
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

#[cfg(test)]
mod tests {
    use super::*;

    fn record(hash: &str) -> ConfigRecord {
        ConfigRecord::new(hash, hash)
    }

    #[test]
    fn configs_share_a_task_k_at_a_time_and_each_gets_its_own_attempt() {
        let job = ArrayJob {
            job_name: "n".into(),
            comment: "c".into(),
            array: "0-1".into(),
            configs: ["a", "b", "c"].map(ConfigHash::from).to_vec(),
            configs_per_task: 2,
        };
        let s = Submission::new("s001-x".into(), job, "/x".into());
        assert_eq!((s.task_of(0), s.task_of(1), s.task_of(2)), (0, 0, 1));
        assert_eq!(s.configs_of(0), ["a", "b"]);
        assert_eq!(s.configs_of(1), ["c"]);
        assert!(s.configs_of(2).is_empty(), "outside the array");
        let mut b = record("b");
        assert!(s.settle(&mut b, s.task_of(1)));
        assert_eq!((b.attempts.len(), b.attempts[0].task_id), (1, 0));
        assert!(!s.settle(&mut b, s.task_of(1)), "settled once");
        // Written with the field, read back; a file without it is one config a task.
        let json = serde_json::to_value(&s).expect("json");
        assert_eq!(json["configs_per_task"], 2);
        let mut old = json.clone();
        old.as_object_mut().expect("object").remove("configs_per_task");
        let old: Submission = serde_json::from_value(old).expect("an older submission.json");
        assert_eq!((old.configs_per_task, old.task_of(2)), (1, 2));
        assert!(serde_json::to_value(&old).expect("json").get("configs_per_task").is_none());
    }
}
