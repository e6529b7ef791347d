//! Which ended jobs run again: the retry rule of `resume`.

use serde::{Deserialize, Serialize};

use super::SlurmState;
use crate::collect::WorkerOutcome;

/// Which ended jobs `resume` submits again. A config that completed, ran out of
/// memory in the worker's own measurement, or is still queued/running is
/// never resubmitted, whatever the policy. [`RetryPolicy::refusal`] is the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// TIMEOUT: retried by default, since the usual fix is a longer `slurm.time`
    /// in the experiment file, which a resubmission picks up.
    pub timeout: bool,
    /// CANCELLED by `scancel` or an admin: retried by default, since `resume`
    /// after such a cancel means "carry on".
    pub cancelled: bool,
    /// CANCELLED by this tool's `cancel`: not by default (`--retry-cancelled`):
    /// a person stopped those jobs, and `resume` does not undo that unasked.
    #[serde(default)]
    pub cancelled_by_cancel: bool,
    /// A real error: the worker recorded `failed`, or the job script FAILED
    /// before the worker started (missing binary, unreadable manifest). Not by
    /// default; such a crash recurs.
    pub failed: bool,
    /// The worker was killed from outside before it could write a result
    /// (SIGKILL, the host's OOM killer: FAILED or OUT_OF_MEMORY without a
    /// `result` line). Retried by default: nothing was measured, and the
    /// cause is usually the node, not the config.
    #[serde(default = "yes")]
    pub killed: bool,
    /// Attempts per config, the first included.
    pub max_attempts: u32,
}

fn yes() -> bool {
    true
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            timeout: true,
            cancelled: true,
            cancelled_by_cancel: false,
            failed: false,
            killed: true,
            max_attempts: 3,
        }
    }
}

impl RetryPolicy {
    /// Whether a job that ended in `state` may run again, by SLURM's state
    /// alone. NODE_FAIL, PREEMPTED and BOOT_FAIL are the cluster's fault:
    /// always retryable. OUT_OF_MEMORY (host RAM, cgroup) and DEADLINE would
    /// recur: never.
    pub fn retryable(&self, state: &SlurmState) -> bool {
        match state {
            SlurmState::NodeFail | SlurmState::Preempted | SlurmState::BootFail => true,
            SlurmState::Timeout => self.timeout,
            SlurmState::Cancelled => self.cancelled,
            SlurmState::Failed => self.failed,
            SlurmState::Completed | SlurmState::OutOfMemory | SlurmState::Deadline => false,
            SlurmState::Other(_) => false,
            SlurmState::Pending | SlurmState::Running | SlurmState::Requeued | SlurmState::Suspended => false,
        }
    }

    /// Why an attempt that ended in `state` must not run again, or `None` when
    /// it may. The one place SLURM's state and the worker's result meet; the
    /// worker's result wins because it knows what happened inside the job:
    ///
    /// | worker says | SLURM state | resubmitted |
    /// |---|---|---|
    /// | `ok` | any | never (completed) |
    /// | `oom` | any (FAILED: exit 3) | never (measured OOM) |
    /// | `failed` | any | with `--retry-failed` |
    /// | `cancelled` | TIMEOUT / other | per `timeout` / `cancelled` |
    /// | a chain's segment ended, the chain to go on | any | yes: continued from its checkpoint |
    /// | started, no result | FAILED, OUT_OF_MEMORY | yes, unless `--no-retry-killed` (killed) |
    /// | not started | OUT_OF_MEMORY | yes, unless `--no-retry-killed` (killed) |
    /// | no result | any other | by the state ([`Self::retryable`]) |
    pub fn refusal(&self, state: &SlurmState, worker: WorkerOutcome) -> Option<String> {
        use facts::event::RunStatus;
        let killed = matches!(
            (worker, state),
            (WorkerOutcome::NoResult, SlurmState::Failed | SlurmState::OutOfMemory)
                | (WorkerOutcome::NotStarted, SlurmState::OutOfMemory)
        );
        match worker {
            WorkerOutcome::Result(RunStatus::Ok) => Some("completed".into()),
            // Saved and stopped for the time limit, and not requeued (SLURM
            // refused, or the job was held): nothing failed, the chain goes on.
            WorkerOutcome::SegmentEnded => None,
            WorkerOutcome::Result(RunStatus::Oom) => Some("measured oom".into()),
            WorkerOutcome::Result(RunStatus::Failed) => {
                (!self.failed).then(|| format!("worker failed, job {state} (use --retry-failed)"))
            }
            WorkerOutcome::Result(RunStatus::Cancelled) => {
                let (allowed, flag) = match state {
                    SlurmState::Timeout => (self.timeout, "--no-retry-timeout"),
                    _ => (self.cancelled, "--no-retry-cancelled"),
                };
                (!allowed).then(|| format!("worker cancelled, job {state} ({flag})"))
            }
            _ if killed => (!self.killed).then(|| format!("worker killed, job {state} (--no-retry-killed)")),
            _ if self.retryable(state) => None,
            WorkerOutcome::NotStarted if *state == SlurmState::Failed => {
                Some(format!("ended {state} before the worker started (use --retry-failed)"))
            }
            _ => Some(format!("ended {state}")),
        }
    }
}
