//! Where a sweep runs and what the precheck says of it there, and `submit`'s
//! first stage ([`read_and_judge`]): the sweep read as the cluster it goes to
//! runs it, each config judged, and all of it recorded in the state
//! directory (the sweep, and a record per config with its verdict).

use facts::run::ConfigHash;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::poll::result_grace_s;
use super::{open_target, CommandError, Options, Target};
use crate::cluster::{ClusterError, ClustersFile, TransportKind};
use crate::experiment::locate::KeyPath;
use crate::precheck::overlay::CalibrationSource;
use crate::precheck::{Predictor, Verdict};
use crate::state::{Change, ConfigRecord, Seen, StateDir, StoredSweep, View};
use crate::sweep::Sweep;

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
/// sweep judged there ([`as_run_on`]): what `plan`, `explain`, `fit`,
/// `status`, `render`, `submit` and the active loop all judge. A clusters
/// file that cannot be read is an error; a cluster it does not name is
/// judged against its GPU (`submit` then says the name is unknown).
pub fn where_it_runs(
    sweep: &Sweep,
    cluster: Option<&str>,
    stored: Option<&StoredSweep>,
    clusters_file: Option<&Path>,
) -> Result<(Sweep, ClusterChoice), ClusterError> {
    let choice = ClusterChoice::of(cluster, sweep, stored);
    let (file, label) = ClustersFile::load_or_default(clusters_file)?;
    let local = file.get(&choice.name, &label).is_ok_and(|(_, c)| c.transport == TransportKind::Local);
    Ok((as_run_on(sweep, &choice, local), choice))
}

/// `sweep` as `choice` runs it: where that is a cluster of transport `local`
/// (the worker on this machine's CPU) and `submit` would run it there, judged
/// against this machine's memory ([`Sweep::host_memory_gib`]) rather than
/// the GPU it names; elsewhere against its GPU, as written.
pub(crate) fn as_run_on(sweep: &Sweep, choice: &ClusterChoice, local: bool) -> Sweep {
    let mut out = sweep.clone();
    out.host_memory_gib =
        if local && choice.check(sweep).is_ok() { crate::transport::local::machine_memory_gib() } else { None };
    out
}

/// The cluster name for a sweep: command line, then the state, then the experiment file, then `local`.
pub(crate) fn cluster_name(opts: &Options, sweep: &Sweep, st: Option<&StoredSweep>) -> String {
    ClusterChoice::of(opts.cluster.as_deref(), sweep, st).name
}

/// What the stages of `submit` share, built once at the start: the
/// experiment's state directory (its lock held until the end), the cluster
/// chosen and the connection to it, and the options with the result grace
/// that cluster gets ([`result_grace_s`]).
pub(crate) struct Site {
    pub st: StateDir,
    pub target: Target,
    pub choice: ClusterChoice,
    /// The options, with the result grace this cluster gets.
    pub opts: Options,
    /// That grace, in seconds.
    pub grace_s: f64,
}

impl Site {
    /// Opens the state directory of `sweep`'s experiment and the cluster it
    /// goes to: the stored cluster, once something may have reached it;
    /// else as if new ([`ClusterChoice::of`]). An experiment that would run
    /// on this machine's CPU by default is refused, before its state
    /// directory is made when it has none.
    pub(crate) fn open(sweep: &Sweep, opts: &Options) -> Result<Site, CommandError> {
        let name = &sweep.experiment.name;
        if !View::new(&opts.state_root, name)?.has_sweep() {
            ClusterChoice::of(opts.cluster.as_deref(), sweep, None).check(sweep)?;
        }
        let st = StateDir::open(&opts.state_root, name, opts.lock_wait)?;
        let choice = ClusterChoice::of(opts.cluster.as_deref(), sweep, st.view().pinned_sweep()?.as_ref());
        choice.check(sweep)?;
        let target = open_target(opts, &choice.name).map_err(|e| unknown_in_file(e, &choice, &sweep.source))?;
        let grace_s = result_grace_s(opts, &target);
        let opts = Options { result_grace: std::time::Duration::from_secs_f64(grace_s), ..opts.clone() };
        Ok(Site { st, target, choice, opts, grace_s })
    }

    /// Whether the cluster runs the worker as processes of this machine.
    pub(crate) fn is_local(&self) -> bool {
        self.target.config.transport == TransportKind::Local
    }
}

/// An unknown cluster that the experiment file named, reported at its line there.
fn unknown_in_file(e: CommandError, choice: &ClusterChoice, source: &Path) -> CommandError {
    match (e, choice.from) {
        (CommandError::Cluster(e @ ClusterError::Unknown { .. }), ClusterSource::Experiment) => {
            CommandError::Refused(match crate::experiment::Source::read(source) {
                Ok(src) => src.error_in_file(&KeyPath::default().key("cluster"), e.to_string()).to_string(),
                Err(_) => format!("{}: cluster: {e}", source.display()),
            })
        }
        (e, _) => e,
    }
}

/// The sweep as `site` runs it ([`as_run_on`]), recorded with every
/// config's verdict ([`record`]): what the later stages decide from.
pub(crate) fn read_and_judge(sweep: &Sweep, site: &mut Site) -> Result<Sweep, CommandError> {
    let judged = as_run_on(sweep, &site.choice, site.is_local());
    record(&judged, site)?;
    Ok(judged)
}

/// The precheck's verdict on each config, by hash.
pub(crate) fn verdicts(sweep: &Sweep, state_root: &Path) -> BTreeMap<ConfigHash, Verdict> {
    judged(sweep, state_root).into_iter().map(|(h, (v, _))| (h, v)).collect()
}

/// The precheck's verdict on each config, by hash, with the identity of the
/// calibration that made it (see [`CalibrationSource::for_family`]).
fn judged(sweep: &Sweep, state_root: &Path) -> BTreeMap<ConfigHash, (Verdict, String)> {
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

/// Records the sweep and a record per config (new ones created, verdicts
/// refreshed). The cluster is fixed at the first submission that may have
/// reached it ([`crate::state::View::pinned_sweep`]).
fn record(sweep: &Sweep, site: &mut Site) -> Result<(), CommandError> {
    let (st, cluster) = (&mut site.st, &site.choice.name);
    let prev = st.view().sweep()?;
    if let Some(prev) = &prev {
        if prev.cluster != *cluster && st.view().pinned_sweep()?.is_some() {
            return Err(CommandError::Refused(format!(
                "experiment `{}` was submitted to cluster `{}`; it cannot continue on `{cluster}` \
                 (use --cluster {} or another experiment name)",
                st.experiment(),
                prev.cluster,
                prev.cluster
            )));
        }
    }
    let clusters_file = clusters_file_used(site.opts.clusters_file.as_deref())
        .or_else(|| prev.as_ref().and_then(|p| p.clusters_file.clone()));
    let merged = merged(prev, sweep, st.records());
    st.save_sweep(&StoredSweep { cluster: cluster.to_string(), sweep: merged, clusters_file })?;
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

/// The clusters file a command with `named` (`--clusters`) reads, absolute:
/// that one, else the default (`$SWEEP_CLUSTERS`, `./clusters.yaml`) where
/// it exists; `None` when none is read (the built-in clusters only).
fn clusters_file_used(named: Option<&Path>) -> Option<std::path::PathBuf> {
    let path = named.map(Path::to_path_buf).or_else(|| Some(crate::cluster::default_path()).filter(|p| p.is_file()))?;
    Some(std::path::absolute(&path).unwrap_or(path))
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
        let prev = StoredSweep { cluster: "local".into(), sweep: full, clusters_file: None };
        let m = merged(Some(prev), &edited, &records);
        let names: Vec<&str> = m.configs.iter().map(|c| c.name.as_str()).collect();
        assert!(names.contains(&removed_submitted.name.as_str()), "a submitted config stays: {names:?}");
        assert!(!names.contains(&removed_never.name.as_str()), "a never-submitted one goes: {names:?}");
        assert_eq!(m.configs.len(), edited.configs.len() + 1);
    }
}
