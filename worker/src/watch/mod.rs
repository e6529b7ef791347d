//! `worker watch`: a config's run is a command of the user's (a training
//! script) instead of the worker's own phases. The worker starts the command
//! as a child, forwards SIGUSR1 and SIGTERM to it (SLURM's `--signal=B:…`
//! and its time limit reach the batch shell, which is this worker), samples
//! the memory the child's process tree holds, and writes the same events as a
//! profiling run to `<state>/<experiment>/runs/<hash>/events.jsonl`: `start`,
//! a `heartbeat` every few seconds (phase `step`: the command's loop) and the
//! `result`.
//!
//! The memory is NVML's used memory of the tree's processes where NVML opens
//! (a GPU node; meter `nvml-processes`), else their resident memory summed
//! (a CPU node; meter `process-tree-rss`): the `start` event names it.
//!
//! How the run ended: exit 0 is `ok`; an out-of-memory line in the command's
//! own output ([`output::says_oom`]) or a SIGKILL while the cgroup's
//! `oom_kill` count rose is `oom`; a SIGTERM (or an exit after a forwarded
//! one) is `cancelled`; anything else is `failed`, with the exit code or the
//! signal and the command's last line.

pub mod chain;
pub mod output;
pub mod procs;
mod signals;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use facts::chain::{ChainPosition, SegmentEnd, SegmentNext};
use facts::event::{Event, MemoryMeter, Phase, PhasePeaks, RunEnvironment, RunResult, RunStatus};
use facts::RunConfig;

use chain::{ChainOptions, ChainRun, Next};

use crate::events::{events_path, now, EventLog};
use crate::runner::{EXIT_CANCELLED, EXIT_OOM};
use output::Seen;
pub use signals::signal_name;

/// Which memory to sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MeterChoice {
    /// NVML where it opens (a GPU node), else the process tree's RSS.
    #[default]
    Auto,
    /// The process tree's resident memory, even on a GPU node.
    Rss,
    /// NVML; an error where it does not open.
    Nvml,
}

/// How to watch.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    pub state_dir: PathBuf,
    /// Between two `heartbeat` events.
    pub heartbeat: Duration,
    /// Between two memory samples.
    pub sample: Duration,
    pub meter: MeterChoice,
    /// A chained run's settings (absent: one run).
    pub chain: Option<ChainOptions>,
    /// The command's progress lines (`Epoch \d+`): the last match rides on
    /// each heartbeat and on a segment's end.
    pub progress: Option<regex_lite::Regex>,
}

impl WatchOptions {
    pub fn new(state_dir: impl Into<PathBuf>) -> WatchOptions {
        WatchOptions {
            state_dir: state_dir.into(),
            heartbeat: Duration::from_secs(10),
            sample: Duration::from_millis(200),
            meter: MeterChoice::Auto,
            chain: None,
            progress: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("no command to watch")]
    NoCommand,
    #[error("opening the event file {path}: {source}")]
    Events { path: PathBuf, source: std::io::Error },
    #[error("writing an event: {0}")]
    Write(#[source] std::io::Error),
    #[error("installing the signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    #[error("starting {command:?}: {source}")]
    Spawn { command: OsString, source: std::io::Error },
    #[error("waiting for the command: {0}")]
    Wait(#[source] std::io::Error),
    #[error("NVML does not open on this node (`--meter nvml`): no driver, or no GPU")]
    NoNvml,
}

/// A watched run's end: what it wrote last and the worker's exit code.
#[derive(Debug, Clone)]
pub struct Watched {
    pub end: End,
    pub exit_code: i32,
}

/// The last event of a watched run.
#[derive(Debug, Clone)]
pub enum End {
    /// The run's (or the chain's) final word.
    Result(RunResult),
    /// A chain's segment that stopped with the chain to go on.
    Segment(SegmentEnd),
}

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl Exit {
    fn of(status: std::process::ExitStatus) -> Exit {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(c), _) => Exit::Code(c),
            (None, Some(s)) => Exit::Signal(s),
            (None, None) => Exit::Code(1),
        }
    }
}

/// What decides a watched run's status, gathered when the command ended.
#[derive(Debug, Clone, Default)]
pub struct Ending<'a> {
    /// The command's first out-of-memory line.
    pub oom_line: Option<&'a str>,
    /// Whether the cgroup's `oom_kill` count rose while the command ran.
    pub oom_killed: bool,
    /// The signals the worker forwarded to the command, in order.
    pub forwarded: &'a [i32],
    /// The command's last line of output.
    pub last_line: Option<&'a str>,
}

/// The status and message of a run that ended with `exit`.
pub fn classify(exit: Exit, e: &Ending) -> (RunStatus, Option<String>) {
    let after = |what: String| match e.forwarded.last() {
        Some(s) => format!("{what} after the worker forwarded {}", signal_name(*s)),
        None => what,
    };
    let with_last = |what: String| match e.last_line {
        Some(l) => format!("{what}; its last line: {l}"),
        None => what,
    };
    let term = |s: i32| s == libc::SIGTERM || s == libc::SIGINT;
    match exit {
        Exit::Code(0) => (RunStatus::Ok, (!e.forwarded.is_empty()).then(|| after("exited 0".into()))),
        _ if e.oom_line.is_some() => {
            (RunStatus::Oom, Some(format!("the command ran out of memory: {}", e.oom_line.unwrap_or_default())))
        }
        Exit::Signal(s) if s == libc::SIGKILL && e.oom_killed => {
            (RunStatus::Oom, Some("killed by the kernel's OOM killer (SIGKILL; the cgroup's oom_kill rose)".into()))
        }
        Exit::Signal(s) if term(s) => (RunStatus::Cancelled, Some(after(format!("killed by {}", signal_name(s))))),
        Exit::Code(c) if e.forwarded.iter().any(|s| term(*s)) => {
            (RunStatus::Cancelled, Some(with_last(after(format!("exit code {c}")))))
        }
        Exit::Signal(s) => (RunStatus::Failed, Some(with_last(after(format!("killed by {}", signal_name(s)))))),
        Exit::Code(c) => (RunStatus::Failed, Some(with_last(after(format!("exit code {c}"))))),
    }
}

/// The worker's exit code for a watched run: 0 when `ok`, the profiling
/// run's codes for `oom` and `cancelled`, else the command's own code (128 +
/// the signal that killed it).
pub fn exit_code(status: RunStatus, exit: Exit) -> i32 {
    match (status, exit) {
        (RunStatus::Ok, _) => 0,
        (RunStatus::Oom, _) => EXIT_OOM,
        (RunStatus::Cancelled, _) => EXIT_CANCELLED,
        (RunStatus::Failed, Exit::Code(c)) => c,
        (RunStatus::Failed, Exit::Signal(s)) => 128 + s,
    }
}

/// The memory meter of this run.
enum Meter {
    Rss,
    #[cfg(feature = "nvml")]
    Nvml(Box<crate::nvml::NvmlProbe>),
}

impl Meter {
    fn open(choice: MeterChoice) -> Result<Meter, WatchError> {
        #[cfg(feature = "nvml")]
        if choice != MeterChoice::Rss {
            if let Some(p) = crate::nvml::NvmlProbe::open() {
                return Ok(Meter::Nvml(Box::new(p)));
            }
        }
        match choice {
            MeterChoice::Nvml => Err(WatchError::NoNvml),
            _ => Ok(Meter::Rss),
        }
    }

    fn kind(&self) -> MemoryMeter {
        match self {
            Meter::Rss => MemoryMeter::ProcessTreeRss,
            #[cfg(feature = "nvml")]
            Meter::Nvml(_) => MemoryMeter::NvmlProcesses,
        }
    }

    /// The device's name, driver and memory.
    fn device(&self) -> (String, Option<String>, Option<u64>) {
        match self {
            Meter::Rss => ("cpu".into(), None, crate::backend::host_memory_bytes()),
            #[cfg(feature = "nvml")]
            Meter::Nvml(p) => p.describe().unwrap_or_else(|| ("gpu".into(), None, None)),
        }
    }

    /// Bytes the tree under `root` holds now.
    fn sample(&self, root: u32) -> u64 {
        let (_pids, rss) = procs::tree_now(root);
        match self {
            Meter::Rss => rss,
            #[cfg(feature = "nvml")]
            Meter::Nvml(p) => p.used_by(&_pids).unwrap_or(0),
        }
    }
}

fn environment(cfg: &RunConfig, meter: &Meter, chain: Option<ChainPosition>) -> RunEnvironment {
    let (device, driver, memory) = meter.device();
    let precision = serde_json::to_value(cfg.precision).ok().and_then(|v| v.as_str().map(String::from));
    RunEnvironment {
        host: crate::runner::environment::hostname(),
        device,
        driver,
        backend: facts::event::COMMAND_BACKEND.into(),
        // What the config asks for; the command decides what it runs.
        dtype: precision.unwrap_or_else(|| "unknown".into()),
        grad_ckpt: cfg.grad_ckpt,
        requested_dtype: None,
        checkpointing: None,
        dtype_policy: None,
        attention: None,
        meter: Some(meter.kind()),
        device_memory_bytes: memory,
        memory_limit_bytes: None,
        kernel_cache: None,
        slurm_job_id: std::env::var("SLURM_JOB_ID").ok(),
        slurm_array_task_id: std::env::var("SLURM_ARRAY_TASK_ID").ok(),
        chain,
    }
}

/// Run `command` for `cfg` and watch it to its end (see the module's doc).
pub fn watch(cfg: &RunConfig, command: &[OsString], opts: &WatchOptions) -> Result<Watched, WatchError> {
    let path = events_path(&opts.state_dir, cfg);
    let log = EventLog::open(&path).map_err(|source| WatchError::Events { path: path.clone(), source })?;
    let chain = opts.chain.clone().map(|c| ChainRun::at(c, &path));
    let command = match &chain {
        Some(run) => run.command(command),
        None => command.to_vec(),
    };
    let (program, args) = command.split_first().ok_or(WatchError::NoCommand)?;
    let meter = Meter::open(opts.meter)?;
    let forwarder = signals::Forwarder::install().map_err(WatchError::Signals)?;
    let oom_kills_before = procs::own_oom_kills();
    let start = Instant::now();
    let env = environment(cfg, &meter, chain.as_ref().map(|c| c.position));
    let start_event = Event::Start { t: now(), config: cfg.name.clone(), config_hash: cfg.hash(), env };
    log.emit(&start_event).map_err(WatchError::Write)?;
    let mut child = Command::new(program);
    child.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    if let Some(run) = &chain {
        // The chain's files are the run directory's: the command works there.
        child.current_dir(&run.run_dir);
    }
    let mut child = child.spawn().map_err(|source| WatchError::Spawn { command: program.clone(), source })?;
    forwarder.to_child(child.id());
    if let Some(run) = &chain {
        if let Some(after) = run.opts.warn_before_s.and_then(chain::warn_after) {
            forwarder.warn_at(run.opts.signal, after);
        }
    }
    let seen = Arc::new(Mutex::new(Seen::with_progress(opts.progress.clone())));
    let pumps = [
        child.stdout.take().map(|o| {
            let s = seen.clone();
            std::thread::spawn(move || output::pump(o, std::io::stdout(), s))
        }),
        child.stderr.take().map(|o| {
            let s = seen.clone();
            std::thread::spawn(move || output::pump(o, std::io::stderr(), s))
        }),
    ];
    let (status, peak) = wait_sampling(&mut child, &meter, &log, opts, &seen)?;
    let forwarded = forwarder.finish();
    for p in pumps.into_iter().flatten() {
        let _ = p.join();
    }
    let exit = Exit::of(status);
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    let oom_killed = matches!((oom_kills_before, procs::own_oom_kills()), (Some(a), Some(b)) if b > a);
    let ending =
        Ending { oom_line: seen.oom_line.as_deref(), oom_killed, forwarded: &forwarded, last_line: seen.last_line() };
    let ended = Ended { peak, wall_s: start.elapsed().as_secs_f64(), progress: seen.progress.clone() };
    let (status, message) = match &chain {
        Some(run) => match chain::decide(run, exit == Exit::Code(0), &forwarded) {
            Next::Requeue => return segment_end(&log, run, &ended),
            next => chain_end(run, &next, exit, &ending),
        },
        None => classify(exit, &ending),
    };
    let result = RunResult {
        t: now(),
        status,
        params: facts::params::count(&cfg.model, &cfg.input, cfg.out_channels).unwrap_or(0),
        peaks: PhasePeaks { step: Some(peak), ..PhasePeaks::default() },
        peak_bytes: peak,
        phase: (status != RunStatus::Ok).then_some(Phase::Step),
        message,
        wall_s: ended.wall_s,
        nvml_peak_bytes: (meter.kind() == MemoryMeter::NvmlProcesses).then_some(peak),
        as_pytorch_counts: None,
        group: None,
    };
    log.emit(&Event::from(result.clone())).map_err(WatchError::Write)?;
    // A chain that stopped failed after a clean exit (capped, no checkpoint) is no success either.
    let code = match exit_code(status, exit) {
        0 if status != RunStatus::Ok => 1,
        c => c,
    };
    Ok(Watched { exit_code: code, end: End::Result(result) })
}

/// What a segment's end reports of it.
struct Ended {
    peak: u64,
    wall_s: f64,
    progress: Option<String>,
}

/// The status and message of a chain's last segment (not [`Next::Requeue`]).
fn chain_end(run: &ChainRun, next: &Next, exit: Exit, ending: &Ending) -> (RunStatus, Option<String>) {
    let ChainPosition { segment, max_segments } = run.position;
    let checkpoint = run.checkpoint();
    match next {
        Next::Complete => (RunStatus::Ok, Some(format!("complete (its marker is there) after segment {segment}"))),
        Next::Capped => (
            RunStatus::Failed,
            Some(format!(
                "the chain reached max_segments ({max_segments}) before the command completed; its checkpoint \
                 {} is kept (raise chain.max_segments, then `resume --retry-failed` goes on from it)",
                checkpoint.display()
            )),
        ),
        Next::NoCheckpoint => (
            RunStatus::Failed,
            Some(format!(
                "segment {segment} stopped for the time limit but saved no checkpoint at {}",
                checkpoint.display()
            )),
        ),
        Next::Requeue | Next::Exit => classify(exit, ending),
    }
}

/// A segment that stopped for the time limit with its checkpoint saved:
/// its end written, then the job requeued (or, where SLURM refuses, left
/// for `resume`, which continues it from the checkpoint).
fn segment_end(log: &EventLog, run: &ChainRun, ended: &Ended) -> Result<Watched, WatchError> {
    let end = SegmentEnd {
        t: now(),
        segment: run.position.segment,
        max_segments: run.position.max_segments,
        wall_s: ended.wall_s,
        peak_bytes: ended.peak,
        checkpoint: true,
        progress: ended.progress.clone(),
        next: SegmentNext::Requeue,
    };
    // Recorded before it is asked: a requeue that succeeds ends this process.
    log.emit(&Event::Segment(end.clone())).map_err(WatchError::Write)?;
    match chain::requeue() {
        Ok(()) => {
            eprintln!("worker: segment {} saved; SLURM requeues this job for the next", end.segment);
            Ok(Watched { end: End::Segment(end), exit_code: 0 })
        }
        Err(reason) => {
            eprintln!("worker: segment {} saved, but the job is not requeued: {reason}", end.segment);
            let end = SegmentEnd { t: now(), next: SegmentNext::Resume { reason }, ..end };
            log.emit(&Event::Segment(end.clone())).map_err(WatchError::Write)?;
            Ok(Watched { end: End::Segment(end), exit_code: 0 })
        }
    }
}

/// Wait for the child, sampling its memory and writing heartbeats; its exit
/// status and the peak sampled.
fn wait_sampling(
    child: &mut std::process::Child,
    meter: &Meter,
    log: &EventLog,
    opts: &WatchOptions,
    seen: &Mutex<Seen>,
) -> Result<(std::process::ExitStatus, u64), WatchError> {
    let pid = child.id();
    let mut peak = 0u64;
    let mut next_beat = Instant::now() + opts.heartbeat;
    loop {
        if let Some(status) = child.try_wait().map_err(WatchError::Wait)? {
            return Ok((status, peak));
        }
        let current = meter.sample(pid);
        peak = peak.max(current);
        if Instant::now() >= next_beat {
            let progress = seen.lock().unwrap_or_else(|p| p.into_inner()).progress.clone();
            let beat =
                Event::Heartbeat { t: now(), phase: Phase::Step, current_bytes: current, peak_bytes: peak, progress };
            log.emit(&beat).map_err(WatchError::Write)?;
            next_beat += opts.heartbeat;
        }
        std::thread::sleep(opts.sample);
    }
}

#[cfg(test)]
mod tests;
