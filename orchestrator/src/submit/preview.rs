//! `render`: the sbatch scripts `submit` would send now, rendered as it
//! would render them and written under `state/<experiment>/render/`, with
//! the configs it would not send and why; nothing is submitted.

use std::path::PathBuf;

use super::arrays::{prepare_arrays, template_dirs, Placement};
use super::decide::would_send;
use super::judge::where_it_runs;
use super::{CommandError, Options, Target};
use crate::cluster::{merge_resources, ClusterConfig, ClustersFile, TransportKind};
use crate::fsio;
use crate::render::Renderer;
use crate::state;
use crate::sweep::Sweep;
use crate::transport;

/// What `render` made: the scripts (where each was written, its text), the
/// configs `submit` would not send now (name, why), and the time limit a
/// task is expected to need, against the one they set.
pub struct Rendered {
    pub scripts: Vec<(PathBuf, String)>,
    pub skipped: Vec<(String, String)>,
    /// Absent for a `command:` sweep (the profiling worker's timings say nothing of it).
    pub time: Option<crate::walltime::Suggestion>,
}

/// `render`: the scripts `submit` would send now (the configs it would
/// submit, as it would run them), written under
/// `state/<experiment>/render/` and returned; nothing is submitted and the
/// state's records are left alone.
pub async fn render(sweep: &Sweep, opts: &Options) -> Result<Rendered, CommandError> {
    let view = state::View::new(&opts.state_root, &sweep.experiment.name)?;
    let prev = view.pinned_sweep()?;
    let (judged, choice) = where_it_runs(sweep, opts.cluster.as_deref(), prev.as_ref(), opts.clusters_file.as_deref())?;
    let sweep = &judged;
    let cluster = choice.name;
    let (file, label) = ClustersFile::load_or_default(opts.clusters_file.as_deref())?;
    let (name, config) = file.get(&cluster, &label)?;
    let (remote_state, worker) = render_paths(&cluster, &config, opts)?;
    let target =
        Target { name, transport: transport::open(&cluster, &ClusterConfig::local(), &opts.state_root)?, config };
    let (todo, skipped) = would_send(sweep, opts)?;
    let mut renderer = Renderer::new(template_dirs(opts, sweep));
    let dir = view.render_dir();
    let resources = merge_resources(&sweep.experiment.slurm, &target.config.defaults);
    let place = Placement {
        remote_state: &remote_state,
        worker: &worker,
        max_array: 1001,
        first_seq: 1,
        resources: &resources,
    };
    let prepared = prepare_arrays(sweep, &todo, &target, &place, &mut renderer, &|sid, name, data| {
        let path = dir.join(sid).join(name);
        fsio::write_replace(&path, data)?;
        Ok(path)
    })?;
    let time = resources.time;
    let scripts = prepared
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p.script_local).map_err(fsio::io(&p.script_local))?;
            Ok((p.script_local, text))
        })
        .collect::<Result<_, CommandError>>()?;
    Ok(Rendered {
        scripts,
        skipped,
        time: sweep
            .experiment
            .command
            .is_none()
            .then(|| crate::walltime::for_sweep(sweep, &view.every_events_file(), time.as_deref())),
    })
}

/// The cluster's state root and worker as `submit` would name them. Rendering
/// needs no connection: a remote work dir is taken as written; the built-in
/// `local` cluster answers as it does for `submit` (the worker beside this
/// binary, else on PATH).
fn render_paths(cluster: &str, config: &ClusterConfig, opts: &Options) -> Result<(String, String), CommandError> {
    if config.transport == TransportKind::Local {
        let local = transport::open(cluster, config, &opts.state_root)?;
        return Ok((local.files().remote_state_root()?, local.files().worker_path()?));
    }
    let remote_state = match &config.work_dir {
        Some(w) => format!("{}/state", w.trim_end_matches('/')),
        None => std::path::absolute(&opts.state_root).map_err(fsio::io(&opts.state_root))?.display().to_string(),
    };
    let worker = config.worker.clone().unwrap_or_else(|| match &config.work_dir {
        Some(w) => format!("{}/bin/worker", w.trim_end_matches('/')),
        None => "worker".into(),
    });
    Ok((remote_state, worker))
}

/// `resume --all`, before it sends: the configs an active sweep answered by a
/// settled prediction that it submits now, as `submit` would choose them
/// (one already run, or held back by its verdict without the flag that sends
/// it, is not among them).
pub fn predictions_it_runs(sweep: &Sweep, opts: &Options) -> Result<Vec<String>, CommandError> {
    let view = state::View::new(&opts.state_root, &sweep.experiment.name)?;
    let Some(active) = view.active()? else { return Ok(Vec::new()) };
    let predicted = active.settled_predictions();
    let (judged, _) =
        where_it_runs(sweep, opts.cluster.as_deref(), view.pinned_sweep()?.as_ref(), opts.clusters_file.as_deref())?;
    let (todo, _) = would_send(&judged, opts)?;
    Ok(todo.into_iter().filter(|c| predicted.contains(c.name.as_str())).map(|c| c.name.clone()).collect())
}
