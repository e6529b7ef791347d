//! `orchestrator evidence`: replayed active sweeps on the group's tables or experiment files, and
//! what `plan` would have saved the group (`--savings`).

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// How an active sweep chooses and when it stops.
#[derive(clap::Args, Debug, Clone)]
pub struct ActiveArgs {
    /// Largest band an unmeasured config may keep (`5%` or `0.05`).
    #[arg(long, default_value = crate::active::DEFAULT_TARGET_ERROR, value_parser = crate::active::parse_share)]
    pub target_error: f64,
    /// Runs at most, all rounds together.
    #[arg(long)]
    pub max_runs: Option<usize>,
    /// Configs per round at most (default: a tenth of the sweep, at least 2).
    #[arg(long)]
    pub round_size: Option<usize>,
}

/// Runs the evidence sweeps and prints their tally.
pub fn run(records: &Path, experiments: &[PathBuf], active: &ActiveArgs) -> Result<()> {
    let settings = crate::active::Settings {
        // The group's records are PyTorch's; each experiment file names its own.
        runtime: crate::precheck::Runtime::default(),
        target_error: active.target_error,
        max_runs: active.max_runs,
        round_size: active.round_size,
    };
    let work = tempfile::tempdir().context("a scratch directory for the replay cluster")?;
    if experiments.is_empty() {
        let runs = crate::evidence::run(records, &settings, work.path())?;
        print!("{}", crate::evidence::Tally(&runs));
    } else {
        let runs = crate::evidence::experiments::run(experiments, records, &settings, work.path())?;
        print!("{}", crate::evidence::ExperimentTally(&runs));
    }
    Ok(())
}

/// `evidence --savings`: what `plan`, held out, calls the group's failed runs.
pub fn run_savings(records: &Path, experiments: &[PathBuf]) -> Result<()> {
    let savings = crate::evidence::savings::run(experiments, records).context("evidence --savings")?;
    print!("{}", crate::evidence::SavingsTally(&savings));
    Ok(())
}

/// `evidence --held-out`: each family's records inside the bands of a fit without their table.
pub fn run_held_out(records: &Path) -> Result<()> {
    let families = crate::evidence::held_out::run(records).context("evidence --held-out")?;
    print!("{}", crate::evidence::HeldOutTally(&families));
    Ok(())
}
