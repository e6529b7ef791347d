//! `worker run`: one sweep config, measured and streamed to the state directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use facts::event::AttentionKernel;
use facts::run::Manifest;
use facts::RunConfig;
use worker::{Backend, RunOptions};

#[derive(Parser)]
#[command(name = "worker", version, about = "Profiles one sweep config in Burn and streams its events")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one config: from a manifest and the SLURM array task id, or from a config file.
    Run(RunArgs),
    /// List the backends compiled into this binary.
    Backends,
    /// Run the configs of a measurement file (the group's PyTorch runs) through
    /// this worker, one process each, and print the worker's peak beside the
    /// measured one (markdown).
    Fidelity(FidelityArgs),
    /// Fill a kernel cache: one small config of each model family through
    /// `worker run --cache-dir DIR`, one process each, in fp32 and bf16-amp;
    /// one line per config (wall seconds, status). Exit 0 when all ended ok.
    Warm(WarmArgs),
    /// Run a command of your own for one config (a training script) as a
    /// child: forward SIGUSR1 and SIGTERM to it, sample the memory it holds
    /// (NVML on a GPU node, else its resident memory), and write the same
    /// events as a profiling run (start, heartbeats, result). Exit 0 when the
    /// command exited 0 (`ok`).
    Watch(WatchArgs),
    /// A scripted trainer for chained runs without a GPU (the chain demo):
    /// trains step by step in its working directory, saves `checkpoint.txt`
    /// every few steps and on SIGUSR1 (then exits 0), resumes from
    /// `--resume=PATH`, and writes `.training_complete` at the end.
    DemoTrainer(DemoTrainerArgs),
}

#[derive(clap::Args)]
struct DemoTrainerArgs {
    #[arg(long)]
    steps: u32,
    /// Seconds one step takes.
    #[arg(long, default_value_t = 1.0)]
    step_s: f64,
    #[arg(long, default_value_t = 5)]
    save_every: u32,
    /// The checkpoint to resume from.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Memory to hold while training, in MiB.
    #[arg(long, default_value_t = 16)]
    hold_mb: usize,
}

#[derive(clap::Args)]
struct WatchArgs {
    /// The task's one config and where its events go.
    #[command(flatten)]
    task: TaskArgs,
    /// Seconds between two heartbeat events.
    #[arg(long, default_value_t = 10.0)]
    heartbeat_s: f64,
    /// Seconds between two memory samples.
    #[arg(long, default_value_t = 0.2)]
    sample_s: f64,
    /// The memory to sample: `auto` (NVML where it opens, else RSS), `rss`
    /// (the process tree's resident memory) or `nvml`.
    #[arg(long, value_enum, default_value_t = MeterArg::Auto)]
    meter: MeterArg,
    /// A chained run of at most this many segments: on the chain's signal
    /// the command saves `--checkpoint` and exits, and the worker requeues
    /// the job (docs/training-sweeps.md).
    #[arg(long, requires_all = ["checkpoint", "resume_arg"])]
    chain_max: Option<u32>,
    /// The chain's signal from SLURM before the limit: USR1 or USR2.
    #[arg(long, value_enum, default_value_t = ChainSignalArg::Usr1, requires = "chain_max")]
    chain_signal: ChainSignalArg,
    /// Seconds before the job's limit the chain's signal is due: the worker
    /// sends it itself where SLURM has not by then.
    #[arg(long, requires = "chain_max")]
    signal_before_s: Option<u64>,
    /// The checkpoint the command saves, relative to the run directory.
    #[arg(long, requires = "chain_max")]
    checkpoint: Option<PathBuf>,
    /// The argument that resumes the command, added once the checkpoint exists.
    #[arg(long, requires = "chain_max", allow_hyphen_values = true)]
    resume_arg: Option<std::ffi::OsString>,
    /// A file (relative to the run directory) whose presence says the run is complete.
    #[arg(long, requires = "chain_max")]
    marker: Option<PathBuf>,
    /// A regular expression for the command's progress lines; the last match
    /// rides on each heartbeat.
    #[arg(long)]
    progress: Option<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    command: Vec<std::ffi::OsString>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ChainSignalArg {
    Usr1,
    Usr2,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum MeterArg {
    Auto,
    Rss,
    Nvml,
}

#[derive(clap::Args)]
struct WarmArgs {
    /// The kernel cache to fill (as `worker run --cache-dir` takes it: one node's).
    #[arg(long)]
    cache_dir: PathBuf,
    /// Backend (default: the first GPU backend compiled in, else `flex`).
    #[arg(long)]
    backend: Option<String>,
    /// Where the warm-up runs' events go (default: a temp dir, removed after).
    /// Never a sweep's state directory.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Precisions to run each family in (repeat or comma-separate).
    #[arg(long, value_delimiter = ',', value_parser = precision, default_values = ["fp32", "bf16-amp"])]
    precision: Vec<facts::Precision>,
}

#[derive(clap::Args)]
struct FidelityArgs {
    /// Measurement JSONL (data/vram-measurements.jsonl).
    #[arg(long)]
    records: PathBuf,
    /// Only configs whose measured peak is at most this many GiB.
    #[arg(long, default_value_t = 4.0)]
    max_peak_gib: f64,
    /// Only configs of these families (unet, dit, hdit, uvit; repeat or comma-separate).
    #[arg(long, value_delimiter = ',', value_parser = family)]
    family: Vec<facts::model::Family>,
    /// Backend (default: the first GPU backend compiled in, else `flex`).
    #[arg(long)]
    backend: Option<String>,
    /// Where the runs' events go.
    #[arg(long, default_value = "state")]
    state_dir: PathBuf,
    /// Also write the rows as JSON lines here, each as its config ends.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run nothing: the table of the rows a `--json` of an earlier run wrote.
    #[arg(long)]
    from_json: Option<PathBuf>,
    /// The precheck's predictions of the same records (`orchestrator predict
    /// --records FILE` output), set beside each row.
    #[arg(long)]
    predictions: Option<PathBuf>,
    /// Record ids to leave out (configs the device cannot finish in reasonable time).
    #[arg(long, value_delimiter = ',')]
    skip: Vec<String>,
    /// Rows of an earlier run (its `--json`): their errors stand beside these as "before".
    #[arg(long)]
    before: Option<PathBuf>,
    /// PyTorch's own run of some of the same configs (a GPU check's
    /// `pytorch.jsonl`): a table of the worker against PyTorch, and PyTorch
    /// against the group, on the configs both ran.
    #[arg(long)]
    pytorch: Option<PathBuf>,
}

/// Which configs a task runs (a manifest and the array task, or one config
/// file) and where their events go: `run`'s and `watch`'s.
#[derive(clap::Args)]
struct TaskArgs {
    /// Manifest JSON (`{"experiment", "task_offset", "configs": [RunConfig...]}`).
    #[arg(long, conflicts_with = "config", required_unless_present = "config")]
    manifest: Option<PathBuf>,
    /// Array task id; defaults to $SLURM_ARRAY_TASK_ID.
    #[arg(long, requires = "manifest")]
    task_id: Option<u32>,
    /// A single RunConfig JSON file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// State directory; events go to <state-dir>/<experiment>/runs/<hash>/events.jsonl.
    #[arg(long)]
    state_dir: PathBuf,
}

impl TaskArgs {
    fn configs(&self) -> Result<(Vec<facts::RunConfig>, Option<u64>)> {
        task_configs(self.manifest.as_deref(), self.task_id, self.config.as_deref())
    }
}

#[derive(clap::Args)]
struct RunArgs {
    #[command(flatten)]
    task: TaskArgs,
    /// Refuse allocations above this many bytes and record the run as `oom`
    /// (default: the manifest's `memory_limit`, the experiment's
    /// `worker: {memory_limit}`, else none).
    #[arg(long)]
    memory_limit: Option<u64>,
    /// Backend (default: the first GPU backend compiled in, else `flex`).
    #[arg(long)]
    backend: Option<String>,
    /// Attention of the transformer families: `memory-efficient` (the default,
    /// what PyTorch's SDPA runs: no N x N scores kept for backward) or
    /// `materialised` (Burn's decomposed attention, holding the scores). The
    /// UNet's attention is always materialised, as MONAI's is.
    #[arg(long, value_enum, default_value_t = AttentionArg::MemoryEfficient)]
    attention: AttentionArg,
    /// This node's kernel cache: CubeCL's compiled kernels and autotune
    /// results and the NVIDIA driver's shader cache, shared by the runs of
    /// one host (never by two hosts). A corrupt or foreign cache is moved
    /// aside with a warning; one that cannot be prepared, skipped.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Measure as this protocol's script did (`project`, the default;
    /// `latent-unet`, `s2d-unet`, `transformer`: the group's profiling
    /// scripts): the loss it took, and the result carries the figures it printed.
    #[arg(long, default_value = "project")]
    protocol: facts::protocol::Protocol,
    /// Run the task's configs from this index on (set by the worker itself
    /// when it restarts a task of several configs: see `worker::task`).
    #[arg(long, hide = true, requires = "manifest")]
    from: Option<usize>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum AttentionArg {
    MemoryEfficient,
    Materialised,
}

impl From<AttentionArg> for AttentionKernel {
    fn from(a: AttentionArg) -> Self {
        match a {
            AttentionArg::MemoryEfficient => AttentionKernel::MemoryEfficient,
            AttentionArg::Materialised => AttentionKernel::Materialised,
        }
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let de = &mut serde_json::Deserializer::from_str(&text);
    serde_path_to_error::deserialize(de).with_context(|| format!("parsing {}", path.display()))
}

/// The configs this task runs: the one `--config`, or the array task's
/// configs of the manifest (`configs_per_task` of them, in turn).
/// The configs this process runs and the memory limit they run under
/// (`--memory-limit`, else the manifest's `memory_limit`, else none).
fn configs_of(args: &RunArgs) -> Result<(Vec<RunConfig>, Option<u64>)> {
    let (cfgs, limit) = args.task.configs()?;
    Ok((cfgs, args.memory_limit.or(limit)))
}

/// The configs of `--config`, or of the manifest's array task; and the
/// manifest's memory limit.
fn task_configs(
    manifest: Option<&Path>,
    task_id: Option<u32>,
    config: Option<&Path>,
) -> Result<(Vec<RunConfig>, Option<u64>)> {
    if let Some(path) = config {
        return Ok((vec![read_json(path)?], None));
    }
    let Some(path) = manifest else { bail!("give --manifest or --config") };
    let manifest: Manifest = read_json(path)?;
    let task_id = match task_id {
        Some(t) => t,
        None => std::env::var("SLURM_ARRAY_TASK_ID")
            .context("no --task-id and no SLURM_ARRAY_TASK_ID")?
            .trim()
            .parse()
            .context("SLURM_ARRAY_TASK_ID is not a number")?,
    };
    let cfgs = manifest.task(task_id).with_context(|| {
        format!(
            "task {task_id} is outside the manifest (offset {}, {} configs, {} a task)",
            manifest.task_offset,
            manifest.configs.len(),
            manifest.configs_per_task
        )
    })?;
    Ok((cfgs.to_vec(), manifest.memory_limit))
}

/// `worker watch`: the task's one config, its command watched to the end;
/// the worker's exit code.
fn watch(args: WatchArgs) -> Result<i32> {
    let (cfgs, _) = args.task.configs()?;
    let [cfg] = cfgs.as_slice() else {
        bail!("`worker watch` runs one config a task; this task holds {} (configs_per_task must be 1)", cfgs.len())
    };
    let seconds = |s: f64, what: &str| {
        Duration::try_from_secs_f64(s).ok().filter(|d| !d.is_zero()).with_context(|| format!("--{what} {s}"))
    };
    let mut opts = worker::watch::WatchOptions::new(&args.task.state_dir);
    opts.heartbeat = seconds(args.heartbeat_s, "heartbeat-s")?;
    opts.sample = seconds(args.sample_s, "sample-s")?;
    opts.meter = match args.meter {
        MeterArg::Auto => worker::watch::MeterChoice::Auto,
        MeterArg::Rss => worker::watch::MeterChoice::Rss,
        MeterArg::Nvml => worker::watch::MeterChoice::Nvml,
    };
    if let Some(p) = &args.progress {
        opts.progress = Some(regex_lite::Regex::new(p).with_context(|| format!("--progress {p:?}"))?);
    }
    if let (Some(max_segments), Some(checkpoint), Some(resume_arg)) = (args.chain_max, args.checkpoint, args.resume_arg)
    {
        if max_segments == 0 {
            bail!("--chain-max must be at least 1");
        }
        let signal = match args.chain_signal {
            ChainSignalArg::Usr1 => libc::SIGUSR1,
            ChainSignalArg::Usr2 => libc::SIGUSR2,
        };
        opts.chain = Some(worker::watch::chain::ChainOptions {
            max_segments,
            checkpoint,
            resume_arg,
            marker: args.marker,
            signal,
            warn_before_s: args.signal_before_s,
        });
    }
    let watched = worker::watch::watch(cfg, &args.command, &opts)?;
    match &watched.end {
        worker::watch::End::Result(r) => eprintln!(
            "worker: {} {} (peak {:.3} GiB, {:.1} s){}",
            cfg.name,
            r.status.name(),
            r.peak_bytes as f64 / (1u64 << 30) as f64,
            r.wall_s,
            r.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
        ),
        worker::watch::End::Segment(e) => eprintln!(
            "worker: {} segment {} of at most {} ended (peak {:.3} GiB, {:.1} s{})",
            cfg.name,
            e.segment,
            e.max_segments,
            e.peak_bytes as f64 / (1u64 << 30) as f64,
            e.wall_s,
            e.progress.as_deref().map(|p| format!(", {p}")).unwrap_or_default()
        ),
    }
    Ok(watched.exit_code)
}

/// `--backend NAME`, else the first GPU backend compiled in, else the CPU.
fn backend_of(name: Option<&str>) -> Result<Backend> {
    match name {
        Some(name) => Ok(Backend::parse(name)?),
        None => Backend::default_for_build().context("this build has no backend"),
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Backends => {
            for b in Backend::available() {
                println!("{}", b.name());
            }
            Ok(())
        }
        Command::Fidelity(args) => fidelity(args),
        Command::Warm(args) => std::process::exit(warm(&args)?),
        Command::Watch(args) => std::process::exit(watch(args)?),
        Command::DemoTrainer(a) => {
            let step = Duration::try_from_secs_f64(a.step_s).with_context(|| format!("--step-s {}", a.step_s))?;
            let t = worker::demo_trainer::DemoTrainer {
                steps: a.steps,
                step,
                save_every: a.save_every,
                resume: a.resume,
                hold_mb: a.hold_mb,
            };
            std::process::exit(worker::demo_trainer::run(&t)?)
        }
        Command::Run(args) => {
            let (cfgs, memory_limit) = configs_of(&args)?;
            if cfgs.len() > 1 && args.from.is_none() {
                // Several configs: a child worker runs them, restarted after one that does not end ok.
                let (exe, through) = this_worker()?;
                let child = |from: usize| {
                    let mut c = std::process::Command::new(&exe);
                    c.args(&through).args(std::env::args_os().skip(1)).arg("--from").arg(from.to_string());
                    c
                };
                std::process::exit(worker::task::supervise(&cfgs, &args.task.state_dir, child)?);
            }
            // First, while this process has one thread: it sets the driver's variables.
            let kernel_cache = args.cache_dir.as_deref().map(worker::cache::use_for_this_process);
            let backend = backend_of(args.backend.as_deref())?;
            let mut opts = RunOptions::new(&args.task.state_dir, backend);
            opts.memory_limit = memory_limit;
            opts.attention = args.attention.into();
            opts.kernel_cache = kernel_cache.as_ref().map(|c| c.state);
            opts.protocol = args.protocol;
            let code = worker::task::run_in_turn(&cfgs, args.from.unwrap_or(0), &opts)?;
            // The results are written: what the runs compiled goes to the node's cache.
            if let Some(cache) = kernel_cache {
                cache.finish();
            }
            std::process::exit(code);
        }
    }
}

/// `worker fidelity`: run (or re-read) the rows and print the table.
fn fidelity(args: FidelityArgs) -> Result<()> {
    let backend = backend_of(args.backend.as_deref())?;
    let opts = worker::fidelity::Options {
        records: args.records.clone(),
        max_peak_gib: args.max_peak_gib,
        families: args.family,
        backend: backend.name().to_string(),
        state_dir: args.state_dir,
        skip: args.skip,
        json: if args.from_json.is_some() { None } else { args.json },
    };
    let rows = match &args.from_json {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            worker::fidelity::read_rows(&text)?
        }
        None => worker::fidelity::run(&opts)?,
    };
    let predictions = match &args.predictions {
        Some(path) => worker::fidelity::read_predictions(
            &std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        )?,
        None => Default::default(),
    };
    let before = match &args.before {
        Some(path) => worker::fidelity::read_rows(
            &std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        )?,
        None => Vec::new(),
    };
    let device = if backend.is_gpu() { backend.name().to_string() } else { "CPU, flex backend".into() };
    print!("{}", worker::fidelity::markdown(&rows, &device, &predictions, &before));
    if let Some(path) = &args.pytorch {
        let read = |p: &Path| -> Result<Vec<facts::record::MeasurementRecord>> {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            facts::record::read_jsonl(&text).map_err(|(line, e)| anyhow::anyhow!("{}:{line}: {e}", p.display()))
        };
        let reference = worker::fidelity::Reference::matching(&read(&args.records)?, &read(path)?)?;
        print!("{}", reference.markdown(&rows));
    }
    Ok(())
}

/// `worker warm`: each warm-up config through `worker run` in a process of
/// its own (see `worker::warm`); 0 when every one ended ok, else 1.
fn warm(args: &WarmArgs) -> Result<i32> {
    let backend = backend_of(args.backend.as_deref())?;
    let scratch;
    let state_dir = match &args.state_dir {
        Some(d) => d.clone(),
        None => {
            scratch = tempfile::Builder::new().prefix("worker-warm-").tempdir().context("creating a temp state dir")?;
            scratch.path().to_path_buf()
        }
    };
    let cfgs = worker::warm::configs(&args.precision);
    let (exe, through) = this_worker()?;
    eprintln!(
        "warming the kernel cache {} on {}: {} configs, events in {}",
        args.cache_dir.display(),
        backend.name(),
        cfgs.len(),
        state_dir.display()
    );
    let run = |config: &Path| {
        let mut c = std::process::Command::new(&exe);
        c.args(&through).arg("run").arg("--config").arg(config).arg("--state-dir").arg(&state_dir);
        c.arg("--cache-dir").arg(&args.cache_dir).arg("--backend").arg(backend.name());
        c
    };
    let warmed = worker::warm::run(&cfgs, &state_dir, run, |w| println!("{}", w.line()))?;
    let ok = warmed.iter().filter(|w| w.ok()).count();
    println!("warm: {ok} of {} configs ok, kernel cache {}", cfgs.len(), args.cache_dir.display());
    Ok(if ok == cfgs.len() { 0 } else { 1 })
}

/// A precision by its experiment-file name, for `--precision`.
fn precision(name: &str) -> Result<facts::Precision, String> {
    serde_json::from_value(serde_json::Value::String(name.into()))
        .map_err(|_| format!("unknown precision `{name}` (fp32, bf16-amp, fp16-amp or bf16)"))
}

/// How to start this worker again: its executable, and the arguments before
/// its own. Started through an explicit dynamic loader (`ld-linux-x86-64.so.2
/// worker …`, as `scripts/lavapipe-run` starts it), the executable is that
/// loader, and this worker's path comes first.
fn this_worker() -> Result<(PathBuf, Vec<std::ffi::OsString>)> {
    let exe = std::env::current_exe().context("locating this worker binary")?;
    let name = exe.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if name.starts_with("ld-linux") || name.starts_with("ld.so") {
        let me = std::env::args_os().next().context("no argv[0] to start this worker again")?;
        return Ok((exe, vec![me]));
    }
    Ok((exe, Vec::new()))
}

/// A family by its name, for `--family`.
fn family(name: &str) -> Result<facts::model::Family, String> {
    use facts::model::Family;
    [Family::Unet, Family::Dit, Family::Hdit, Family::Uvit].into_iter().find(|f| f.name() == name).ok_or_else(|| {
        format!("unknown family `{name}` (the worker builds unet, dit, hdit or uvit; mamba has no worker model)")
    })
}
