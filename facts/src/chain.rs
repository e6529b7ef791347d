//! A chained run: a command longer than the cluster's time limit (a training
//! run of days under 12-hour jobs) runs as segments. Before the limit SLURM
//! signals the job; the command saves its checkpoint and exits; the worker
//! writes the segment's end ([`SegmentEnd`]) and asks SLURM to requeue the
//! job, so the next segment is the same job id, started again from the top of
//! its script, and resumes from the checkpoint.

use serde::{Deserialize, Serialize};

/// Which segment a run is, of how many at most (`start`'s `env.chain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainPosition {
    /// 1 for the first segment of the config's chain.
    pub segment: u32,
    pub max_segments: u32,
}

/// A segment that ended with the chain still to go on (`event: segment`).
/// A chain's last segment writes a `result` instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegmentEnd {
    pub t: f64,
    pub segment: u32,
    pub max_segments: u32,
    pub wall_s: f64,
    /// The segment's memory peak (the run's meter).
    pub peak_bytes: u64,
    /// Whether the checkpoint file was there when the command exited.
    pub checkpoint: bool,
    /// The command's last progress line (`epoch 12/500`), where it prints one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    pub next: SegmentNext,
}

/// How the chain goes on after a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "how", rename_all = "snake_case")]
pub enum SegmentNext {
    /// Written before the worker asks SLURM to requeue its job: the next
    /// segment is this job again (same id; SLURM never runs it twice at once).
    Requeue,
    /// The chain cannot go on by itself (`reason`: the requeue was refused):
    /// the orchestrator's `resume` continues it from the checkpoint.
    Resume { reason: String },
}
