//! `worker run`: one sweep config, measured and streamed to the state directory.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use spec::event::AttentionKernel;
use spec::run::Manifest;
use spec::RunConfig;
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
    family: Vec<spec::model::Family>,
    /// Backend (default: the first GPU backend compiled in, else `flex`).
    #[arg(long)]
    backend: Option<String>,
    /// Where the runs' events go.
    #[arg(long, default_value = "state")]
    state_dir: PathBuf,
    /// Also write the rows as JSON lines here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(clap::Args)]
struct RunArgs {
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
    /// Refuse allocations above this many bytes and record the run as `oom`.
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

fn config_of(args: &RunArgs) -> Result<RunConfig> {
    if let Some(path) = &args.config {
        return read_json(path);
    }
    let Some(path) = &args.manifest else { bail!("give --manifest or --config") };
    let manifest: Manifest = read_json(path)?;
    let task_id = match args.task_id {
        Some(t) => t,
        None => std::env::var("SLURM_ARRAY_TASK_ID")
            .context("no --task-id and no SLURM_ARRAY_TASK_ID")?
            .trim()
            .parse()
            .context("SLURM_ARRAY_TASK_ID is not a number")?,
    };
    let cfgs = manifest.task(task_id).with_context(|| {
        format!(
            "task {task_id} is outside the manifest (offset {}, {} configs)",
            manifest.task_offset,
            manifest.configs.len()
        )
    })?;
    match cfgs {
        [cfg] => Ok(cfg.clone()),
        _ => bail!("task {task_id} holds {} configs; this worker runs one per task", cfgs.len()),
    }
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
        Command::Fidelity(args) => {
            let backend = backend_of(args.backend.as_deref())?;
            let opts = worker::fidelity::Options {
                records: args.records,
                max_peak_gib: args.max_peak_gib,
                families: args.family,
                backend: backend.name().to_string(),
                state_dir: args.state_dir,
            };
            let rows = worker::fidelity::run(&opts)?;
            if let Some(path) = &args.json {
                let lines: Vec<String> = rows.iter().map(serde_json::to_string).collect::<Result<_, _>>()?;
                std::fs::write(path, lines.join("\n") + "\n").with_context(|| format!("writing {}", path.display()))?;
            }
            let device = if backend.is_gpu() { backend.name().to_string() } else { "CPU, flex backend".into() };
            print!("{}", worker::fidelity::markdown(&rows, &device));
            Ok(())
        }
        Command::Run(args) => {
            // First, while this process has one thread: it sets the driver's variables.
            let kernel_cache = args.cache_dir.as_deref().map(worker::cache::use_for_this_process);
            let cfg = config_of(&args)?;
            let backend = backend_of(args.backend.as_deref())?;
            let mut opts = RunOptions::new(&args.state_dir, backend);
            opts.memory_limit = args.memory_limit;
            opts.attention = args.attention.into();
            opts.kernel_cache = kernel_cache;
            let outcome = worker::run(&cfg, &opts)?;
            let result = &outcome.result;
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            eprintln!(
                "{}: {:?}, {} params, peak {:.3} GiB{}",
                cfg.name,
                result.status,
                result.params,
                gib(result.peak_bytes),
                result.message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default()
            );
            std::process::exit(outcome.exit_code());
        }
    }
}

/// A family by its name, for `--family`.
fn family(name: &str) -> Result<spec::model::Family, String> {
    use spec::model::Family;
    [Family::Unet, Family::Dit, Family::Hdit, Family::Uvit]
        .into_iter()
        .find(|f| f.name() == name)
        .ok_or_else(|| format!("unknown family `{name}` (unet, dit, hdit or uvit)"))
}
