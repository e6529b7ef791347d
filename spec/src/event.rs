//! The worker's event stream: one JSON object per line in
//! `<state>/<experiment>/runs/<config>/events.jsonl`, flushed per line, so the
//! orchestrator can show live progress and nothing measured is lost if the job dies.

use serde::{Deserialize, Serialize};

/// What the profiler is doing, in the reports' order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Building the model (weights on the device).
    Model,
    /// Forward pass.
    Fwd,
    /// Loss and backward pass.
    Bwd,
    /// One AdamW step.
    Step,
}

impl Phase {
    pub const ALL: [Phase; 4] = [Phase::Model, Phase::Fwd, Phase::Bwd, Phase::Step];
    pub fn name(self) -> &'static str {
        match self {
            Phase::Model => "model",
            Phase::Fwd => "fwd",
            Phase::Bwd => "bwd",
            Phase::Step => "step",
        }
    }
}

/// How a run ended. `Oom` and `Failed` are results, not crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Ok,
    Oom,
    Failed,
    Cancelled,
}

/// Peak bytes seen per phase (absent where the phase was not reached).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhasePeaks {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwd: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
}

/// Where the run happened: enough to put a hardware/software header on a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEnvironment {
    pub host: String,
    /// `cpu`, or the GPU's name as NVML reports it.
    pub device: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// Burn backend (`flex`, `cuda`, `wgpu`).
    pub backend: String,
    /// Float dtype on the device (`f32`, `bf16`).
    pub dtype: String,
    pub grad_ckpt: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_array_task_id: Option<String>,
}

/// One line of `events.jsonl`. `t` is seconds since the Unix epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Start {
        t: f64,
        config: String,
        config_hash: crate::run::ConfigHash,
        env: RunEnvironment,
    },
    Heartbeat {
        t: f64,
        phase: Phase,
        current_bytes: u64,
        peak_bytes: u64,
    },
    PhaseEnd {
        t: f64,
        phase: Phase,
        peak_bytes: u64,
        seconds: f64,
    },
    Result {
        t: f64,
        status: RunStatus,
        params: u64,
        peaks: PhasePeaks,
        peak_bytes: u64,
        /// The phase the run was in when it stopped (for oom/failed/cancelled).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        phase: Option<Phase>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        wall_s: f64,
    },
}
