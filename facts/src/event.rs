//! The worker's event stream: one JSON object per line in
//! `<state>/<experiment>/runs/<hash>/events.jsonl`, flushed per line, so the
//! orchestrator can show live progress and nothing measured is lost if the job dies.

use serde::{Deserialize, Serialize};

pub use crate::peaks::PhasePeaks;

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

impl RunStatus {
    /// `ok`, `oom`, `failed`, `cancelled`: as the events write it.
    pub fn name(self) -> &'static str {
        match self {
            RunStatus::Ok => "ok",
            RunStatus::Oom => "oom",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }
}

/// The `backend` of a run whose `start` event `worker watch` wrote: a user's
/// command, not a Burn runtime (its peak calibrates nothing).
pub const COMMAND_BACKEND: &str = "command";

/// Which meter a run's `peak_bytes` come from, so a report can say what its
/// numbers are (they are not the same quantity on CPU and GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryMeter {
    /// The worker's tracking global allocator: exact live heap bytes (CPU backends).
    HostAllocator,
    /// CubeCL's memory pool, bytes in use plus padding, sampled every few ms
    /// (GPU backends; the analogue of `torch.cuda.max_memory_allocated`).
    CubeclPool,
    /// `worker watch`: resident memory (RSS) of the watched command's process
    /// tree, summed over its processes and sampled (a CPU node: host memory,
    /// not a GPU's).
    ProcessTreeRss,
    /// `worker watch` on a GPU: NVML's used memory of the watched command's
    /// processes, sampled (the driver's view: contexts and cached blocks included).
    NvmlProcesses,
}

impl MemoryMeter {
    /// Words for a report header.
    pub fn describe(self) -> &'static str {
        match self {
            MemoryMeter::HostAllocator => "host allocator, exact live bytes",
            MemoryMeter::CubeclPool => "CubeCL memory pool in use, sampled",
            MemoryMeter::ProcessTreeRss => "the command's resident memory (RSS, process tree, host), sampled",
            MemoryMeter::NvmlProcesses => "the command's GPU memory (NVML, its processes), sampled",
        }
    }
}

/// How attention ran, which decides whether heads x N x N scores are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttentionKernel {
    /// Matmul + softmax with the score tensor materialised and kept for
    /// backward (Burn's attention under autodiff on the CPU backend).
    Materialised,
    /// The old GPU records' claim that CubeCL's fused backends did not keep
    /// the scores (one H100 run, very probably a failed allocation recorded
    /// `ok` before the worker read values back; docs/gpu.md). Kept to read them.
    Fused,
    /// The worker's memory-efficient attention (the flash-attention algorithm,
    /// what PyTorch's SDPA runs): q, k, v, the output and the row log-sum-exp
    /// kept for backward, scores recomputed chunk by chunk.
    MemoryEfficient,
}

/// Gradient checkpointing as it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Checkpointing {
    Off,
    /// Burn's op-level `Balanced` strategy: memory-bound ops are recomputed in
    /// backward, compute-bound ones (matmul, conv) keep their outputs. Written
    /// by earlier workers (read in their events); no worker runs it now.
    BurnBalanced,
    /// Per block, as `torch.utils.checkpoint` around each transformer block and
    /// each UNet level block in the group's runs: a block keeps only its inputs
    /// and is recomputed in backward.
    Block,
    /// Asked for, but the model ran without it: written by workers before the
    /// UNet was checkpointed per level block (read in their events); no
    /// worker writes it now.
    NoneInModel,
}

/// How float types are used across a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DtypePolicy {
    /// Every float tensor, parameters and optimizer state included, in `dtype`.
    Uniform,
    /// PyTorch's autocast: f32 parameters, gradients and AdamW state;
    /// convolutions, linears and matmuls in `dtype` (their half inputs kept for
    /// backward); norms, softmax and the loss in f32.
    Autocast,
}

/// The kernel cache a run found (`worker run --cache-dir`): what its phases'
/// seconds include. On a GPU backend a `fresh` (or `replaced`) cache means
/// every kernel was compiled (and matmuls autotuned) inside the phases; a
/// `reused` one, only the kernels no earlier run on the node had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheState {
    /// Nothing cached yet on this node for this worker version.
    Fresh,
    /// This worker version's cache on this node, reused.
    Reused,
    /// A corrupt or foreign cache was moved aside; a fresh one was used.
    Replaced,
    /// The cache could not be prepared or given to CubeCL: nothing cached.
    Unusable,
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
    /// The float dtype the run computes in (`f32`, `bf16`, `f16`; under
    /// autocast the half type of its convolutions, linears and matmuls).
    pub dtype: String,
    pub grad_ckpt: bool,
    /// The dtype the experiment asked for, when the device could not run it
    /// and `dtype` is the fallback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_dtype: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpointing: Option<Checkpointing>,
    /// How `dtype` is applied (absent in events written before autocast).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype_policy: Option<DtypePolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<AttentionKernel>,
    /// The meter behind every `peak_bytes` of this run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meter: Option<MemoryMeter>,
    /// Total memory of the device (GPU: NVML's total), for scoring an OOM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_memory_bytes: Option<u64>,
    /// A memory limit the worker enforced (`--memory-limit`), for scoring an OOM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
    /// The kernel cache the run found (absent: run without `--cache-dir`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_cache: Option<CacheState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_array_task_id: Option<String>,
    /// A chained run's segment (`worker watch --chain`), absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<crate::chain::ChainPosition>,
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
        /// A watched command's last progress line (`epoch 12/500`), where it prints one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        progress: Option<String>,
    },
    PhaseEnd {
        t: f64,
        phase: Phase,
        peak_bytes: u64,
        seconds: f64,
        /// The second meter on GPU: NVML's used memory of this process, peak
        /// of the phase (the driver's view: pool reservations and contexts included).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nvml_bytes: Option<u64>,
        /// The value the phase read back from the device (parameter checksum
        /// after `model` and `step`, output mean after `fwd`, gradient norm
        /// after `bwd`): proof that the phase's kernels ran. Absent in events
        /// written before the worker read back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        readback: Option<f64>,
        /// Which training step the phase belongs to (0 first; absent for
        /// `model` and in events written before it). On a GPU backend the
        /// first step's `seconds` include compiling (and autotuning) every
        /// kernel not in the node's cache; a later step's are the phase's own
        /// work: with `mode: train` and `steps: 2` their difference is the
        /// compile share (worker/README.md).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u32>,
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
        /// NVML's per-process used memory, peak over the run (GPU backends with NVML).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nvml_peak_bytes: Option<u64>,
        /// CPU backends: the same allocations as PyTorch's CUDA caching
        /// allocator would count them (`max_memory_allocated`: blocks, not
        /// bytes asked for; see the worker's `caching` module). Absent on a GPU
        /// and where the run was not traced.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        as_pytorch_counts: Option<PhasePeaks>,
        /// The figures the script of the run's protocol printed (`worker run
        /// --protocol`, not the project's own): the group's columns beside
        /// the per-phase `peaks`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        group: Option<crate::protocol::GroupColumns>,
    },
    /// A chained run's segment ended and the chain goes on ([`crate::chain`]).
    Segment(crate::chain::SegmentEnd),
}

/// The final word of a run: the fields of [`Event::Result`] as one type, for
/// everything that keeps or reads a result (the orchestrator's collection,
/// its state directory and its reports). It serialises as the worker's
/// `result` line itself (`{"event": "result", ...}`), so a stored result and
/// the line it came from are the same JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "Event", try_from = "Event")]
pub struct RunResult {
    pub t: f64,
    pub status: RunStatus,
    pub params: u64,
    pub peaks: PhasePeaks,
    pub peak_bytes: u64,
    /// The phase the run was in when it stopped (for oom/failed/cancelled).
    pub phase: Option<Phase>,
    pub message: Option<String>,
    pub wall_s: f64,
    /// NVML's per-process used memory, peak over the run (GPU backends with NVML).
    pub nvml_peak_bytes: Option<u64>,
    /// The run's peaks as PyTorch's CUDA caching allocator would count them (CPU backends).
    pub as_pytorch_counts: Option<PhasePeaks>,
    /// The figures the script of the run's protocol printed.
    pub group: Option<crate::protocol::GroupColumns>,
}

impl From<RunResult> for Event {
    fn from(r: RunResult) -> Event {
        let RunResult {
            t,
            status,
            params,
            peaks,
            peak_bytes,
            phase,
            message,
            wall_s,
            nvml_peak_bytes,
            as_pytorch_counts,
            group,
        } = r;
        Event::Result {
            t,
            status,
            params,
            peaks,
            peak_bytes,
            phase,
            message,
            wall_s,
            nvml_peak_bytes,
            as_pytorch_counts,
            group,
        }
    }
}

/// An event other than `result` where a result was expected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("expected a `result` event")]
pub struct NotAResult;

impl TryFrom<Event> for RunResult {
    type Error = NotAResult;
    fn try_from(e: Event) -> Result<RunResult, NotAResult> {
        match e {
            Event::Result {
                t,
                status,
                params,
                peaks,
                peak_bytes,
                phase,
                message,
                wall_s,
                nvml_peak_bytes,
                as_pytorch_counts,
                group,
            } => Ok(RunResult {
                t,
                status,
                params,
                peaks,
                peak_bytes,
                phase,
                message,
                wall_s,
                nvml_peak_bytes,
                as_pytorch_counts,
                group,
            }),
            _ => Err(NotAResult),
        }
    }
}

#[cfg(test)]
mod result_tests {
    use super::*;

    #[test]
    fn a_result_is_the_result_line_itself() {
        let line = r#"{"event":"result","t":3.0,"status":"oom","params":1,"peaks":{"fwd":7},"peak_bytes":4096,"phase":"bwd","wall_s":2.0}"#;
        let r: RunResult = serde_json::from_str(line).expect("parses");
        assert_eq!(r.status, RunStatus::Oom);
        assert_eq!(r.phase, Some(Phase::Bwd));
        let back: serde_json::Value = serde_json::to_value(&r).expect("serialises");
        assert_eq!(back, serde_json::from_str::<serde_json::Value>(line).expect("json"));
        let start = r#"{"event":"heartbeat","t":1.0,"phase":"fwd","current_bytes":1,"peak_bytes":2}"#;
        assert!(serde_json::from_str::<RunResult>(start).is_err(), "only a result is a result");
    }
}
