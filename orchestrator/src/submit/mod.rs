//! The cluster commands: `submit`, `status [--watch]`, `resume`, `cancel`, `render`.
//!
//! `submit` and `resume` are one pass (`pipeline`), a module per stage, each
//! a function of the stage before's output, all of them handed the `Site`
//! opened at the start (where the sweep runs, its state directory):
//! `judge` → `decide` (with `poll`, `resume`'s first poll) → `arrays` → for
//! each array `intend` → `send`.
//!
//! Beside them: [`protocol`], the submission protocol (intent → sbatch →
//! submitted, or unresolved until SLURM answers by job name) as one state
//! machine; `poll`, one squeue + one sacct applied and the workers' events
//! read incrementally; `probe`, whether the worker starts on the cluster;
//! `preview` (`render`: the scripts `submit` would send, submitting nothing);
//! `view` (the `status` table, live phase and peak, `--watch`); `cancel`;
//! `install` and `warm`; the active loop (`active`).
//!
//! Each command takes the experiment's lock for as long as it touches the
//! state (a watching `status` only while it polls), so two orchestrators never
//! race. SLURM is the source of truth for what runs; the state directory is
//! the source of truth for what was *asked*.

use facts::run::ConfigHash;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cluster::ClusterError;
use crate::render::RenderFailure;
use crate::slurm::RetryPolicy;
use crate::state::StateError;
use crate::transport::TransportError;

pub mod active;
mod arrays;
pub mod cancel;
mod decide;
pub mod install;
mod intend;
pub mod interrupt;
mod judge;
mod pipeline;
mod poll;
mod preview;
mod probe;
pub mod protocol;
mod segments;
mod send;
pub mod view;
pub mod warm;

pub use cancel::cancel;
pub use interrupt::Interrupt;
pub use judge::{where_it_runs, ClusterChoice, ClusterSource};
pub use pipeline::{submit, SubmitReport};
pub use poll::{attempt_events, last_result, PollSummary};
pub use preview::{predictions_it_runs, render, Rendered};
pub use view::{status, status_until, StatusReport, StatusRow, Watch};

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Fs(#[from] crate::fsio::FsError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error(transparent)]
    Render(#[from] RenderFailure),
    #[error("{0}")]
    Refused(String),
}

/// Settings shared by the commands (from the command line).
#[derive(Debug, Clone)]
pub struct Options {
    /// Local state root (`state/`).
    pub state_root: PathBuf,
    /// Clusters file (default `$SWEEP_CLUSTERS` or `./clusters.yaml`).
    pub clusters_file: Option<PathBuf>,
    /// Overrides the experiment's `cluster:`.
    pub cluster: Option<String>,
    /// Where templates are looked for, in order (then the built-ins).
    pub template_dirs: Vec<PathBuf>,
    /// Submit `risky` configs too (default: only `fits`).
    pub include_risky: bool,
    /// Submit `oom` (and `risky`) configs too. `invalid` ones never run.
    pub force: bool,
    pub retry: RetryPolicy,
    /// How long to wait for another orchestrator's lock.
    pub lock_wait: Duration,
    /// How long a job that ended without a visible result is read again
    /// before it counts as killed (shared filesystems show the worker's last
    /// lines late).
    pub result_grace: Duration,
    /// Only these configs (hashes) may be submitted (an active sweep's round).
    pub only: Option<BTreeSet<ConfigHash>>,
    /// Submit configs an active sweep answered by a settled prediction too
    /// (`resume --all`); by default they are not run.
    pub all: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            state_root: PathBuf::from("state"),
            clusters_file: None,
            cluster: None,
            template_dirs: vec![PathBuf::from("templates")],
            include_risky: false,
            force: false,
            retry: RetryPolicy::default(),
            lock_wait: Duration::from_secs(10),
            result_grace: Duration::from_secs(120),
            only: None,
            all: false,
        }
    }
}

impl Options {
    /// With no clusters file named, the one `experiment`'s sweep was
    /// submitted with (its state keeps it), where that file still exists: a
    /// sweep submitted with `--clusters FILE` is found again without it.
    pub fn remembering_clusters(mut self, experiment: &str) -> Result<Options, CommandError> {
        if self.clusters_file.is_none() {
            let stored = crate::state::View::new(&self.state_root, experiment)?.sweep()?;
            self.clusters_file = stored.and_then(|s| s.clusters_file).filter(|p| p.is_file());
        }
        Ok(self)
    }
}

pub(crate) use crate::target::blocking;
pub use crate::target::{block_on, Target};

/// 8 hex digits naming the experiment in job names.
pub fn experiment_hash(name: &str) -> String {
    hex::encode(&Sha256::digest(name.as_bytes())[..4])
}

pub use crate::state::StoredSweep;

pub(crate) fn open_target(opts: &Options, name: &str) -> Result<Target, CommandError> {
    Ok(crate::target::open(opts.clusters_file.as_deref(), name, &opts.state_root)?)
}

impl From<crate::target::TargetError> for CommandError {
    fn from(e: crate::target::TargetError) -> Self {
        match e {
            crate::target::TargetError::Cluster(e) => CommandError::Cluster(e),
            crate::target::TargetError::Transport(e) => CommandError::Transport(e),
        }
    }
}

/// Loads the stored sweep of an experiment by name, each config keyed by its
/// hash now (as opening its state directory keys the records).
pub fn stored_sweep(state_root: &Path, experiment: &str) -> Result<StoredSweep, CommandError> {
    let stored = crate::state::View::new(state_root, experiment)?.sweep()?;
    stored.ok_or_else(|| {
        CommandError::Refused(format!(
            "no state for experiment `{experiment}` under {} (submit it first, or pass the experiment file)",
            state_root.display()
        ))
    })
}
