//! One profiled run: the phases the group's profiler measures, with every
//! outcome recorded as a result event.
//!
//! Phases, each with its own peak window (reset at the phase start):
//! `model` (build; weights materialised), `fwd` (forward at the batch size),
//! `bwd` (MSE loss against a random target, backward), `step` (one AdamW step).
//! `train` mode repeats fwd/bwd/step `steps` times, keeping the largest peak of
//! each phase.
//!
//! Outcomes: `ok`; `oom` when an allocation fails (the CPU allocator's limit, or
//! a GPU allocation error); `failed` on any other error or panic, with its
//! message; `cancelled` on SIGTERM/SIGINT (SLURM time limit, `scancel`). Exactly
//! one result line is written per attempt: whoever flips [`Progress::finished`]
//! first writes it.
//!
//! The allocator's OOM hook cannot unwind or allocate (see [`crate::alloc`]), so
//! it formats the result into a stack buffer from the atomics in [`PROGRESS`],
//! writes it with `write(2)` and leaves with `_exit(2)`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::FloatDType;
use facts::event::{AttentionKernel, CacheState, Checkpointing, Event, Phase, RunResult, RunStatus};
use facts::protocol::Protocol;
use facts::{Mode, RunConfig};

use crate::alloc;
use crate::backend::{self, Backend};
use crate::events::{events_path, now, EventLog};
use crate::meter::Meter;
use crate::models::amp::Autocast;
use crate::models::checkpoint::Tape;
use crate::models::Model;
use crate::optim::ForeachAdamW;

pub(crate) mod environment;
mod failure;
mod panics;
mod progress;
mod readback;

use environment::run_environment;
use failure::{classify, panic_message};

use progress::{current_phase, oom_hook, peaks_so_far, phase_index, NONE, PROGRESS, SETUP};

/// Exit codes of `worker run`: the result is in the event stream either way;
/// these let a plain shell or SLURM tell the outcomes apart.
pub const EXIT_OK: i32 = 0;
pub const EXIT_FAILED: i32 = 1;
pub const EXIT_OOM: i32 = 3;
pub const EXIT_CANCELLED: i32 = 143;

/// Heartbeat interval.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// Options of one run besides the config.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub state_dir: PathBuf,
    pub backend: Backend,
    /// Refuse allocations above this many live bytes (CPU allocator; GPU pool on GPU backends).
    pub memory_limit: Option<u64>,
    /// Seconds between heartbeats (1 in production; tests may shorten it).
    pub heartbeat: Duration,
    /// The transformer families' attention kernel (the UNet's is always
    /// materialised, as MONAI's is): memory-efficient by default, as PyTorch's SDPA.
    pub attention: AttentionKernel,
    /// The kernel cache this process was pointed at, as found (`--cache-dir`;
    /// see [`crate::cache`]), for the `start` event.
    pub kernel_cache: Option<CacheState>,
    /// Whose measurement: the loss, and the figures the result carries beside its peaks.
    pub protocol: Protocol,
}

impl RunOptions {
    pub fn new(state_dir: impl Into<PathBuf>, backend: Backend) -> Self {
        RunOptions {
            state_dir: state_dir.into(),
            backend,
            memory_limit: None,
            heartbeat: HEARTBEAT,
            attention: AttentionKernel::MemoryEfficient,
            kernel_cache: None,
            protocol: Protocol::Project,
        }
    }
}

/// What a run ended with: the result it wrote as its last event (the spec's
/// [`RunResult`], the one definition of that line), and where the events are.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub result: RunResult,
    pub events: PathBuf,
}

impl Outcome {
    pub fn exit_code(&self) -> i32 {
        match self.result.status {
            RunStatus::Ok => EXIT_OK,
            RunStatus::Oom => EXIT_OOM,
            RunStatus::Failed => EXIT_FAILED,
            RunStatus::Cancelled => EXIT_CANCELLED,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot write events to {path}: {source}")]
    Events { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Backend(#[from] backend::BackendError),
}

/// Touch every parameter so Burn's lazy initialisation happens inside the
/// `model` phase (otherwise the weights would appear in `fwd`).
struct Materialise;
impl ModuleVisitor for Materialise {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let _ = param.val();
    }
}

/// Run `cfg` to its end and record it. Returns the outcome unless the event file
/// itself cannot be written (nothing could be recorded then). An OOM under the
/// CPU limit and SIGTERM end the process from inside (after writing the result).
pub fn run(cfg: &RunConfig, opts: &RunOptions) -> Result<Outcome, RunError> {
    run_with_setup(cfg, opts, || backend::prepare(opts.backend, cfg.precision))
}

/// How a config's `grad_ckpt` runs: per block, as the group's runs wrap their
/// models in `torch.utils.checkpoint`: each transformer block, and each UNet
/// level block (`profile_pixel_3d_unet.py@b8e04ab:32-48`, `models/unet.rs`).
fn checkpointing_of(cfg: &RunConfig) -> Checkpointing {
    match cfg.grad_ckpt {
        false => Checkpointing::Off,
        true => Checkpointing::Block,
    }
}

/// [`run`] with the device setup given, so tests can make it fail as a node
/// without a GPU or driver does.
fn run_with_setup(
    cfg: &RunConfig,
    opts: &RunOptions,
    setup: impl FnOnce() -> Result<backend::Prepared, backend::BackendError>,
) -> Result<Outcome, RunError> {
    let path = events_path(&opts.state_dir, cfg);
    let log = Arc::new(EventLog::open(&path).map_err(|source| RunError::Events { path: path.clone(), source })?);
    // SIGTERM is watched before anything else: a process that has written
    // its `start` must record `cancelled`, even while it sets its device up.
    start_signal_watcher();
    let ev_err = |source| RunError::Events { path: path.clone(), source };

    let start = now();
    let params = facts::params::count(&cfg.model, &cfg.input, cfg.out_channels).unwrap_or(0);
    reset_progress(opts, &log, start, params);
    // A driver that crashes (SIGSEGV, SIGBUS, SIGABRT) while the device is set
    // up, or later in a phase, still leaves a result.
    progress::install_crash_handlers();
    // From here a SIGTERM is recorded (`cancelled`, "during device setup"
    // until a phase begins): set before the `start` line, so no signal can
    // fall between that line and its run becoming the one to record.
    set_current(Some((log.clone(), None)));

    let prepared = set_up(opts.backend, setup);
    let env = run_environment(cfg, opts, &prepared);
    log.emit(&Event::Start { t: start, config: cfg.name.clone(), config_hash: cfg.hash(), env }).map_err(ev_err)?;

    let (device, autocast) = match prepared {
        Ok(p) => (p.device, p.autocast),
        Err(msg) => {
            let out = finish(&log, &path, params, start, Measured::default(), Err((RunStatus::Failed, msg)));
            set_current(None);
            return out;
        }
    };

    let meter = Arc::new(Meter::new(opts.backend.is_gpu(), &device, opts.memory_limit, oom_hook));
    // The hook also catches a failed host allocation without a limit (a node
    // out of RAM), which Rust would otherwise turn into an abort with no result.
    alloc::set_oom_hook(Some(oom_hook));
    if !opts.backend.is_gpu() {
        // Every allocation is also traced, to count it as PyTorch's CUDA
        // allocator would (`crate::caching`); no trace (mapping refused), no count.
        alloc::trace_start();
        alloc::set_limit(opts.memory_limit);
    }
    set_current(Some((log.clone(), Some(meter.clone()))));
    let beating = Arc::new(AtomicBool::new(true));
    let heartbeat = spawn_heartbeat(log.clone(), meter.clone(), beating.clone(), opts.heartbeat);

    let kernels = Kernels {
        attention: attention_of(cfg, opts),
        autocast,
        block_checkpoints: checkpointing_of(cfg) == Checkpointing::Block,
        protocol: opts.protocol,
    };
    // A phase's failure, too, is the first panic on any thread where there is one.
    let watch = panics::Watch::start();
    let result = catch_unwind(AssertUnwindSafe(|| phases(cfg, kernels, &device, &meter, &log)));
    alloc::set_limit(None);
    let as_pytorch_counts = alloc::trace_stop().map(|t| crate::caching::replay(&t));
    beating.store(false, Ordering::Relaxed);
    if let Some(h) = heartbeat {
        let _ = h.join();
    }
    let (ended, after_build) = match result {
        Ok(Ok(held)) => (Ok(()), Some(held)),
        Ok(Err(msg)) => (Err(classify(&watch.explain(&msg))), None),
        Err(payload) => (Err(classify(&watch.explain(&panic_message(payload.as_ref())))), None),
    };
    drop(watch);
    // A GPU OOM ends the phase by error or panic; its open window's sampled
    // peak is the peak it reached.
    let live_peak = if opts.backend.is_gpu() { meter.peak() } else { alloc::peak() };
    if let Some(b) = meter.nvml_peak() {
        PROGRESS.nvml_peak.fetch_max(b, Ordering::Relaxed);
    }
    let measured =
        Measured { live_peak, as_pytorch_counts, held_after_build: after_build.map(|held| (opts.protocol, held)) };
    let out = finish(&log, &path, params, start, measured, ended);
    set_current(None);
    drop(meter);
    // Empty the pool for whatever runs next in this process (the next config
    // of a task: its peaks are measured from the bytes in use, see crate::task).
    device.memory_cleanup();
    out
}

/// Set the device up. It is the first thing to fail on a node without a GPU
/// or driver, often as a panic inside the backend, on a thread of its own:
/// guarded like the phases, the first panic on any thread kept as the cause,
/// and a missing adapter named with what the Vulkan loader was given.
fn set_up(
    backend: Backend,
    setup: impl FnOnce() -> Result<backend::Prepared, backend::BackendError>,
) -> Result<backend::Prepared, String> {
    let watch = panics::Watch::start();
    let named = |cause: String| crate::vulkan_driver::name_setup_failure(backend, cause);
    match catch_unwind(AssertUnwindSafe(setup)) {
        Ok(Ok(prepared)) => Ok(prepared),
        Ok(Err(e)) => Err(format!("device setup failed: {}", named(watch.explain(&e.to_string())))),
        Err(payload) => {
            Err(format!("device setup panicked: {}", named(watch.explain(&panic_message(payload.as_ref())))))
        }
    }
}

/// A fresh run in [`PROGRESS`]: no phase reached, nothing finished, this
/// run's start, event file, meter kind and limit.
fn reset_progress(opts: &RunOptions, log: &EventLog, start: f64, params: u64) {
    PROGRESS.start_bits.store(start.to_bits(), Ordering::Relaxed);
    PROGRESS.phase.store(SETUP, Ordering::Relaxed);
    for p in &PROGRESS.peaks {
        p.store(NONE, Ordering::Relaxed);
    }
    PROGRESS.finished.store(false, Ordering::SeqCst);
    PROGRESS.fd.store(log.raw_fd(), Ordering::Relaxed);
    PROGRESS.gpu.store(opts.backend.is_gpu(), Ordering::Relaxed);
    PROGRESS.limit.store(opts.memory_limit.unwrap_or(0), Ordering::Relaxed);
    PROGRESS.nvml_peak.store(0, Ordering::Relaxed);
    PROGRESS.pool_window_peak.store(0, Ordering::Relaxed);
    PROGRESS.params.store(params, Ordering::Relaxed);
}

/// What a run measured besides its closed phases, for [`finish`].
#[derive(Default)]
struct Measured {
    /// The open phase window's peak, counted where the run stopped early.
    live_peak: u64,
    /// The run's peaks as PyTorch's caching allocator would count them (CPU backends).
    as_pytorch_counts: Option<facts::event::PhasePeaks>,
    /// The protocol it ran under and the bytes held after the build, for
    /// the figures that protocol's script printed.
    held_after_build: Option<(Protocol, u64)>,
}

/// Write the result (unless the signal thread got there first) and build the outcome.
fn finish(
    log: &EventLog,
    path: &Path,
    params: u64,
    start: f64,
    measured: Measured,
    ended: Result<(), (RunStatus, String)>,
) -> Result<Outcome, RunError> {
    let Measured { live_peak, as_pytorch_counts, held_after_build } = measured;
    let (status, message) = match ended {
        Ok(()) => (RunStatus::Ok, None),
        Err((s, m)) => (s, Some(m)),
    };
    // Every phase closed on success: no open window to add.
    let (peaks, peak_bytes) = peaks_so_far(current_phase(), if status == RunStatus::Ok { 0 } else { live_peak });
    let nvml_peak_bytes = Some(PROGRESS.nvml_peak.load(Ordering::Relaxed)).filter(|&b| b > 0);
    let phase = (status != RunStatus::Ok).then(current_phase).flatten();
    let t = now();
    // Counted as PyTorch would only where every phase's window closed.
    let as_pytorch_counts = as_pytorch_counts.filter(|_| status == RunStatus::Ok);
    // The figures the protocol's script printed, for a run that ended ok.
    let group = held_after_build.filter(|_| status == RunStatus::Ok).and_then(|(p, held)| p.columns(&peaks, held));
    let result = RunResult {
        t,
        status,
        params,
        peaks,
        peak_bytes,
        phase,
        message,
        wall_s: t - start,
        nvml_peak_bytes,
        as_pytorch_counts,
        group,
    };
    if !PROGRESS.finished.swap(true, Ordering::SeqCst) {
        log.emit(&Event::from(result.clone()))
            .map_err(|source| RunError::Events { path: path.to_path_buf(), source })?;
    }
    Ok(Outcome { result, events: path.to_path_buf() })
}

/// Run `f` as phase `p`: fresh peak window, device synced at the end, peak
/// recorded, then `check` reads a value of the phase back from the device (see
/// [`readback`]): a phase whose value does not come back has failed, whatever
/// the sync said. The read-back runs after the peak is taken, so its few small
/// tensors are not counted in the phase.
fn phase<T>(
    p: Phase,
    step: Option<u32>,
    device: &Device,
    meter: &Meter,
    log: &EventLog,
    f: impl FnOnce() -> Result<T, String>,
    check: impl FnOnce(&T) -> readback::Readback,
) -> Result<T, String> {
    PROGRESS.phase.store(phase_index(p) as u8, Ordering::Relaxed);
    meter.reset_peak();
    alloc::trace_mark(Some(p));
    let t0 = Instant::now();
    let out = f()?;
    device.sync().map_err(|e| format!("{} phase: device error: {e}", p.name()))?;
    meter.sample();
    let peak = meter.peak();
    alloc::trace_mark(None);
    let nvml_bytes = meter.nvml_peak();
    if let Some(b) = nvml_bytes {
        PROGRESS.nvml_peak.fetch_max(b, Ordering::Relaxed);
    }
    let slot = &PROGRESS.peaks[phase_index(p)];
    let prev = slot.load(Ordering::Relaxed);
    slot.store(if prev == NONE { peak } else { prev.max(peak) }, Ordering::Relaxed);
    let seconds = t0.elapsed().as_secs_f64();
    let value = check(&out).map_err(|e| format!("{} phase: {e}", p.name()))?;
    let end =
        Event::PhaseEnd { t: now(), phase: p, peak_bytes: peak, seconds, nvml_bytes, readback: Some(value), step };
    let _ = log.emit(&end);
    Ok(out)
}

/// The attention kernel a config runs with: MONAI's UNet attention is
/// materialised; the transformer families use the run's choice.
fn attention_of(cfg: &RunConfig, opts: &RunOptions) -> AttentionKernel {
    match cfg.model {
        facts::ModelSpec::Unet(_) => AttentionKernel::Materialised,
        _ => opts.attention,
    }
}

/// How the model's layers compute: the attention kernel, autocast's half type,
/// and whether blocks are checkpointed.
#[derive(Debug, Clone, Copy)]
struct Kernels {
    attention: AttentionKernel,
    autocast: Option<FloatDType>,
    block_checkpoints: bool,
    protocol: Protocol,
}

/// The run's phases; returns the bytes held once the model was built (the
/// latent script's `Model` column).
fn phases(cfg: &RunConfig, kernels: Kernels, device: &Device, meter: &Meter, log: &EventLog) -> Result<u64, String> {
    // The model, and the bytes it holds once built (before the phase reads it back).
    let build = || {
        let m = Model::build(&cfg.model, &cfg.input, cfg.out_channels, kernels.attention, device)
            .map_err(|e| e.to_string())?;
        m.visit(&mut Materialise);
        device.sync().map_err(|e| format!("model phase: device error: {e}"))?;
        meter.sample();
        Ok((m, meter.current()))
    };
    let (mut model, after_build) = phase(Phase::Model, None, device, meter, log, build, |(m, _)| {
        readback::pool_holds_params(device, m)?;
        readback::param_checksum(m)
    })?;
    // PyTorch's default AdamW on CUDA: the multi-tensor step and its temporaries.
    let mut optim = ForeachAdamW::new();
    let steps = match cfg.mode {
        Mode::Profile => 1,
        Mode::Train => cfg.steps.max(1),
    };
    let [d, h, w] = cfg.input.spatial.dims();
    let shape = [cfg.batch as usize, cfg.input.channels as usize, d as usize, h as usize, w as usize];
    for step in 0..steps {
        let at = Some(step);
        let forward = || {
            let x = Tensor::<5>::random(shape, burn::tensor::Distribution::Normal(0.0, 1.0), device);
            let t: Vec<f32> = (0..cfg.batch).map(|i| ((step * 7919 + i * 104_729) % 1000) as f32).collect();
            let _autocast = Autocast::enter(kernels.autocast);
            let mut tape = Tape::new(kernels.block_checkpoints);
            let out = model.forward(x.clone(), &t, &mut tape);
            Ok((out, x, tape))
        };
        let (out, x, tape) = phase(Phase::Fwd, at, device, meter, log, forward, |(out, _, _)| {
            readback::scalar(out.clone().detach().mean().cast(burn::tensor::FloatDType::F32), "output mean")
        })?;
        let backward = || {
            let loss = loss_of(kernels.protocol, out, device);
            let value = loss.clone().detach();
            // Checkpointed blocks run their forward again here, under the same autocast.
            let _autocast = Autocast::enter(kernels.autocast);
            Ok((tape.backward(loss, &model), value))
        };
        let (grads, _) = phase(Phase::Bwd, at, device, meter, log, backward, |(grads, loss)| {
            readback::scalar(loss.clone().cast(burn::tensor::FloatDType::F32), "loss")?;
            readback::grad_norm(&model, grads)
        })?;
        drop(x);
        // The model moves into the step (no second reference), so the
        // parameters update in place as PyTorch's `_foreach_addcdiv_` does.
        let current = model;
        let step = || Ok(optim.step(1e-4, current, grads));
        model = phase(Phase::Step, at, device, meter, log, step, readback::param_checksum)?;
    }
    Ok(after_build)
}

/// The loss the protocol's script took of the prediction `out`, in f32 where
/// it upcast (under autocast the prediction is half).
fn loss_of(protocol: Protocol, out: Tensor<5>, device: &Device) -> Tensor<1> {
    let f32 = |t: Tensor<5>| if t.dtype() == burn::tensor::DType::F32 { t } else { t.cast(FloatDType::F32) };
    match protocol {
        // `output.mean()` inside autocast: the prediction's own type.
        Protocol::LatentUnet => out.mean(),
        // `pred.float().pow(2).mean()`: no target.
        Protocol::Transformer => f32(out).square().mean(),
        // A mean squared error against a target (the S2D script's `images -
        // noise`) in the target's type: f32 under autocast, whose output is half.
        Protocol::Project | Protocol::S2dUnet => {
            let target = Tensor::random(out.dims(), burn::tensor::Distribution::Normal(0.0, 1.0), device);
            let out = if out.dtype() == target.dtype() { out } else { out.cast(FloatDType::from(target.dtype())) };
            (out - target).square().mean()
        }
    }
}

fn spawn_heartbeat(
    log: Arc<EventLog>,
    meter: Arc<Meter>,
    beating: Arc<AtomicBool>,
    every: Duration,
) -> Option<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("heartbeat".into())
        .spawn(move || {
            let tick = Duration::from_millis(20).min(every);
            let mut last = Instant::now();
            while beating.load(Ordering::Relaxed) {
                std::thread::sleep(tick);
                // The crash handler cannot read the meter: keep its copy of the window's peak fresh.
                PROGRESS.pool_window_peak.store(meter.peak(), Ordering::Relaxed);
                if last.elapsed() < every || !beating.load(Ordering::Relaxed) {
                    continue;
                }
                last = Instant::now();
                if PROGRESS.finished.load(Ordering::Relaxed) {
                    break;
                }
                let Some(phase) = current_phase() else { continue };
                let _ = log.emit(&Event::Heartbeat {
                    t: now(),
                    phase,
                    current_bytes: meter.current(),
                    peak_bytes: meter.peak(),
                    progress: None,
                });
            }
        })
        .ok()
}

/// The run the signal thread records as `cancelled`: the one under way in this
/// process, from its `start` on (its meter once the device is set up; a task
/// of several configs runs them in turn; between two runs there is none, and
/// a signal then ends the process with nothing to record).
type Current = Option<(Arc<EventLog>, Option<Arc<Meter>>)>;
static CURRENT: std::sync::Mutex<Current> = std::sync::Mutex::new(None);

fn set_current(current: Current) {
    *CURRENT.lock().unwrap_or_else(|p| p.into_inner()) = current;
}

/// SIGTERM (SLURM's time limit and `scancel`) and SIGINT: record the current
/// run `cancelled`, exit 143. One thread per process, started by its first run.
fn start_signal_watcher() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGTERM, SIGINT]) else {
            return;
        };
        let _ = std::thread::Builder::new().name("signals".into()).spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let current = CURRENT.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if let Some((log, meter)) = current {
                    record_cancelled(&log, meter.as_deref(), sig);
                }
                std::process::exit(EXIT_CANCELLED);
            }
        });
    });
}

fn record_cancelled(log: &EventLog, meter: Option<&Meter>, sig: i32) {
    if PROGRESS.finished.swap(true, Ordering::SeqCst) {
        return;
    }
    let phase = current_phase();
    let (peaks, peak_bytes) = peaks_so_far(phase, meter.map_or(0, Meter::peak));
    let t = now();
    let start = f64::from_bits(PROGRESS.start_bits.load(Ordering::Relaxed));
    let _ = log.emit(&Event::from(RunResult {
        t,
        status: RunStatus::Cancelled,
        params: PROGRESS.params.load(Ordering::Relaxed),
        peaks,
        peak_bytes,
        phase,
        message: Some(match phase {
            Some(_) => format!("received signal {sig}"),
            None => format!("received signal {sig} during device setup"),
        }),
        wall_s: t - start,
        nvml_peak_bytes: Some(PROGRESS.nvml_peak.load(Ordering::Relaxed)).filter(|&b| b > 0),
        as_pytorch_counts: None,
        group: None,
    }));
}

#[cfg(test)]
mod tests;
