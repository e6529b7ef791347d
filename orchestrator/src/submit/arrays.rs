//! Rendering job arrays: one sbatch script and manifest per array, split below
//! `MaxArraySize`, written under the submission's directory. For `submit`
//! (its third stage, [`render_arrays`]) the cluster names the paths and the worker
//! the scripts run is asked whether it starts there; `render` and `warm`
//! use the same pieces without a connection.

use facts::run::ConfigHash;
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::time::Instant;

use super::judge::Site;
use super::probe::{check_worker, Need};
use super::{blocking, experiment_hash, CommandError, Options, Target};
use crate::cluster::{merge_resources, ClusterConfig, TransportKind};
use crate::experiment::{Experiment, SlurmResources, WorkerBackend, WorkerOptions};
use crate::fsio;
use crate::render::command::{command_vars, Where};
use crate::render::{JobVars, Renderer};
use crate::slurm;
use crate::state::{ArrayJob, Submission};
use crate::sweep::{Sweep, SweepConfig};

/// Everything one submission needs, rendered.
pub(crate) struct Prepared {
    pub sub: Submission,
    pub files: Vec<(String, Vec<u8>)>,
    pub script_local: PathBuf,
}

pub(crate) fn random_suffix() -> String {
    let mut h = Sha256::new();
    h.update(std::process::id().to_le_bytes());
    h.update(fsio::now().to_le_bytes());
    h.update(format!("{:?}", Instant::now()).as_bytes());
    hex::encode(&h.finalize()[..2])
}

/// Keeps the local copy of file `name` of submission `sid` (the state's
/// submission directory for `submit`, `render/` for `render`) and says where.
pub(crate) type Keep<'a> = dyn Fn(&str, &str, &[u8]) -> Result<PathBuf, CommandError> + 'a;

/// Where job arrays go on the cluster and how they are numbered.
pub(crate) struct Placement<'a> {
    /// The cluster's state root (`<work_dir>/state`).
    pub remote_state: &'a str,
    /// The worker binary's path there.
    pub worker: &'a str,
    /// Array task ids stay below this (`MaxArraySize`).
    pub max_array: u32,
    /// The sequence number of the first new submission.
    pub first_seq: usize,
    /// What each job asks SLURM for: the experiment's `slurm:` over the
    /// cluster's `defaults:` ([`merge_resources`]).
    pub resources: &'a SlurmResources,
}

/// `submit`'s third stage: the arrays that run `todo`, rendered where the
/// cluster says (its `MaxArraySize`, state root and worker), numbered after
/// the submissions there are, each file kept in its submission's directory
/// of the state; then the worker they run is checked ([`check_worker_of`]).
pub(crate) async fn render_arrays(
    todo: &[&SweepConfig],
    sweep: &Sweep,
    site: &Site,
) -> Result<Vec<Prepared>, CommandError> {
    let t = &site.target.transport;
    let max_array = blocking(t, |t| t.max_array_size()).await?;
    let remote_state = blocking(t, |t| t.files().remote_state_root()).await?;
    let worker = blocking(t, |t| t.files().worker_path()).await?;
    let mut renderer = Renderer::new(template_dirs(&site.opts, sweep));
    let first_seq = site.st.load_submissions()?.len() + 1;
    let resources = merge_resources(&sweep.experiment.slurm, &site.target.config.defaults);
    let place = Placement { remote_state: &remote_state, worker: &worker, max_array, first_seq, resources: &resources };
    let st = &site.st;
    let prepared = prepare_arrays(sweep, todo, &site.target, &place, &mut renderer, &|sid, name, data| {
        Ok(st.keep_sent(sid, name, data)?)
    })?;
    check_worker_of(&prepared, &sweep.experiment, &resources, &worker, site).await?;
    Ok(prepared)
}

/// Checks the worker that the prepared job scripts run (a user's own
/// template that runs none needs none); on refusal the rendered files go too
/// (nothing was recorded).
async fn check_worker_of(
    prepared: &[Prepared],
    exp: &Experiment,
    resources: &SlurmResources,
    worker: &str,
    site: &Site,
) -> Result<(), CommandError> {
    let contains = |bytes: &[u8]| bytes.windows(worker.len()).any(|w| w == worker.as_bytes());
    if !prepared.iter().any(|p| p.files.iter().any(|(_, bytes)| contains(bytes))) {
        return Ok(());
    }
    let need = Need::of(experiment_backend(exp), "the experiment asks for", resources);
    let checked = check_worker(&site.target, worker, &need).await;
    if checked.is_err() {
        for p in prepared {
            site.st.forget_unsent(&p.sub.id);
        }
    }
    checked
}

/// Where templates are looked for: beside the experiment file
/// (`experiments/templates/`) first, then the given dirs.
pub(crate) fn template_dirs(opts: &Options, sweep: &Sweep) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(parent) = sweep.source.parent() {
        dirs.push(parent.join("templates"));
    }
    dirs.extend(opts.template_dirs.iter().cloned());
    dirs
}

/// Renders job arrays for `configs` (split below MaxArraySize), each task
/// running the experiment's `configs_per_task` of them in turn; writes the
/// scripts and manifests with `keep(sid, name, bytes)`, which says where it kept each.
pub(crate) fn prepare_arrays(
    sweep: &Sweep,
    configs: &[&SweepConfig],
    target: &Target,
    place: &Placement,
    renderer: &mut Renderer,
    keep: &Keep,
) -> Result<Vec<Prepared>, CommandError> {
    let exp = &sweep.experiment;
    let k = exp.worker.configs_per_task.max(1);
    let default_template = if exp.command.is_some() { "command" } else { "profile" };
    let template = exp.template.clone().unwrap_or_else(|| default_template.into());
    let tasks = configs.len().div_ceil(k as usize);
    let mut out = Vec::new();
    for (n, range) in slurm::chunks(tasks, place.max_array).into_iter().enumerate() {
        let (first, last) = (range.start * k as usize, (range.end * k as usize).min(configs.len()));
        let chunk = &configs[first..last];
        let sid = format!("s{:03}-{}", place.first_seq + n, random_suffix());
        let job = array_job(exp, &sid, chunk, k);
        let sub_dir = format!("{}/{}/submissions/{sid}", place.remote_state, exp.name);
        let vars = JobVars {
            experiment: exp.name.clone(),
            description: exp.description.clone(),
            submission: sid.clone(),
            job_name: job.job_name.clone(),
            comment: job.comment.clone(),
            array: job.array.clone(),
            tasks: range.len(),
            configs_per_task: k,
            slurm: place.resources.into(),
            work_dir: work_dir_of(&target.config, place.remote_state),
            state_dir: place.remote_state.to_string(),
            submission_dir: sub_dir.clone(),
            log_dir: sub_dir.clone(),
            manifest: format!("{sub_dir}/manifest.json"),
            manifest_jsonl: format!("{sub_dir}/manifest.jsonl"),
            worker: place.worker.to_string(),
            worker_args: worker_args(exp),
            setup: (&target.config.setup).into(),
            command: match &exp.command {
                Some(c) => {
                    let at = Where { state_dir: place.remote_state, worker: place.worker };
                    Some(command_vars(c, &chunk.iter().map(|s| &s.config).collect::<Vec<_>>(), &at)?)
                }
                None => None,
            },
        };
        let script = renderer.render(&template, &vars)?;
        let (manifest_json, jsonl) = manifests(&exp.name, chunk, k, exp.worker.memory_limit)?;
        let files = vec![
            ("manifest.json".to_string(), manifest_json),
            ("manifest.jsonl".to_string(), jsonl),
            ("job.sbatch".to_string(), script.into_bytes()),
        ];
        let mut script_local = PathBuf::new();
        for (name, data) in &files {
            let kept = keep(&sid, name, data)?;
            if name == "job.sbatch" {
                script_local = kept;
            }
        }
        out.push(Prepared {
            sub: Submission::new(sid, job, format!("{sub_dir}/job.sbatch")),
            files: files.into_iter().map(|(n, d)| (format!("{sub_dir}/{n}"), d)).collect(),
            script_local,
        });
    }
    Ok(out)
}

/// The backend the experiment's worker runs: its `worker.backend`, else the
/// one its `runtime:` predicts for (`burn-vulkan`: `vulkan`); `None` for a
/// `pytorch` runtime without `worker.backend` (the worker picks its first
/// GPU backend, else `flex`).
pub(crate) fn experiment_backend(exp: &Experiment) -> Option<WorkerBackend> {
    exp.worker.backend.or_else(|| {
        let name = exp.runtime.as_str().strip_prefix("burn-")?;
        serde_json::from_value(serde_json::Value::String(name.to_string())).ok()
    })
}

/// `worker run`'s arguments from the experiment: `--backend` (its
/// [`experiment_backend`]), the rest of its `worker:` block, and `--protocol`
/// where the sweep follows one of the group's scripts (its `report_layout`).
pub(crate) fn worker_args(exp: &Experiment) -> Vec<String> {
    let mut args = WorkerOptions { backend: experiment_backend(exp), ..exp.worker.clone() }.args();
    let protocol = exp.report_layout.protocol();
    if protocol != facts::protocol::Protocol::Project {
        args.extend(["--protocol".to_string(), protocol.name().to_string()]);
    }
    args
}

/// The job array of submission `sid`: its unique name, its comment, and
/// `--array` over the tasks that run `chunk`, `k` configs each.
fn array_job(exp: &Experiment, sid: &str, chunk: &[&SweepConfig], k: u32) -> ArrayJob {
    let exph = experiment_hash(&exp.name);
    let configs: Vec<ConfigHash> = chunk.iter().map(|c| c.hash.clone()).collect();
    ArrayJob {
        job_name: format!("sw-{}-{exph}-{sid}", slurm::slug(&exp.name, 24)),
        comment: job_comment(&exp.name, &exph, sid, &configs),
        array: slurm::array_spec(chunk.len().div_ceil(k as usize), exp.array_parallelism),
        configs,
        configs_per_task: k,
    }
}

/// The job's comment, which SLURM keeps in accounting: the experiment, the
/// submission and its configs' hashes (cut to a sane length; the manifest has all).
fn job_comment(experiment: &str, exph: &str, sid: &str, hashes: &[ConfigHash]) -> String {
    let mut comment = format!(
        "sweep:exp={};exph={exph};sub={sid};configs={}",
        slurm::slug(experiment, 40),
        hashes.iter().map(ConfigHash::as_str).collect::<Vec<_>>().join(",")
    );
    if comment.len() > 1000 {
        comment.truncate(990);
        comment.push_str(",...");
    }
    comment
}

/// The cluster's `work_dir`, from its remote state root (`<work_dir>/state`),
/// where node kernel caches (`cache/<host>`) and warm-up jobs (`warm/<id>`)
/// go. The built-in `local` cluster without a `work_dir` keeps them inside
/// its state directory (`<state>/.local-cluster`): nothing lands beside it,
/// in whatever directory the orchestrator was started from.
pub(crate) fn work_dir_of(config: &ClusterConfig, remote_state: &str) -> String {
    if config.transport == TransportKind::Local && config.work_dir.is_none() {
        return format!("{}/.local-cluster", remote_state.trim_end_matches('/'));
    }
    remote_state.trim_end_matches("/state").to_string()
}

/// `manifest.json` (the configs as one document, `k` a task) and
/// `manifest.jsonl` (one config a line: config N on line N+1; task T runs
/// lines T*k+1 to T*k+k).
fn manifests(
    experiment: &str,
    chunk: &[&SweepConfig],
    k: u32,
    memory_limit: Option<u64>,
) -> Result<(Vec<u8>, Vec<u8>), CommandError> {
    let refused = |e: serde_json::Error| CommandError::Refused(e.to_string());
    let manifest = facts::run::Manifest {
        experiment: experiment.to_string(),
        task_offset: 0,
        configs_per_task: k,
        memory_limit,
        configs: chunk.iter().map(|c| c.config.clone()).collect(),
    };
    let json = serde_json::to_vec_pretty(&manifest).map_err(refused)?;
    let mut jsonl = Vec::new();
    for c in chunk {
        jsonl.extend(serde_json::to_vec(&c.config).map_err(refused)?);
        jsonl.push(b'\n');
    }
    Ok((json, jsonl))
}
