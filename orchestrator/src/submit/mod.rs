//! The cluster commands: `submit`, `status [--watch]`, `resume`, `cancel`, `render`,
//! one module per stage of a config's life:
//!
//! - [`protocol`]: the submission protocol (intent → sbatch → submitted, or
//!   unresolved until SLURM answers by job name), as one state machine;
//! - `arrays`: rendering job arrays (scripts and manifests);
//! - `preview`: `render`, the scripts `submit` would send, submitting nothing;
//! - `send`: `submit`/`resume`: what to (re)submit, and sending it;
//! - `poll`: one squeue + one sacct, applied to the records;
//! - `collect`: the workers' events, read incrementally, and the measurements;
//! - `view`: the `status` table, live phase and peak, ETA, `--watch`;
//! - `cancel`.
//!
//! Each command takes the experiment's lock for as long as it touches the
//! state (a watching `status` only while it polls), so two orchestrators never
//! race. SLURM is the source of truth for what runs; the state directory is
//! the source of truth for what was *asked*.

use sha2::{Digest, Sha256};
use spec::run::ConfigHash;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cluster::{ClusterError, ClustersFile};
use crate::precheck::overlay::CalibrationSource;
use crate::precheck::{Predictor, Verdict, VerdictKind};
use crate::render::RenderFailure;
use crate::slurm::RetryPolicy;
use crate::state::{Change, ConfigRecord, Seen, StateDir, StateError};
use crate::sweep::Sweep;
use crate::transport::TransportError;

pub mod active;
mod arrays;
pub mod cancel;
pub mod install;
pub mod interrupt;
mod poll;
mod preview;
mod probe;
pub mod protocol;
mod pull;
mod send;
pub mod view;
pub mod warm;

pub use cancel::cancel;
pub use interrupt::Interrupt;
pub use poll::PollSummary;
pub use preview::{predictions_it_runs, render, Rendered};
pub use pull::{attempt_events, last_result};
pub use send::{submit, SubmitReport};
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

/// The precheck's verdict on each config, by hash.
pub(crate) fn verdicts(sweep: &Sweep, state_root: &Path) -> BTreeMap<ConfigHash, Verdict> {
    judged(sweep, state_root).into_iter().map(|(h, (v, _))| (h, v)).collect()
}

/// The precheck's verdict on each config, by hash, with the identity of the
/// calibration that made it (see [`CalibrationSource::for_family`]).
pub(crate) fn judged(sweep: &Sweep, state_root: &Path) -> BTreeMap<ConfigHash, (Verdict, String)> {
    // The runtime was checked when the file was loaded; a sweep stored by an
    // older version may name one no longer shipped.
    let local = crate::state::local_overlay(state_root);
    let (p, source) = match sweep.predictor_in(local.as_ref().map(|(o, path)| (o, path.as_path()))) {
        Ok((p, source)) => {
            tracing::info!("precheck calibration: {source}");
            (p, source)
        }
        Err(e) => {
            tracing::warn!("{e}; predicting with the pytorch calibration");
            (Predictor::pytorch(), CalibrationSource::Shipped { runtime: "pytorch/bf16-amp".into(), records: None })
        }
    };
    sweep
        .configs
        .iter()
        .map(|c| (c.hash.clone(), (sweep.verdict(&p, c), source.for_family(c.config.model.family()))))
        .collect()
}

/// Which verdicts `submit` sends to the cluster.
pub(crate) fn allowed(verdict: VerdictKind, opts: &Options) -> bool {
    match verdict {
        VerdictKind::Fits => true,
        VerdictKind::Risky => opts.include_risky || opts.force,
        VerdictKind::Oom => opts.force,
        VerdictKind::Invalid => false, // fails at once with a dimension error, never worth a job
    }
}

/// Opens the state, records the sweep and a record per config (new ones
/// created, verdicts refreshed). The cluster is fixed at the first submission
/// that may have reached it ([`crate::state::View::pinned_sweep`]).
pub(crate) fn prepare(st: &mut StateDir, sweep: &Sweep, cluster: &str) -> Result<(), CommandError> {
    let prev = st.view().sweep()?;
    if let Some(prev) = &prev {
        if prev.cluster != cluster && st.view().pinned_sweep()?.is_some() {
            return Err(CommandError::Refused(format!(
                "experiment `{}` was submitted to cluster `{}`; it cannot continue on `{cluster}` \
                 (use --cluster {} or another experiment name)",
                st.experiment(),
                prev.cluster,
                prev.cluster
            )));
        }
    }
    st.save_sweep(&StoredSweep { cluster: cluster.to_string(), sweep: merged(prev, sweep, st.records()) })?;
    let v = judged(sweep, st.root().parent().unwrap_or(Path::new(".")));
    let mut seen = BTreeSet::new();
    for c in &sweep.configs {
        if !seen.insert(c.hash.clone()) {
            tracing::warn!("config `{}` computes the same as an earlier one (hash {}): run once", c.name, c.hash);
            continue;
        }
        let found = v.get(&c.hash);
        st.apply(Change::Config(Seen {
            hash: c.hash.clone(),
            name: c.name.clone(),
            verdict: found.map(|(v, _)| v.kind()),
            predicted_gib: found.and_then(|(v, _)| v.predicted_gib()),
            calibration: found.map(|(_, calibration)| calibration.clone()),
        }))?;
    }
    Ok(())
}

/// The sweep to store: the new file's configs, then every config of the
/// stored sweep that was submitted but is no longer in the file (an edited
/// file must not hide jobs that run, or results, from `status` and `report`).
fn merged(prev: Option<StoredSweep>, sweep: &Sweep, records: &BTreeMap<ConfigHash, ConfigRecord>) -> Sweep {
    let mut out = sweep.clone();
    let Some(prev) = prev else { return out };
    let have: BTreeSet<ConfigHash> = out.configs.iter().map(|c| c.hash.clone()).collect();
    for c in prev.sweep.configs {
        let submitted = records.get(&c.hash).is_some_and(|r| r.attempts().iter().any(|a| !a.abandoned()));
        if submitted && !have.contains(&c.hash) {
            out.configs.push(c);
        }
    }
    out
}

/// Where a sweep goes, and what said so.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClusterChoice {
    pub name: String,
    pub from: ClusterSource,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClusterSource {
    /// `--cluster`.
    CommandLine,
    /// The cluster the experiment was first submitted to (its state says).
    State,
    /// The experiment file's `cluster:`.
    Experiment,
    /// None named: the built-in `local` (this machine's CPU).
    Default,
}

impl ClusterChoice {
    /// Command line, then the state, then the experiment file, then `local`.
    pub fn of(cluster: Option<&str>, sweep: &Sweep, st: Option<&StoredSweep>) -> ClusterChoice {
        let (name, from) = match (cluster, st, &sweep.experiment.cluster) {
            (Some(c), _, _) => (c.to_string(), ClusterSource::CommandLine),
            (None, Some(s), _) => (s.cluster.clone(), ClusterSource::State),
            (None, None, Some(c)) => (c.clone(), ClusterSource::Experiment),
            (None, None, None) => ("local".to_string(), ClusterSource::Default),
        };
        ClusterChoice { name, from }
    }

    /// Refuses the implicit `local` for an experiment that predicts for a GPU
    /// runtime: its configs (tens of GiB) would run on this machine's CPU.
    pub fn check(&self, sweep: &Sweep) -> Result<(), CommandError> {
        if self.from != ClusterSource::Default || sweep.experiment.runtime.is_cpu() {
            return Ok(());
        }
        Err(CommandError::Refused(format!(
            "experiment `{}` names no cluster and is planned for {} (runtime `{}`): the default, the built-in \
             `local` cluster, would run it on this machine's CPU. Name its cluster (`cluster:` in the file, or \
             --cluster NAME), or pass --cluster local to run it here anyway",
            sweep.experiment.name, sweep.experiment.gpu, sweep.experiment.runtime
        )))
    }
}

impl std::fmt::Display for ClusterChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why = match self.from {
            ClusterSource::CommandLine => "from --cluster",
            ClusterSource::State => "where the experiment was first submitted",
            ClusterSource::Experiment => "the experiment's `cluster:`",
            ClusterSource::Default => "none named: the built-in cluster, this machine's CPU",
        };
        write!(f, "{} ({why})", self.name)
    }
}

/// The cluster `submit` would use for `sweep` ([`ClusterChoice::of`]: the
/// command line's, the stored sweep's, the file's, else `local`), and the
/// sweep judged there (`judge_where_it_runs`): what `plan`, `explain`,
/// `fit`, `status`, `render`, `submit` and the active loop all judge.
pub fn where_it_runs(
    sweep: &Sweep,
    cluster: Option<&str>,
    stored: Option<&StoredSweep>,
    clusters_file: Option<&Path>,
) -> (Sweep, ClusterChoice) {
    let choice = ClusterChoice::of(cluster, sweep, stored);
    (judge_where_it_runs(sweep, &choice, clusters_file), choice)
}

/// `sweep` as `choice` runs it: where that is a cluster of transport `local`
/// (the worker on this machine's CPU) and `submit` would run it there, judged
/// against this machine's memory ([`Sweep::host_memory_gib`]) rather than
/// the GPU it names; elsewhere against its GPU, as written.
fn judge_where_it_runs(sweep: &Sweep, choice: &ClusterChoice, clusters_file: Option<&Path>) -> Sweep {
    let mut out = sweep.clone();
    let local = ClustersFile::load_or_default(clusters_file)
        .ok()
        .and_then(|(file, label)| file.get(&choice.name, &label).ok())
        .is_some_and(|(_, c)| c.transport == crate::cluster::TransportKind::Local);
    out.host_memory_gib =
        if local && choice.check(sweep).is_ok() { crate::transport::local::machine_memory_gib() } else { None };
    out
}

/// The cluster name for a sweep: command line, then the state, then the experiment file, then `local`.
pub(crate) fn cluster_name(opts: &Options, sweep: &Sweep, st: Option<&StoredSweep>) -> String {
    ClusterChoice::of(opts.cluster.as_deref(), sweep, st).name
}

/// Seconds an ended job's missing result is awaited on `target`: the
/// `--result-grace` for a cluster whose files reach this machine through a
/// shared filesystem or SFTP, none for `local` processes writing this
/// machine's disk (nothing can arrive late there).
pub(crate) fn result_grace_s(opts: &Options, target: &Target) -> f64 {
    match target.config.transport {
        crate::cluster::TransportKind::Local => 0.0,
        _ => opts.result_grace.as_secs_f64(),
    }
}

pub(crate) fn same_file(local: &Path, remote: &str) -> bool {
    std::path::absolute(local).map(|p| p == Path::new(remote)).unwrap_or(false)
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

pub(crate) fn template_dirs(opts: &Options, sweep: &Sweep) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    // Templates beside the experiment file first (`experiments/templates/`), then the given dirs.
    if let Some(parent) = sweep.source.parent() {
        dirs.push(parent.join("templates"));
    }
    dirs.extend(opts.template_dirs.iter().cloned());
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Attempt;

    #[test]
    fn configs_removed_from_the_file_stay_in_the_stored_sweep_while_submitted() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments/demo.yaml");
        let full = crate::sweep::load(&file, &[]).expect("demo loads");
        let mut edited = full.clone();
        let removed_submitted = edited.configs.remove(0);
        let removed_never = edited.configs.remove(0);
        let attempt = Attempt::intended("s001-x", 0, 0.0).in_array("5");
        let rec = ConfigRecord::fixture(&removed_submitted.hash, &removed_submitted.name).with_attempt(attempt);
        let records = BTreeMap::from([(removed_submitted.hash.clone(), rec)]);
        let prev = StoredSweep { cluster: "local".into(), sweep: full };
        let m = merged(Some(prev), &edited, &records);
        let names: Vec<&str> = m.configs.iter().map(|c| c.name.as_str()).collect();
        assert!(names.contains(&removed_submitted.name.as_str()), "a submitted config stays: {names:?}");
        assert!(!names.contains(&removed_never.name.as_str()), "a never-submitted one goes: {names:?}");
        assert_eq!(m.configs.len(), edited.configs.len() + 1);
    }
}
