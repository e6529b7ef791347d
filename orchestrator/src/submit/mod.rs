//! The cluster commands: `submit`, `status [--watch]`, `resume`, `cancel`, `render`.
//!
//! Each takes the experiment's lock for as long as it touches the state (a
//! watching `status` only while it polls), so two orchestrators never race.
//! SLURM is the source of truth for what runs; the state directory is the
//! source of truth for what was *asked*. The rule that keeps them from
//! disagreeing: an intent is written before `sbatch`, and an intent without a
//! job id is settled (adopted or abandoned) by asking SLURM for its unique job
//! name before anything else is submitted.

use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster::{merge_resources, ClusterConfig, ClusterError, ClustersFile};
use crate::precheck::Predictor;
use crate::render::{JobVars, RenderFailure, Renderer};
use crate::slurm::{self, Activity, RetryPolicy, SlurmState, WorkerOutcome};
use crate::state::{self, Attempt, ConfigRecord, StateDir, StateError, Submission};
use crate::sweep::{Sweep, SweepConfig};
use crate::transport::{self, CounterSnapshot, Poll, Transport, TransportError};

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    State(#[from] StateError),
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
        }
    }
}

/// Runs an async command to completion on a fresh runtime (for a sync `main`).
pub fn block_on<F: std::future::Future>(f: F) -> Result<F::Output, std::io::Error> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?.block_on(f))
}

/// Runs a blocking transport call off the async runtime's worker threads.
pub(crate) async fn blocking<T, F>(t: &Arc<dyn Transport>, f: F) -> Result<T, TransportError>
where
    T: Send + 'static,
    F: FnOnce(&dyn Transport) -> Result<T, TransportError> + Send + 'static,
{
    let t = Arc::clone(t);
    tokio::task::spawn_blocking(move || f(&*t))
        .await
        .map_err(|e| TransportError::Other(format!("transport call panicked or was cancelled: {e}")))?
}

/// 8 hex digits naming the experiment in job names.
pub fn experiment_hash(name: &str) -> String {
    hex::encode(&Sha256::digest(name.as_bytes())[..4])
}

/// What the state directory stores about the sweep (`sweep.json`).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct StoredSweep {
    pub cluster: String,
    pub sweep: Sweep,
}

/// The cluster a command talks to, and the connection.
pub struct Target {
    pub name: String,
    pub config: ClusterConfig,
    pub transport: Arc<dyn Transport>,
}

pub(crate) fn open_target(opts: &Options, name: &str) -> Result<Target, CommandError> {
    let (file, label) = ClustersFile::load_or_default(opts.clusters_file.as_deref())?;
    let (name, config) = file.get(name, &label)?;
    let transport = transport::open(&name, &config, &opts.state_root)?;
    Ok(Target { name, config, transport })
}

/// Verdict name and predicted GiB of each config.
fn verdicts(sweep: &Sweep) -> BTreeMap<String, (String, Option<f64>)> {
    // The runtime was checked when the file was loaded; a sweep stored by an
    // older version may name one no longer shipped.
    let p = sweep.predictor().unwrap_or_else(|e| {
        tracing::warn!("{e}; predicting with the pytorch calibration");
        Predictor::pytorch()
    });
    sweep
        .configs
        .iter()
        .map(|c| {
            let v = if c.is_valid() {
                p.verdict(&c.config, sweep.experiment.budget_gb)
            } else {
                crate::precheck::Verdict::Invalid { reasons: c.invalid.iter().map(|i| i.to_string()).collect() }
            };
            (c.hash.0.clone(), (v.name().to_string(), v.predicted_gib()))
        })
        .collect()
}

/// Which verdicts `submit` sends to the cluster.
fn allowed(verdict: &str, opts: &Options) -> bool {
    match verdict {
        "fits" => true,
        "risky" => opts.include_risky || opts.force,
        "oom" => opts.force,
        _ => false, // invalid: fails at once with a dimension error, never worth a job
    }
}

/// Opens the state, records the sweep and a record per config (new ones
/// created, verdicts refreshed). The cluster is fixed at the first submission.
fn prepare(st: &StateDir, sweep: &Sweep, cluster: &str) -> Result<BTreeMap<String, ConfigRecord>, CommandError> {
    if let Some(prev) = state::read_json::<StoredSweep>(&st.path("sweep.json"))? {
        if prev.cluster != cluster && !st.load_submissions()?.is_empty() {
            return Err(CommandError::Refused(format!(
                "experiment `{}` was submitted to cluster `{}`; it cannot continue on `{cluster}` \
                 (use --cluster {} or another experiment name)",
                st.experiment, prev.cluster, prev.cluster
            )));
        }
    }
    state::write_json(&st.path("sweep.json"), &StoredSweep { cluster: cluster.to_string(), sweep: sweep.clone() })?;
    let mut records = st.repair()?;
    let v = verdicts(sweep);
    let mut seen = BTreeSet::new();
    for c in &sweep.configs {
        if !seen.insert(c.hash.0.clone()) {
            tracing::warn!("config `{}` computes the same as an earlier one (hash {}): run once", c.name, c.hash);
            continue;
        }
        let (verdict, gib) = v.get(&c.hash.0).cloned().unwrap_or_default();
        let r = records.entry(c.hash.0.clone()).or_insert_with(|| ConfigRecord {
            hash: c.hash.0.clone(),
            name: c.name.clone(),
            verdict: None,
            predicted_gib: None,
            attempts: vec![],
            result: None,
        });
        let before = r.clone();
        r.name = c.name.clone();
        r.verdict = Some(verdict);
        r.predicted_gib = gib;
        if *r != before || !st.record_path(&r.hash).exists() {
            st.save_record(r)?;
        }
    }
    Ok(records)
}

/// The cluster name for a sweep: command line, then the experiment file, then `local`.
fn cluster_name(opts: &Options, sweep: &Sweep, st: Option<&StoredSweep>) -> String {
    opts.cluster
        .clone()
        .or_else(|| st.map(|s| s.cluster.clone()))
        .or_else(|| sweep.experiment.cluster.clone())
        .unwrap_or_else(|| "local".into())
}

/// Summary of a submit/resume.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SubmitReport {
    pub submitted: Vec<String>,
    pub arrays: Vec<String>,
    /// (config name, why not submitted).
    pub skipped: Vec<(String, String)>,
    /// Intents found unsettled and adopted from SLURM / abandoned.
    pub adopted: Vec<String>,
    pub abandoned: Vec<String>,
    /// Transport commands and file transfers this command used.
    pub counters: CounterSnapshot,
    pub wall_s: f64,
}

/// Everything one submission needs, rendered.
struct Prepared {
    sub: Submission,
    files: Vec<(String, Vec<u8>)>,
    script_local: PathBuf,
}

fn random_suffix() -> String {
    let mut h = Sha256::new();
    h.update(std::process::id().to_le_bytes());
    h.update(state::now().to_le_bytes());
    h.update(format!("{:?}", Instant::now()).as_bytes());
    hex::encode(&h.finalize()[..2])
}

/// Renders job arrays for `configs` (split below MaxArraySize); writes the
/// scripts and manifests under `dir_for(sid)`.
#[allow(clippy::too_many_arguments)]
fn prepare_arrays(
    sweep: &Sweep,
    configs: &[&SweepConfig],
    target: &Target,
    remote_state: &str,
    worker: &str,
    max_array: u32,
    first_seq: usize,
    renderer: &mut Renderer,
    dir_for: &dyn Fn(&str) -> PathBuf,
) -> Result<Vec<Prepared>, CommandError> {
    let exp = &sweep.experiment;
    let exph = experiment_hash(&exp.name);
    let resources = merge_resources(&exp.slurm, &target.config.defaults);
    let template = exp.template.clone().unwrap_or_else(|| "profile".into());
    let mut out = Vec::new();
    for (k, range) in slurm::chunks(configs.len(), max_array).into_iter().enumerate() {
        let chunk = &configs[range];
        let sid = format!("s{:03}-{}", first_seq + k, random_suffix());
        let job_name = format!("sw-{}-{exph}-{sid}", slurm::slug(&exp.name, 24));
        let hashes: Vec<String> = chunk.iter().map(|c| c.hash.0.clone()).collect();
        let mut comment = format!("sweep:exp={};exph={exph};sub={sid};configs={}", slurm::slug(&exp.name, 40), hashes.join(","));
        // SLURM keeps comments in accounting; keep them to a sane length (the manifest has all).
        if comment.len() > 1000 {
            comment.truncate(990);
            comment.push_str(",...");
        }
        let array = slurm::array_spec(chunk.len(), exp.array_parallelism);
        let sub_dir = format!("{remote_state}/{}/submissions/{sid}", exp.name);
        let vars = JobVars {
            experiment: exp.name.clone(),
            description: exp.description.clone(),
            submission: sid.clone(),
            job_name: job_name.clone(),
            comment: comment.clone(),
            array: array.clone(),
            tasks: chunk.len(),
            slurm: (&resources).into(),
            work_dir: remote_state.trim_end_matches("/state").to_string(),
            state_dir: remote_state.to_string(),
            submission_dir: sub_dir.clone(),
            log_dir: sub_dir.clone(),
            manifest: format!("{sub_dir}/manifest.json"),
            manifest_jsonl: format!("{sub_dir}/manifest.jsonl"),
            worker: worker.to_string(),
            worker_args: exp.worker.args(),
        };
        let script = renderer.render(&template, &vars)?;
        let manifest = spec::run::Manifest {
            experiment: exp.name.clone(),
            task_offset: 0,
            configs: chunk.iter().map(|c| c.config.clone()).collect(),
        };
        let manifest_json = serde_json::to_vec_pretty(&manifest).map_err(|e| CommandError::Refused(e.to_string()))?;
        let mut jsonl = Vec::new();
        for c in chunk {
            jsonl.extend(serde_json::to_vec(&c.config).map_err(|e| CommandError::Refused(e.to_string()))?);
            jsonl.push(b'\n');
        }
        let local_dir = dir_for(&sid);
        let files = vec![
            ("manifest.json".to_string(), manifest_json),
            ("manifest.jsonl".to_string(), jsonl),
            ("job.sbatch".to_string(), script.into_bytes()),
        ];
        for (name, data) in &files {
            state::write_atomic(&local_dir.join(name), data)?;
        }
        out.push(Prepared {
            sub: Submission {
                id: sid,
                job_name,
                comment,
                array,
                tasks: hashes,
                intended_at: 0.0,
                array_job_id: None,
                submitted_at: None,
                abandoned: false,
                remote_script: format!("{sub_dir}/job.sbatch"),
            },
            files: files.into_iter().map(|(n, d)| (format!("{sub_dir}/{n}"), d)).collect(),
            script_local: local_dir.join("job.sbatch"),
        });
    }
    Ok(out)
}

/// Test-only: dies by SIGKILL right after sbatch returned, before anything is
/// recorded, to prove `resume` settles the intent without a duplicate.
fn crash_hook() {
    if std::env::var_os("ORCHESTRATOR_TEST_KILL_AFTER_SBATCH").is_some() {
        // SAFETY: raising a signal on our own process.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}

/// Submits prepared arrays one by one: intent, upload, sbatch, record.
async fn send(
    st: &StateDir,
    target: &Target,
    records: &mut BTreeMap<String, ConfigRecord>,
    prepared: Vec<Prepared>,
    report: &mut SubmitReport,
) -> Result<(), CommandError> {
    let local = target.config.transport == crate::cluster::TransportKind::Local;
    for mut p in prepared {
        // 1. Files on the cluster (a fresh path per submission: nothing to clobber).
        if !local || !same_file(&p.script_local, &p.sub.remote_script) {
            for (path, data) in std::mem::take(&mut p.files) {
                blocking(&target.transport, move |t| t.put_file(&path, &data, false)).await?;
            }
        }
        // 2. The intent, durable before sbatch.
        p.sub.intended_at = state::now();
        st.save_submission(&p.sub)?;
        st.journal(serde_json::json!({"t": p.sub.intended_at, "op": "intent", "submission": p.sub.id, "job_name": p.sub.job_name, "configs": p.sub.tasks}))?;
        for (task, hash) in p.sub.tasks.iter().enumerate() {
            if let Some(r) = records.get_mut(hash) {
                r.attempts.push(Attempt {
                    submission: p.sub.id.clone(),
                    task_id: task as u32,
                    array_job_id: None,
                    job_id: None,
                    intended_at: p.sub.intended_at,
                    submitted_at: None,
                    state: None,
                    history: vec![],
                    abandoned: false,
                    worker: None,
                });
                st.save_record(r)?;
            }
        }
        // 3. sbatch.
        let script = p.sub.remote_script.clone();
        let result = blocking(&target.transport, move |t| t.submit(&script)).await;
        crash_hook();
        match result {
            Ok(job_id) => {
                record_job_id(st, records, &mut p.sub, &job_id)?;
                tracing::info!(submission = %p.sub.id, job = %job_id, "submitted {} configs", p.sub.tasks.len());
                report.arrays.push(job_id);
                report.submitted.extend(p.sub.tasks.iter().filter_map(|h| records.get(h).map(|r| r.name.clone())));
            }
            Err(e) => {
                st.journal(serde_json::json!({"t": state::now(), "op": "sbatch_error", "submission": p.sub.id, "error": e.to_string()}))?;
                // Did it reach SLURM anyway? Ask by name now; if unsure, resume will.
                let (adopted, abandoned) = reconcile(st, target, records).await.unwrap_or_default();
                report.adopted.extend(adopted);
                report.abandoned.extend(abandoned);
                return Err(e.into());
            }
        }
    }
    Ok(())
}

fn same_file(local: &Path, remote: &str) -> bool {
    std::path::absolute(local).map(|p| p == Path::new(remote)).unwrap_or(false)
}

fn record_job_id(
    st: &StateDir,
    records: &mut BTreeMap<String, ConfigRecord>,
    sub: &mut Submission,
    job_id: &str,
) -> Result<(), CommandError> {
    sub.array_job_id = Some(job_id.to_string());
    sub.submitted_at = Some(state::now());
    st.save_submission(sub)?;
    st.journal(serde_json::json!({"t": state::now(), "op": "submitted", "submission": sub.id, "job_id": job_id}))?;
    for (task, hash) in sub.tasks.iter().enumerate() {
        if let Some(r) = records.get_mut(hash) {
            if let Some(a) = r.attempts.iter_mut().find(|a| a.submission == sub.id && a.task_id == task as u32) {
                a.array_job_id = Some(job_id.to_string());
                a.submitted_at = sub.submitted_at;
            }
            st.save_record(r)?;
        }
    }
    Ok(())
}

/// Settles every intent without a job id: SLURM knows the job by its unique
/// name (adopt its id) or, when both squeue and sacct answered, does not
/// (abandon: it never ran, so its configs may be submitted again).
async fn reconcile(
    st: &StateDir,
    target: &Target,
    records: &mut BTreeMap<String, ConfigRecord>,
) -> Result<(Vec<String>, Vec<String>), CommandError> {
    let open: Vec<Submission> =
        st.load_submissions()?.into_iter().filter(|s| s.array_job_id.is_none() && !s.abandoned).collect();
    if open.is_empty() {
        return Ok((vec![], vec![]));
    }
    let names: Vec<String> = open.iter().map(|s| s.job_name.clone()).collect();
    let since = open.iter().map(|s| s.intended_at).fold(f64::INFINITY, f64::min);
    let poll = blocking(&target.transport, move |t| t.poll(&names, since)).await?;
    let (mut adopted, mut abandoned) = (vec![], vec![]);
    for mut s in open {
        let ids: BTreeSet<&String> =
            poll.tasks.values().filter(|o| o.name == s.job_name).map(|o| &o.array_job_id).collect();
        match ids.len() {
            0 if poll.complete() => {
                s.abandoned = true;
                st.save_submission(&s)?;
                st.journal(serde_json::json!({"t": state::now(), "op": "abandoned", "submission": s.id, "why": "SLURM has no job of that name"}))?;
                for (task, hash) in s.tasks.iter().enumerate() {
                    if let Some(r) = records.get_mut(hash) {
                        for a in r.attempts.iter_mut().filter(|a| a.submission == s.id && a.task_id == task as u32) {
                            a.abandoned = true;
                        }
                        st.save_record(r)?;
                    }
                }
                abandoned.push(s.id.clone());
            }
            0 => {
                return Err(CommandError::Refused(format!(
                    "cannot settle submission {} (job name {}): the cluster did not fully answer ({}); nothing was submitted",
                    s.id,
                    s.job_name,
                    poll.errors.join("; ")
                )))
            }
            1 => {
                let id = ids.into_iter().next().cloned().unwrap_or_default();
                st.journal(serde_json::json!({"t": state::now(), "op": "adopted", "submission": s.id, "job_id": id}))?;
                record_job_id(st, records, &mut s, &id)?;
                adopted.push(s.id.clone());
            }
            _ => {
                return Err(CommandError::Refused(format!(
                    "SLURM has {} jobs named {} ({:?}); refusing to guess which is ours",
                    ids.len(),
                    s.job_name,
                    ids
                )))
            }
        }
    }
    Ok((adopted, abandoned))
}

/// Why a config is not (re)submitted, or `None` when it should be.
fn blocker(r: &ConfigRecord, opts: &Options, resubmit_retryable: bool) -> Option<String> {
    let verdict = r.verdict.as_deref().unwrap_or("invalid");
    if !allowed(verdict, opts) {
        return Some(match verdict {
            "risky" => "risky (use --include-risky)".into(),
            "oom" => "predicted oom (use --force)".into(),
            v => v.to_string(),
        });
    }
    if r.live() {
        return Some("queued or running".into());
    }
    let tried: Vec<&Attempt> = r.attempts.iter().filter(|a| !a.abandoned).collect();
    let last = tried.last()?;
    let state = last.state.clone().unwrap_or(SlurmState::Pending);
    let worker = if r.attempts.iter().all(|a| a.worker.is_none()) {
        // Records written before attempts carried the worker's outcome keep it only here.
        legacy_outcome(r)
    } else {
        last.worker_outcome()
    };
    if let Some(why) = opts.retry.refusal(&state, worker) {
        return Some(why);
    }
    if !resubmit_retryable {
        return Some(format!("already submitted ({state}; `resume` retries)"));
    }
    if tried.len() as u32 >= opts.retry.max_attempts {
        return Some(format!("ended {state} after {} attempts", tried.len()));
    }
    None
}

/// The worker outcome a record's `result` gives when its attempts do not say.
fn legacy_outcome(r: &ConfigRecord) -> WorkerOutcome {
    match r.result_status().and_then(|s| serde_json::from_value(serde_json::Value::String(s.into())).ok()) {
        Some(status) => WorkerOutcome::Result(status),
        None => WorkerOutcome::NotStarted,
    }
}

/// Loads the stored sweep of an experiment by name.
pub fn stored_sweep(state_root: &Path, experiment: &str) -> Result<StoredSweep, CommandError> {
    state::read_json::<StoredSweep>(&state_root.join(experiment).join("sweep.json"))?.ok_or_else(|| {
        CommandError::Refused(format!(
            "no state for experiment `{experiment}` under {} (submit it first, or pass the experiment file)",
            state_root.display()
        ))
    })
}

/// `submit` (never-submitted configs only) and `resume` (also retryable ended ones).
pub async fn submit(sweep: &Sweep, opts: &Options, resume: bool) -> Result<SubmitReport, CommandError> {
    let t0 = Instant::now();
    let st = StateDir::open(&opts.state_root, &sweep.experiment.name, opts.lock_wait)?;
    let prev = state::read_json::<StoredSweep>(&st.path("sweep.json"))?;
    let cluster = cluster_name(opts, sweep, prev.as_ref());
    let target = open_target(opts, &cluster)?;
    let mut records = prepare(&st, sweep, &cluster)?;
    let before = target.transport.counters();
    let mut report = SubmitReport::default();

    // Settle what a crash left, then learn the current states, before deciding anything.
    let (adopted, abandoned) = reconcile(&st, &target, &mut records).await?;
    report.adopted = adopted;
    report.abandoned = abandoned;
    if resume {
        let _ = update(&st, &target, &mut records, sweep, true).await?;
    }

    let mut todo: Vec<&SweepConfig> = Vec::new();
    let mut seen = BTreeSet::new();
    for c in &sweep.configs {
        if !seen.insert(&c.hash.0) {
            continue;
        }
        let Some(r) = records.get(&c.hash.0) else { continue };
        match blocker(r, opts, resume) {
            None => todo.push(c),
            Some(why) => report.skipped.push((c.name.clone(), why)),
        }
    }
    if !todo.is_empty() {
        let max_array = blocking(&target.transport, |t| t.max_array_size()).await?;
        let remote_state = blocking(&target.transport, |t| t.remote_state_root()).await?;
        let worker = blocking(&target.transport, |t| t.worker_path()).await?;
        let mut renderer = Renderer::new(template_dirs(opts, sweep));
        let first = st.load_submissions()?.len() + 1;
        let prepared = prepare_arrays(
            sweep,
            &todo,
            &target,
            &remote_state,
            &worker,
            max_array,
            first,
            &mut renderer,
            &|sid| st.submission_dir(sid),
        )?;
        send(&st, &target, &mut records, prepared, &mut report).await?;
    }
    let after = target.transport.counters();
    report.counters = CounterSnapshot {
        commands: after.commands - before.commands,
        file_ops: after.file_ops - before.file_ops,
        connects: after.connects - before.connects,
    };
    report.wall_s = t0.elapsed().as_secs_f64();
    Ok(report)
}

fn template_dirs(opts: &Options, sweep: &Sweep) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    // Templates beside the experiment file first (`experiments/templates/`), then the given dirs.
    if let Some(parent) = sweep.source.parent() {
        dirs.push(parent.join("templates"));
    }
    dirs.extend(opts.template_dirs.iter().cloned());
    dirs
}

/// Applies one poll to the records; returns the configs whose state changed.
/// Tasks a complete poll does not list are timed in `missing.json` (see
/// [`Attempt::missing`]).
fn apply(st: &StateDir, records: &mut BTreeMap<String, ConfigRecord>, poll: &Poll) -> Result<Vec<String>, CommandError> {
    let mut changed = Vec::new();
    let now = state::now();
    let missing_path = st.path("missing.json");
    let mut missing: BTreeMap<String, f64> = state::read_json(&missing_path)?.unwrap_or_default();
    let missing_before = missing.clone();
    for r in records.values_mut() {
        let mut dirty = false;
        for a in r.attempts.iter_mut().filter(|a| !a.abandoned) {
            let Some(array) = &a.array_job_id else { continue };
            if let Some(o) = poll.tasks.get(&(array.clone(), a.task_id)) {
                missing.remove(&a.key());
                if a.observe(o.state.clone(), o.detail.clone(), o.job_id.clone()) {
                    dirty = true;
                }
            } else if poll.complete() && a.is_live() {
                let since = *missing.entry(a.key()).or_insert(now);
                if a.missing(since, now) {
                    missing.remove(&a.key());
                    dirty = true;
                }
            }
        }
        if dirty {
            st.save_record(r)?;
            changed.push(r.hash.clone());
        }
    }
    if missing != missing_before {
        state::write_json(&missing_path, &missing)?;
    }
    Ok(changed)
}

/// One poll (one squeue + one sacct for the whole sweep), applied; then the
/// worker's event files of configs that ran are pulled. `settle` (resume) also
/// re-reads the events of ended attempts whose worker result is not known yet,
/// since the retry decision depends on it.
async fn update(
    st: &StateDir,
    target: &Target,
    records: &mut BTreeMap<String, ConfigRecord>,
    sweep: &Sweep,
    settle: bool,
) -> Result<PollSummary, CommandError> {
    let subs = st.load_submissions()?;
    let names: Vec<String> = subs.iter().filter(|s| !s.abandoned).map(|s| s.job_name.clone()).collect();
    let since = subs.iter().map(|s| s.intended_at).fold(f64::INFINITY, f64::min);
    let since = if since.is_finite() { since } else { state::now() };
    let poll = blocking(&target.transport, move |t| t.poll(&names, since)).await?;
    let changed = apply(st, records, &poll)?;
    if pull_events(st, target, records, sweep, &changed, settle).await {
        if let Err(e) = write_measurements(st, records, sweep) {
            tracing::warn!("{e}");
        }
    }
    Ok(PollSummary { commands: poll.commands, errors: poll.errors, changed: changed.len() })
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct PollSummary {
    /// Scheduler commands the poll ran (2 for SLURM: squeue + sacct).
    pub commands: u32,
    pub errors: Vec<String>,
    pub changed: usize,
}

/// Copies `runs/<config>/events.jsonl` of configs that are running or just
/// changed (with `settle`, also of ended ones whose worker result is unknown),
/// and records what the worker wrote for the latest attempt: its outcome in
/// the attempt, its final `result` event in the record. Failures only warn:
/// the job states are what status must not lose. Returns whether a result changed.
async fn pull_events(
    st: &StateDir,
    target: &Target,
    records: &mut BTreeMap<String, ConfigRecord>,
    sweep: &Sweep,
    changed: &[String],
    settle: bool,
) -> bool {
    let Ok(remote_state) = blocking(&target.transport, |t| t.remote_state_root()).await else { return false };
    let names: BTreeMap<&str, &str> = sweep.configs.iter().map(|c| (c.hash.0.as_str(), c.name.as_str())).collect();
    let mut results_changed = false;
    for r in records.values_mut() {
        let Some(latest) = r.latest() else { continue };
        let activity = latest.state.as_ref().map(SlurmState::activity);
        let running = activity == Some(Activity::Running);
        let unsettled = settle
            && activity == Some(Activity::Ended)
            && latest.job_id.is_some()
            && !matches!(latest.worker_outcome(), WorkerOutcome::Result(_));
        if !(running || unsettled || changed.contains(&r.hash)) {
            continue;
        }
        let Some(name) = names.get(r.hash.as_str()) else { continue };
        if !state::valid_experiment_name(name) {
            continue; // not a safe path component: the worker cannot have written it either
        }
        let remote = format!("{remote_state}/{}/runs/{name}/events.jsonl", sweep.experiment.name);
        let local = st.path(&format!("runs/{name}/events.jsonl"));
        let data = match blocking(&target.transport, {
            let remote = remote.clone();
            move |t| t.get_file(&remote)
        })
        .await
        {
            Ok(Some(d)) => d,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!("cannot fetch {remote}: {e}");
                continue;
            }
        };
        if !same_file(&local, &remote) {
            if let Err(e) = state::write_atomic(&local, &data) {
                tracing::warn!("{e}");
            }
        }
        let job_id = latest.job_id.clone();
        let (started, result) = attempt_events(&String::from_utf8_lossy(&data), job_id.as_deref());
        let worker = match (&result, started) {
            (Some(v), _) => v.get("status").and_then(|s| s.as_str()).map(str::to_string),
            (None, true) => Some("started".to_string()),
            (None, false) => None,
        };
        let before = r.clone();
        if let Some(a) = r.attempts.iter_mut().rev().find(|a| !a.abandoned) {
            a.worker = worker;
        }
        results_changed |= r.result != result;
        r.result = result;
        if *r != before {
            if let Err(e) = st.save_record(r) {
                tracing::warn!("{e}");
            }
        }
    }
    results_changed
}

/// What an events file says about the attempt that ran as SLURM job `job_id`:
/// whether its worker wrote `start`, and its `result` event. The worker puts
/// `SLURM_JOB_ID` in its `start` line, so the lines of earlier attempts (a
/// retry appends to the same file) are told apart from this one's; a start
/// without a job id (a worker run by hand) counts as the latest attempt's.
/// A torn last line is skipped.
pub fn attempt_events(text: &str, job_id: Option<&str>) -> (bool, Option<serde_json::Value>) {
    let (mut started, mut result, mut mine) = (false, None, false);
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        match v.get("event").and_then(|e| e.as_str()) {
            Some("start") => {
                mine = match v.pointer("/env/slurm_job_id").and_then(|j| j.as_str()) {
                    Some(j) => Some(j) == job_id,
                    None => true,
                };
                if mine {
                    started = true;
                    result = None;
                }
            }
            Some("result") if mine => result = Some(v),
            _ => {}
        }
    }
    (started, result)
}

/// The `result` event of the last attempt in an events file, whichever job
/// ran it (a torn last line is skipped).
pub fn last_result(text: &str) -> Option<serde_json::Value> {
    let mut result = None;
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        match v.get("event").and_then(|e| e.as_str()) {
            Some("start") => result = None,
            Some("result") => result = Some(v),
            _ => {}
        }
    }
    result
}

/// Rewrites `measurements.jsonl`: every finished run of the sweep that measured
/// something (`ok`, over budget, `oom`) as a measurement record in the shared
/// format (framework `burn-<backend>`), so `orchestrator calibrate --records
/// state/<experiment>/measurements.jsonl` learns from the sweep.
fn write_measurements(st: &StateDir, records: &BTreeMap<String, ConfigRecord>, sweep: &Sweep) -> Result<usize, StateError> {
    let mut out = Vec::new();
    let mut n = 0;
    let mut seen = BTreeSet::new();
    for c in &sweep.configs {
        if !seen.insert(&c.hash.0) || !state::valid_experiment_name(&c.name) {
            continue;
        }
        if records.get(&c.hash.0).and_then(|r| r.result.as_ref()).is_none() {
            continue;
        }
        let Ok(bytes) = std::fs::read(st.path(&format!("runs/{}/events.jsonl", c.name))) else { continue };
        let Some(rec) = crate::collect::to_record(&c.config, &crate::collect::parse_events(&bytes)) else { continue };
        if let Ok(line) = serde_json::to_vec(&rec) {
            out.extend(line);
            out.push(b'\n');
            n += 1;
        }
    }
    state::write_atomic(&st.path("measurements.jsonl"), &out)?;
    Ok(n)
}

/// One line of `status`.
#[derive(Debug, Clone, Serialize)]
pub struct StatusRow {
    pub name: String,
    pub hash: String,
    pub verdict: String,
    pub predicted_gib: Option<f64>,
    /// SLURM state of the latest attempt (`-` never submitted, `SUBMITTING` unsettled intent).
    pub state: String,
    pub job: Option<String>,
    pub attempts: usize,
    pub result: Option<String>,
    pub peak_gib: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct StatusReport {
    pub rows: Vec<StatusRow>,
    pub poll: PollSummary,
    /// Whether no config is queued, running or being submitted.
    pub settled: bool,
}

impl StatusReport {
    pub fn count(&self, state: &str) -> usize {
        self.rows.iter().filter(|r| r.state == state).count()
    }

    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<28} {:<12} {:<8} {:>8} {:<14} {:<12} {:>3} {:<10}\n",
            "config", "hash", "verdict", "predicted", "state", "job", "try", "result"
        );
        for r in &self.rows {
            s += &format!(
                "{:<28} {:<12} {:<8} {:>8} {:<14} {:<12} {:>3} {:<10}\n",
                r.name,
                r.hash,
                r.verdict,
                r.predicted_gib.map(crate::precheck::memory).unwrap_or_else(|| "-".into()),
                r.state,
                r.job.clone().unwrap_or_else(|| "-".into()),
                r.attempts,
                match (&r.result, r.peak_gib) {
                    (Some(st), Some(p)) => format!("{st} {}", crate::precheck::memory(p)),
                    (Some(st), None) => st.clone(),
                    _ => "-".into(),
                }
            );
        }
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &self.rows {
            *counts.entry(r.state.as_str()).or_default() += 1;
        }
        s += &format!(
            "{} configs: {}; {} SLURM commands this poll{}\n",
            self.rows.len(),
            counts.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join(", "),
            self.poll.commands,
            if self.poll.errors.is_empty() { String::new() } else { format!(" (warnings: {})", self.poll.errors.join("; ")) }
        );
        s
    }
}

fn rows(sweep: &Sweep, records: &BTreeMap<String, ConfigRecord>) -> Vec<StatusRow> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for c in &sweep.configs {
        if !seen.insert(&c.hash.0) {
            continue;
        }
        let Some(r) = records.get(&c.hash.0) else { continue };
        let latest = r.latest();
        let state = match latest {
            None => "-".to_string(),
            Some(a) if a.array_job_id.is_none() => "SUBMITTING".into(),
            Some(a) => a.state.as_ref().map(|s| s.to_string()).unwrap_or_else(|| "SUBMITTED".into()),
        };
        let job = latest.and_then(|a| a.array_job_id.as_ref().map(|j| format!("{j}_{}", a.task_id)));
        let peak = r.result.as_ref().and_then(|v| v.get("peak_bytes")).and_then(|b| b.as_f64()).map(|b| b / (1u64 << 30) as f64);
        out.push(StatusRow {
            name: r.name.clone(),
            hash: r.hash.clone(),
            verdict: r.verdict.clone().unwrap_or_default(),
            predicted_gib: r.predicted_gib,
            state,
            job,
            attempts: r.attempts.iter().filter(|a| !a.abandoned).count(),
            result: r.result_status().map(str::to_string),
            peak_gib: peak,
        });
    }
    out
}

/// `--watch` pacing: polls every `min`, stretching ×1.5 up to `max` while nothing changes.
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    pub min: Duration,
    pub max: Duration,
    /// Stop after this many polls (tests); `None` = until settled or Ctrl-C.
    pub max_polls: Option<u32>,
}

impl Default for Watch {
    fn default() -> Self {
        Watch { min: Duration::from_secs(5), max: Duration::from_secs(60), max_polls: None }
    }
}

/// `status`: one poll (or, with `watch`, polls until every config settled),
/// printing the table after each through `print`.
pub async fn status(
    experiment: &str,
    opts: &Options,
    watch: Option<Watch>,
    print: &mut (dyn FnMut(&StatusReport) + Send),
) -> Result<StatusReport, CommandError> {
    let stored = stored_sweep(&opts.state_root, experiment)?;
    let target = open_target(opts, &opts.cluster.clone().unwrap_or(stored.cluster.clone()))?;
    let mut interval = watch.map(|w| w.min).unwrap_or_default();
    let mut polls = 0u32;
    loop {
        polls += 1;
        // The lock only while touching the state: cancel/resume may run between polls.
        let result: Result<StatusReport, CommandError> = async {
            let st = StateDir::open(&opts.state_root, experiment, opts.lock_wait)?;
            let mut records = st.repair()?;
            reconcile(&st, &target, &mut records).await?;
            let poll = update(&st, &target, &mut records, &stored.sweep, false).await?;
            let rows = rows(&stored.sweep, &records);
            let settled = !records.values().any(ConfigRecord::live);
            Ok(StatusReport { rows, poll, settled })
        }
        .await;
        let Some(w) = watch else { return result };
        match &result {
            Ok(rep) => {
                print(rep);
                if rep.settled || w.max_polls.is_some_and(|m| polls >= m) {
                    return result;
                }
                interval = if rep.poll.changed > 0 { w.min } else { (interval.mul_f64(1.5)).min(w.max) };
            }
            Err(CommandError::Transport(e)) => {
                // The connection or the controller is down: keep watching, more slowly.
                tracing::warn!("poll failed, retrying in {:?}: {e}", interval);
                eprintln!("status: poll failed ({e}); retrying");
                if w.max_polls.is_some_and(|m| polls >= m) {
                    return result;
                }
                interval = (interval.mul_f64(1.5)).min(w.max);
            }
            Err(_) => return result,
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => return result,
        }
    }
}

/// `cancel`: scancel every array of the experiment that still has live tasks.
pub async fn cancel(experiment: &str, opts: &Options) -> Result<Vec<String>, CommandError> {
    let stored = stored_sweep(&opts.state_root, experiment)?;
    let target = open_target(opts, &opts.cluster.clone().unwrap_or(stored.cluster.clone()))?;
    let st = StateDir::open(&opts.state_root, experiment, opts.lock_wait)?;
    let mut records = st.repair()?;
    reconcile(&st, &target, &mut records).await?;
    let ids: BTreeSet<String> = records
        .values()
        .flat_map(|r| r.attempts.iter())
        .filter(|a| a.is_live())
        .filter_map(|a| a.array_job_id.clone())
        .collect();
    let ids: Vec<String> = ids.into_iter().collect();
    st.journal(serde_json::json!({"t": state::now(), "op": "cancel", "jobs": ids}))?;
    let send = ids.clone();
    blocking(&target.transport, move |t| t.cancel(&send)).await?;
    Ok(ids)
}

/// `render`: the scripts `submit` would send now, written under
/// `state/<experiment>/render/` and returned; nothing is submitted and the
/// state's records are left alone.
pub async fn render(sweep: &Sweep, opts: &Options) -> Result<Vec<(PathBuf, String)>, CommandError> {
    if !state::valid_experiment_name(&sweep.experiment.name) {
        return Err(StateError::BadName(sweep.experiment.name.clone()).into());
    }
    let prev = state::read_json::<StoredSweep>(&opts.state_root.join(&sweep.experiment.name).join("sweep.json"))?;
    let cluster = cluster_name(opts, sweep, prev.as_ref());
    let (file, label) = ClustersFile::load_or_default(opts.clusters_file.as_deref())?;
    let (name, config) = file.get(&cluster, &label)?;
    // Rendering needs no connection: the work dir is taken as written.
    let remote_state = match (&config.work_dir, config.transport) {
        (Some(w), _) => format!("{}/state", w.trim_end_matches('/')),
        (None, _) => std::path::absolute(&opts.state_root).map(|p| p.display().to_string()).unwrap_or_default(),
    };
    let worker = config.worker.clone().unwrap_or_else(|| match &config.work_dir {
        Some(w) => format!("{}/bin/worker", w.trim_end_matches('/')),
        None => "worker".into(),
    });
    let target = Target { name, transport: transport::open(&cluster, &ClusterConfig::local(), &opts.state_root)?, config };
    let v = verdicts(sweep);
    let mut seen = BTreeSet::new();
    let todo: Vec<&SweepConfig> = sweep
        .configs
        .iter()
        .filter(|c| seen.insert(&c.hash.0))
        .filter(|c| v.get(&c.hash.0).is_some_and(|(verdict, _)| allowed(verdict, opts)))
        .collect();
    let mut renderer = Renderer::new(template_dirs(opts, sweep));
    let dir = opts.state_root.join(&sweep.experiment.name).join("render");
    let prepared = prepare_arrays(sweep, &todo, &target, &remote_state, &worker, 1001, 1, &mut renderer, &|sid| dir.join(sid))?;
    Ok(prepared
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p.script_local).unwrap_or_default();
            (p.script_local, text)
        })
        .collect())
}

/// The command line of the cluster commands (wired into `main` by one flattened variant).
pub mod cli;

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(verdict: &str, attempts: Vec<Attempt>, result: Option<&str>) -> ConfigRecord {
        ConfigRecord {
            hash: "h".into(),
            name: "n".into(),
            verdict: Some(verdict.into()),
            predicted_gib: None,
            attempts,
            result: result.map(|s| serde_json::json!({"event": "result", "status": s})),
        }
    }

    fn ended(state: SlurmState) -> Attempt {
        Attempt {
            submission: "s".into(),
            task_id: 0,
            array_job_id: Some("1".into()),
            job_id: None,
            intended_at: 0.0,
            submitted_at: None,
            state: Some(state),
            history: vec![],
            abandoned: false,
            worker: None,
        }
    }

    #[test]
    fn resume_never_resubmits_live_completed_or_measured_oom() {
        let o = Options::default();
        assert_eq!(blocker(&rec("fits", vec![], None), &o, true), None, "never submitted");
        assert!(blocker(&rec("fits", vec![ended(SlurmState::Running)], None), &o, true).is_some());
        assert!(blocker(&rec("fits", vec![ended(SlurmState::Pending)], None), &o, true).is_some());
        assert!(blocker(&rec("fits", vec![ended(SlurmState::Completed)], None), &o, true).is_some());
        assert!(blocker(&rec("fits", vec![ended(SlurmState::NodeFail)], Some("oom")), &o, true).is_some());
        let mut intent = ended(SlurmState::Pending);
        intent.state = None;
        intent.array_job_id = None;
        assert!(blocker(&rec("fits", vec![intent], None), &o, true).is_some(), "unsettled intent");
        assert_eq!(blocker(&rec("fits", vec![ended(SlurmState::NodeFail)], None), &o, true), None);
        assert_eq!(blocker(&rec("fits", vec![ended(SlurmState::Cancelled)], None), &o, true), None);
        assert!(blocker(&rec("fits", vec![ended(SlurmState::Cancelled)], None), &o, false).is_some(), "submit does not retry");
        let three = vec![ended(SlurmState::NodeFail), ended(SlurmState::NodeFail), ended(SlurmState::NodeFail)];
        assert!(blocker(&rec("fits", three, None), &o, true).is_some(), "max attempts");
    }

    #[test]
    fn verdict_gates() {
        let o = Options::default();
        assert!(blocker(&rec("invalid", vec![], None), &Options { force: true, ..o.clone() }, true).is_some());
        assert!(blocker(&rec("oom", vec![], None), &o, true).is_some());
        assert_eq!(blocker(&rec("oom", vec![], None), &Options { force: true, ..o.clone() }, true), None);
        assert!(blocker(&rec("risky", vec![], None), &o, true).is_some());
        assert_eq!(blocker(&rec("risky", vec![], None), &Options { include_risky: true, ..o }, true), None);
    }

    fn with_worker(mut a: Attempt, worker: &str) -> Attempt {
        a.worker = Some(worker.into());
        a
    }

    #[test]
    fn resume_retries_a_killed_worker_but_not_a_measured_oom_or_a_real_error() {
        let o = Options::default();
        let failed = || ended(SlurmState::Failed);
        // Exit 3 makes SLURM say FAILED; the worker's `oom` result wins.
        let oom = rec("fits", vec![with_worker(failed(), "oom")], Some("oom"));
        assert_eq!(blocker(&oom, &o, true).as_deref(), Some("measured oom"));
        // Started, no result, FAILED (SIGKILL) or OUT_OF_MEMORY (host OOM killer): retried.
        assert_eq!(blocker(&rec("fits", vec![with_worker(failed(), "started")], None), &o, true), None);
        let host_oom = with_worker(ended(SlurmState::OutOfMemory), "started");
        assert_eq!(blocker(&rec("fits", vec![host_oom], None), &o, true), None);
        // A real error: only with --retry-failed.
        let err = rec("fits", vec![with_worker(failed(), "failed")], Some("failed"));
        assert!(blocker(&err, &o, true).is_some_and(|w| w.contains("--retry-failed")));
        let retry_failed = Options { retry: RetryPolicy { failed: true, ..o.retry }, ..o.clone() };
        assert_eq!(blocker(&err, &retry_failed, true), None);
        // The latest attempt decides: a first attempt's failure does not stick to a killed retry.
        let r = rec("fits", vec![with_worker(failed(), "failed"), with_worker(failed(), "started")], None);
        assert_eq!(blocker(&r, &o, true), None);
        // The job script failed before the worker started (missing binary): a real error.
        assert!(blocker(&rec("fits", vec![failed()], None), &o, true).is_some());
    }

    #[test]
    fn events_are_matched_to_the_attempt_by_slurm_job_id() {
        let text = concat!(
            "{\"event\":\"start\",\"env\":{\"slurm_job_id\":\"11\"}}\n",
            "{\"event\":\"result\",\"status\":\"failed\"}\n",
            "{\"event\":\"start\",\"env\":{\"slurm_job_id\":\"12\"}}\n",
            "{\"event\":\"heartbeat\"}\n",
            "{\"event\":\"resu"
        );
        let (started, result) = attempt_events(text, Some("11"));
        assert!(started);
        assert_eq!(result.and_then(|v| v["status"].as_str().map(str::to_string)).as_deref(), Some("failed"));
        assert_eq!(attempt_events(text, Some("12")), (true, None), "killed: started, no result");
        assert_eq!(attempt_events(text, Some("13")), (false, None), "never started");
        assert_eq!(attempt_events(text, None), (false, None));
        let by_hand = "{\"event\":\"start\",\"env\":{}}\n{\"event\":\"result\",\"status\":\"ok\"}\n";
        assert!(attempt_events(by_hand, Some("5")).1.is_some(), "a start without a job id is the latest attempt's");
    }

    #[test]
    fn last_result_takes_the_last_attempt() {
        let text = "{\"event\":\"start\"}\n{\"event\":\"result\",\"status\":\"oom\"}\n{\"event\":\"start\"}\n{\"event\":\"resu";
        assert_eq!(last_result(text), None, "retried run has no result yet; torn line skipped");
        let text = "{\"event\":\"start\"}\n{\"event\":\"result\",\"status\":\"ok\",\"peak_bytes\":5}\n";
        assert_eq!(last_result(text).and_then(|v| v["status"].as_str().map(str::to_string)).as_deref(), Some("ok"));
    }
}
