//! The command line, the one layer that knows clap: the arguments of every
//! command and what it prints. A file per command (or per family of
//! commands); each parses, calls into the domain modules and prints.
//! `main.rs` parses [`Cli`] and calls [`run`].

mod advise;
mod evidence;
mod hint;
mod interrupt;
mod plan;
pub mod precheck;
mod report;
mod submit;
mod train_records;
mod watch;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser, Subcommand};
use std::path::PathBuf;

use crate::precheck::overlay::CalibrationSource;
use crate::precheck::Predictor;
use crate::submit::ClusterChoice;
use crate::sweep::Sweep;

#[derive(Parser)]
#[command(
    name = "orchestrator",
    version,
    about = "GPU memory-profiling sweeps on SLURM: plan, precheck, submit, resume, report"
)]
pub struct Cli {
    /// More log output (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
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
    fn load(&self) -> Result<Sweep> {
        // LoadError's message is complete (file:line:col: key: what); no extra context.
        Ok(crate::sweep::load(&self.file, &self.overrides)?)
    }

    /// The sweep's predictor (local overlay unless `--shipped-calibration`) and which calibration it is.
    fn predictor(&self, sweep: &Sweep) -> Result<(Predictor, CalibrationSource)> {
        let local = (!self.shipped_calibration).then(|| crate::state::local_overlay(&self.state_dir)).flatten();
        Ok(sweep.predictor_in(local.as_ref().map(|(o, path)| (o, path.as_path())))?)
    }
}

#[derive(Subcommand)]
pub enum Command {
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
    /// Predict the peak memory of measurement records, or of training-run records
    /// (the whole run's peak, phase by phase), measured fields ignored: one JSON line each.
    Predict {
        /// Measurement or training-run JSONL file(s) (formats: data/README.md).
        #[arg(long, required = true, num_args = 1..)]
        records: Vec<PathBuf>,
        /// Training-run records: a markdown table of every run beside its
        /// recorded peak and the scores of the predictors, instead of JSON lines.
        #[arg(long)]
        score: bool,
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
        args: advise::ExplainArgs,
    },
    /// The configs predicted to fit a GPU and budget, ranked by parameters per input shape, with the Pareto front.
    Fit {
        #[command(flatten)]
        exp: ExperimentArgs,
        #[command(flatten)]
        args: advise::FitArgs,
    },
    /// Replay evidence for active profiling: per source table of the records, the calibration
    /// refitted without that table and an active sweep over its configs on the replay cluster
    /// (`--savings`: what `plan` would have saved the group on its own sweeps).
    Evidence {
        /// Measurement JSONL whose tables are replayed.
        #[arg(long, default_value = "data/vram-measurements.jsonl")]
        records: PathBuf,
        /// Experiment files (or directories of them) to run as `submit FILE --active --cluster replay`
        /// does, answered from --records, instead of the records' own tables.
        #[arg(long, num_args = 1..)]
        experiments: Vec<PathBuf>,
        /// Experiment files (or directories of them): per file, its configs with a record, those
        /// that ran out of memory or past the budget, and what `plan` calls them before submission
        /// with a calibration fitted without their tables. Runs nothing.
        #[arg(long, num_args = 1.., conflicts_with = "experiments")]
        savings: Vec<PathBuf>,
        /// Per model family: the records' peaks inside the bands of a calibration fitted without
        /// their table, the held-out error, and OOMs called `fits`. Runs nothing.
        #[arg(long, conflicts_with_all = ["experiments", "savings"])]
        held_out: bool,
        #[command(flatten)]
        active: evidence::ActiveArgs,
    },
    #[command(flatten)]
    Cluster(submit::ClusterCommand),
    /// Markdown (and JSON) report of a sweep from its state, or of measurement records, with plots.
    Report(report::ReportArgs),
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
    pub fn offline(&self) -> bool {
        !matches!(self, Command::Cluster(_))
    }
}

/// The experiment, judged where it would run: the cluster `submit` and
/// `resume` would use (and why); a `local` one runs the worker on this CPU,
/// whose memory the verdicts of `plan`, `explain` and `fit` are judged against.
fn where_it_runs(exp: &ExperimentArgs, cluster: Option<&str>) -> Result<(Sweep, ClusterChoice)> {
    let sweep = exp.load()?;
    let stored = crate::state::View::new(&exp.state_dir, &sweep.experiment.name)?.pinned_sweep()?;
    // The clusters file the sweep was submitted with, where it still exists.
    let file = stored.as_ref().and_then(|s| s.clusters_file.clone()).filter(|p| p.is_file());
    Ok(crate::submit::where_it_runs(&sweep, cluster, stored.as_ref(), file.as_deref())?)
}

/// Runs one command.
pub fn run(command: Command) -> Result<()> {
    match command {
        Command::Plan { exp, json, cluster } => plan::run(&exp, json, cluster.as_deref())?,
        Command::Predict { records, calibration, budget_gb, score } => {
            precheck::run_predict(&records, calibration.as_deref(), budget_gb, score)?;
        }
        Command::Calibrate { check: true, state_dir, .. } => precheck::run_check(&state_dir)?,
        Command::Calibrate { records, out, no_loto, .. } => {
            precheck::run_calibrate(&records, out.as_deref(), !no_loto)?;
        }
        Command::Explain { exp, args } => {
            let (sweep, _) = where_it_runs(&exp, None)?;
            advise::run_explain(&sweep, &args, &exp.predictor(&sweep)?.0)?
        }
        Command::Fit { exp, args } => {
            let (sweep, _) = where_it_runs(&exp, None)?;
            advise::run_fit(&sweep, &args, &exp.predictor(&sweep)?.0)?
        }
        Command::Evidence { records, savings, .. } if !savings.is_empty() => evidence::run_savings(&records, &savings)?,
        Command::Evidence { records, held_out: true, .. } => evidence::run_held_out(&records)?,
        Command::Evidence { records, experiments, active, .. } => evidence::run(&records, &experiments, &active)?,
        Command::Cluster(c) => submit::run(c)?,
        Command::Report(args) => report::run(&args)?,
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
