//! `orchestrator`: plan, precheck, submit and follow GPU memory-profiling sweeps.

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser, Subcommand};
use std::io::IsTerminal;
use std::path::PathBuf;

use orchestrator::cluster::ClustersFile;
use orchestrator::{plan, precheck, state, submit, sweep, walltime};

#[derive(Parser)]
#[command(
    name = "orchestrator",
    version,
    about = "GPU memory-profiling sweeps on SLURM: plan, precheck, submit, resume, report"
)]
struct Cli {
    /// More log output (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

/// An experiment file and Hydra-style overrides (`model.num_res_blocks=3`).
#[derive(clap::Args, Debug, Clone)]
pub struct ExperimentArgs {
    /// Experiment YAML (e.g. experiments/exp9.yaml).
    pub file: PathBuf,
    /// `key.path=value` overrides applied to every config.
    pub overrides: Vec<String>,
    /// State root whose finished sweeps refine the precheck (`<dir>/calibration.json`).
    #[arg(long, default_value = "state")]
    pub state_dir: PathBuf,
    /// Predict with the shipped calibration only, not the local overlay.
    #[arg(long)]
    pub shipped_calibration: bool,
}

impl ExperimentArgs {
    fn load(&self) -> Result<sweep::Sweep> {
        // LoadError's message is complete (file:line:col: key: what); no extra context.
        Ok(sweep::load(&self.file, &self.overrides)?)
    }

    /// The sweep's predictor (local overlay unless `--shipped-calibration`) and which calibration it is.
    fn predictor(&self, sweep: &sweep::Sweep) -> Result<(precheck::Predictor, precheck::overlay::CalibrationSource)> {
        let root = (!self.shipped_calibration).then_some(self.state_dir.as_path());
        Ok(sweep.predictor_in(root)?)
    }
}

/// How an active sweep chooses and when it stops.
#[derive(clap::Args, Debug, Clone)]
pub struct ActiveArgs {
    /// Largest band an unmeasured config may keep (`5%` or `0.05`).
    #[arg(long, default_value = orchestrator::active::DEFAULT_TARGET_ERROR, value_parser = orchestrator::active::parse_share)]
    pub target_error: f64,
    /// Runs at most, all rounds together.
    #[arg(long)]
    pub max_runs: Option<usize>,
    /// Configs per round at most (default: a tenth of the sweep, at least 2).
    #[arg(long)]
    pub round_size: Option<usize>,
}

#[derive(Subcommand)]
enum Command {
    /// List every config of a sweep: dimensions, exact parameters, validity, predicted peak and verdict.
    Plan {
        #[command(flatten)]
        exp: ExperimentArgs,
        /// One JSON object per config instead of the table.
        #[arg(long)]
        json: bool,
        /// The cluster to plan for, as `submit --cluster` (default: where the
        /// sweep was first submitted, else the experiment's `cluster:`, else `local`).
        #[arg(long)]
        cluster: Option<String>,
    },
    /// Predict the peak memory of measurement records (measured fields ignored): one JSON line each.
    Predict {
        /// Measurement JSONL file(s) (format: data/README.md).
        #[arg(long, required = true, num_args = 1..)]
        records: Vec<PathBuf>,
        /// Calibration file (default: the shipped orchestrator/calibration/runtimes.json).
        #[arg(long)]
        calibration: Option<PathBuf>,
        /// Also flag configs within the uncertainty of (or above) this budget as risky.
        #[arg(long)]
        budget_gb: Option<f64>,
    },
    /// Refit the precheck's coefficients per runtime from measurement records; print fit quality.
    Calibrate {
        /// Measurement JSONL file(s).
        #[arg(long, required_unless_present = "check", num_args = 1..)]
        records: Vec<PathBuf>,
        /// Write the calibration JSON here (default: stdout).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Skip cross-validation (bands then come from the in-sample errors).
        #[arg(long)]
        no_loto: bool,
        /// Show the local overlay fitted on this state's sweeps: the shipped
        /// calibration's error on your runs, and the overlay's (held out).
        #[arg(long, conflicts_with_all = ["records", "out", "no_loto"])]
        check: bool,
        /// State root for --check.
        #[arg(long, default_value = "state")]
        state_dir: PathBuf,
    },
    /// Where one config's predicted peak goes (terms, phase, hotspots), the single changes that save most, input scaling.
    Explain {
        #[command(flatten)]
        exp: ExperimentArgs,
        #[command(flatten)]
        args: orchestrator::advisor::cli::ExplainArgs,
    },
    /// The configs predicted to fit a GPU and budget, ranked by parameters per input shape, with the Pareto front.
    Fit {
        #[command(flatten)]
        exp: ExperimentArgs,
        #[command(flatten)]
        args: orchestrator::advisor::cli::FitArgs,
    },
    /// Replay evidence for active profiling: per source table of the records, the calibration
    /// refitted without that table and an active sweep over its configs on the replay cluster.
    Evidence {
        /// Measurement JSONL whose tables are replayed.
        #[arg(long, default_value = "data/vram-measurements.jsonl")]
        records: PathBuf,
        /// Experiment files (or directories of them) to run as `submit FILE --active --cluster replay`
        /// does, answered from --records, instead of the records' own tables.
        #[arg(long, num_args = 1..)]
        experiments: Vec<PathBuf>,
        #[command(flatten)]
        active: ActiveArgs,
    },
    #[command(flatten)]
    Cluster(submit::cli::ClusterCommand),
    /// Markdown (and JSON) report of a sweep from its state, or of measurement records, with plots.
    Report(orchestrator::report::cli::ReportArgs),
    /// Print a shell completion script (e.g. `orchestrator completions bash > ~/.local/share/bash-completion/completions/orchestrator`).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Write the manual pages, one per command (roff): `orchestrator man DIR && man -l DIR/orchestrator.1`.
    Man {
        /// Directory for `orchestrator.1` and the `orchestrator-<command>.1` pages it refers to.
        dir: PathBuf,
    },
}

impl Command {
    /// Commands that only read files and print: a reader that goes away
    /// (`plan ... | head`) ends them quietly, as it ends `cat`. Cluster commands
    /// keep SIGPIPE ignored: their sockets and child pipes report EPIPE as an error.
    fn offline(&self) -> bool {
        !matches!(self, Command::Cluster(_))
    }
}

fn main() {
    let cli = Cli::parse();
    if cli.command.offline() {
        restore_default_sigpipe();
    }
    init_logging(cli.verbose);
    if let Err(e) = run(cli.command) {
        eprintln!("error: {}", chain(&e));
        std::process::exit(1);
    }
}

/// The error and its causes, `: `-joined, each said once (many messages
/// already end with their cause's text).
fn chain(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !out.contains(&c) {
            out = format!("{out}: {c}");
        }
    }
    out
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only for a person at a terminal: a file or a pipe gets plain text.
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    // A warning for a person needs no timestamp; -v logs (for following a run) keep it.
    if verbose == 0 {
        fmt.without_time().init();
    } else {
        fmt.init();
    }
}

/// Rust ignores SIGPIPE, so a closed stdout turns `println!` into a panic
/// (exit 101). The default action ends the process silently, like any Unix filter.
fn restore_default_sigpipe() {
    // SAFETY: called once at start-up, before any thread exists; setting a
    // signal's disposition to SIG_DFL has no other effect on the process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The experiment, judged where it would run: the cluster `submit` and
/// `resume` would use (and why); a `local` one runs the worker on this CPU,
/// whose memory the verdicts of `plan`, `explain` and `fit` are judged against.
fn where_it_runs(exp: &ExperimentArgs, cluster: Option<&str>) -> Result<(sweep::Sweep, submit::ClusterChoice)> {
    let sweep = exp.load()?;
    let stored = state::View::new(&exp.state_dir, &sweep.experiment.name)?.sweep()?;
    let cluster = submit::ClusterChoice::of(cluster, &sweep, stored.as_ref());
    let sweep = submit::judge_where_it_runs(&sweep, &cluster, None);
    Ok((sweep, cluster))
}

/// `plan`: the table (or JSON rows), then the calibration, the cluster
/// `submit` would use and why, what the verdicts were judged against, and the
/// time limit a task needs.
fn run_plan(exp: &ExperimentArgs, json: bool, cluster: Option<&str>) -> Result<()> {
    let (sweep, cluster) = where_it_runs(exp, cluster)?;
    let (predictor, source) = exp.predictor(&sweep)?;
    let rows = plan::rows(&sweep, &predictor);
    if json {
        for r in &rows {
            println!("{}", serde_json::to_string(r).context("serialising a plan row")?);
        }
    } else {
        print!("{}", plan::table(&sweep, &rows));
        println!("calibration: {source}");
        println!("cluster: {cluster}");
        if let Some(host) = sweep.host_memory_gib {
            println!(
                "capacity: {host:.1} GiB, this machine's memory (the worker runs on its CPU), not the {}'s {:.1} GiB",
                sweep.experiment.gpu,
                sweep.experiment.gpu.capacity_gib()
            );
        }
        let (clusters, label) = ClustersFile::load_or_default(None)?;
        if let Err(e) = clusters.get(&cluster.name, &label) {
            println!("note: {e}: `submit` will refuse it");
        } else if cluster.check(&sweep).is_err() {
            println!(
                "note: planned for {}, so `submit` will not run it on this CPU: name its cluster \
                 (`cluster:` or --cluster NAME), or pass --cluster local",
                sweep.experiment.gpu
            );
        }
        let runs = state::View::new(&exp.state_dir, &sweep.experiment.name)?.every_events_file();
        let time = walltime::for_sweep(&sweep, &runs, sweep.experiment.slurm.time.as_deref());
        println!("{time}");
        if let Some(w) = time.warning() {
            tracing::warn!("{w}");
        }
    }
    Ok(())
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Plan { exp, json, cluster } => run_plan(&exp, json, cluster.as_deref())?,
        Command::Predict { records, calibration, budget_gb } => {
            precheck::cli::run_predict(&records, calibration.as_deref(), budget_gb)?;
        }
        Command::Calibrate { check: true, state_dir, .. } => precheck::cli::run_check(&state_dir)?,
        Command::Calibrate { records, out, no_loto, .. } => {
            precheck::cli::run_calibrate(&records, out.as_deref(), !no_loto)?;
        }
        Command::Explain { exp, args } => {
            let (sweep, _) = where_it_runs(&exp, None)?;
            orchestrator::advisor::cli::run_explain(&sweep, &args, &exp.predictor(&sweep)?.0)?
        }
        Command::Fit { exp, args } => {
            let (sweep, _) = where_it_runs(&exp, None)?;
            orchestrator::advisor::cli::run_fit(&sweep, &args, &exp.predictor(&sweep)?.0)?
        }
        Command::Evidence { records, experiments, active } => {
            let settings = orchestrator::active::Settings {
                // The group's records are PyTorch's; each experiment file names its own.
                runtime: precheck::Runtime::default(),
                target_error: active.target_error,
                max_runs: active.max_runs,
                round_size: active.round_size,
            };
            let work = tempfile::tempdir().context("a scratch directory for the replay cluster")?;
            if experiments.is_empty() {
                let runs = orchestrator::evidence::run(&records, &settings, work.path())?;
                print!("{}", orchestrator::evidence::Tally(&runs));
            } else {
                let runs = orchestrator::evidence::experiments::run(&experiments, &records, &settings, work.path())?;
                print!("{}", orchestrator::evidence::ExperimentTally(&runs));
            }
        }
        Command::Cluster(c) => submit::cli::run(c)?,
        Command::Report(args) => orchestrator::report::cli::run(&args)?,
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "orchestrator", &mut std::io::stdout());
        }
        Command::Man { dir } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(Cli::command(), &dir)
                .with_context(|| format!("writing the manual pages into {}", dir.display()))?;
            let pages = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
            println!("{pages} pages in {}; read them with `man -l {}/orchestrator.1`", dir.display(), dir.display());
        }
    }
    Ok(())
}
