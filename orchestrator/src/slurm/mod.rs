//! SLURM's vocabulary: job states, how the orchestrator acts on each, the
//! command lines it runs, and parsers for what `squeue`, `sacct`, `sbatch` and
//! `scontrol` print.
//!
//! Everything here is pure text in, data out, so the unit tests run on output
//! recorded from a real cluster (SLURM 22.05) without one.

use serde::{Deserialize, Serialize};
use std::fmt;

mod commands;
mod retry;

pub use commands::{
    array_spec, chunks, expand_ranges, merge, parse_max_array_size, parse_sacct, parse_sbatch, parse_squeue,
    sacct_argv, sbatch_argv, scancel_argv, scontrol_config_argv, slug, squeue_argv, ParseError, SACCT_FORMAT,
    SQUEUE_FORMAT,
};
pub use retry::RetryPolicy;

/// Every state SLURM reports for a job (squeue `%T`, sacct `State`).
///
/// The thirteen the orchestrator acts on are named; the transient or rare rest
/// (`COMPLETING`, `CONFIGURING`, `STAGE_OUT`, `SIGNALING`, `RESIZING`,
/// `REQUEUE_HOLD`, `REQUEUE_FED`, `RESV_DEL_HOLD`, `SPECIAL_EXIT`, `STOPPED`,
/// `REVOKED`) are kept verbatim and mapped by [`SlurmState::activity`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SlurmState {
    Pending,
    Running,
    Requeued,
    Suspended,
    Preempted,
    Completed,
    Failed,
    Timeout,
    OutOfMemory,
    NodeFail,
    Cancelled,
    BootFail,
    Deadline,
    Other(String),
}

/// Where a job is in its life, which is what decides what `resume` may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activity {
    /// Waiting for resources (pending, requeued, held).
    Queued,
    /// Holding resources (running, suspended, completing).
    Running,
    /// Finished, one way or another.
    Ended,
}

impl SlurmState {
    pub fn name(&self) -> &str {
        match self {
            SlurmState::Pending => "PENDING",
            SlurmState::Running => "RUNNING",
            SlurmState::Requeued => "REQUEUED",
            SlurmState::Suspended => "SUSPENDED",
            SlurmState::Preempted => "PREEMPTED",
            SlurmState::Completed => "COMPLETED",
            SlurmState::Failed => "FAILED",
            SlurmState::Timeout => "TIMEOUT",
            SlurmState::OutOfMemory => "OUT_OF_MEMORY",
            SlurmState::NodeFail => "NODE_FAIL",
            SlurmState::Cancelled => "CANCELLED",
            SlurmState::BootFail => "BOOT_FAIL",
            SlurmState::Deadline => "DEADLINE",
            SlurmState::Other(s) => s,
        }
    }

    /// Parses a long name (`CANCELLED by 1000`, `RUNNING`) or a squeue short code
    /// (`PD`, `CA`). Never fails: an unknown state is kept as `Other`.
    pub fn parse(text: &str) -> SlurmState {
        // sacct appends who cancelled ("CANCELLED by 0") and `+` for a requeued job.
        let word = text.split_whitespace().next().unwrap_or("").trim_end_matches('+');
        match word.to_ascii_uppercase().as_str() {
            "PENDING" | "PD" => SlurmState::Pending,
            "RUNNING" | "R" => SlurmState::Running,
            "REQUEUED" | "RQ" => SlurmState::Requeued,
            "SUSPENDED" | "S" => SlurmState::Suspended,
            "PREEMPTED" | "PR" => SlurmState::Preempted,
            "COMPLETED" | "CD" => SlurmState::Completed,
            "FAILED" | "F" => SlurmState::Failed,
            "TIMEOUT" | "TO" => SlurmState::Timeout,
            "OUT_OF_MEMORY" | "OUT_OF_ME" | "OOM" => SlurmState::OutOfMemory,
            "NODE_FAIL" | "NF" => SlurmState::NodeFail,
            "CANCELLED" | "CA" => SlurmState::Cancelled,
            "BOOT_FAIL" | "BF" => SlurmState::BootFail,
            "DEADLINE" | "DL" => SlurmState::Deadline,
            "CG" => SlurmState::Other("COMPLETING".into()),
            "CF" => SlurmState::Other("CONFIGURING".into()),
            "SE" => SlurmState::Other("SPECIAL_EXIT".into()),
            "SO" => SlurmState::Other("STAGE_OUT".into()),
            "ST" => SlurmState::Other("STOPPED".into()),
            "SI" => SlurmState::Other("SIGNALING".into()),
            "RH" => SlurmState::Other("REQUEUE_HOLD".into()),
            "RF" => SlurmState::Other("REQUEUE_FED".into()),
            "RD" => SlurmState::Other("RESV_DEL_HOLD".into()),
            "RS" => SlurmState::Other("RESIZING".into()),
            "RV" => SlurmState::Other("REVOKED".into()),
            other => SlurmState::Other(other.to_string()),
        }
    }

    pub fn activity(&self) -> Activity {
        match self {
            SlurmState::Pending | SlurmState::Requeued => Activity::Queued,
            SlurmState::Running | SlurmState::Suspended => Activity::Running,
            SlurmState::Preempted
            | SlurmState::Completed
            | SlurmState::Failed
            | SlurmState::Timeout
            | SlurmState::OutOfMemory
            | SlurmState::NodeFail
            | SlurmState::Cancelled
            | SlurmState::BootFail
            | SlurmState::Deadline => Activity::Ended,
            SlurmState::Other(s) => match s.as_str() {
                // Still holding the node, or about to.
                "COMPLETING" | "CONFIGURING" | "STAGE_OUT" | "SIGNALING" | "RESIZING" | "STOPPED" => Activity::Running,
                // Held in the queue (a requeue that waits for release).
                "REQUEUE_HOLD" | "REQUEUE_FED" | "RESV_DEL_HOLD" | "SPECIAL_EXIT" => Activity::Queued,
                // REVOKED (federation) and anything newer: the job is not ours to wait for.
                _ => Activity::Ended,
            },
        }
    }

    pub fn is_ended(&self) -> bool {
        self.activity() == Activity::Ended
    }
}

impl fmt::Display for SlurmState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for SlurmState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for SlurmState {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(SlurmState::parse(&s))
    }
}

/// A SLURM job id: an array's (`34`), an array task's own (`37`), or one
/// task of an array (`34_2`, for `scancel`). Kept as SLURM prints it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(String);

impl JobId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for JobId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<&str> for JobId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<JobId> for &str {
    fn eq(&self, other: &JobId) -> bool {
        *self == other.0
    }
}

impl From<&str> for JobId {
    fn from(s: &str) -> JobId {
        JobId(s.to_string())
    }
}

impl From<String> for JobId {
    fn from(s: String) -> JobId {
        JobId(s)
    }
}

/// One array task as `squeue` or `sacct` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskObservation {
    /// The array's job id (`%F`, the part of `JobID` before `_`).
    pub array_job_id: JobId,
    pub task_id: u32,
    /// The task's own job id (`%A` / `JobIDRaw`), once SLURM has given it one.
    pub job_id: Option<JobId>,
    pub name: String,
    pub state: SlurmState,
    /// Why it is pending (squeue), or the exit code `N:S` (sacct).
    pub detail: Option<String>,
}

#[cfg(test)]
mod tests;
