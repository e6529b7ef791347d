//! `orchestrator install --cluster NAME --warm [--backend B]`: one SLURM job
//! (one task, the cluster's `defaults:` resources) that runs `worker warm` on
//! the node it lands on, filling that node's kernel cache
//! (`<work_dir>/cache/<host>`, the one the profiling jobs use) with a short
//! run of each model family's kernels, so a sweep's first configs do not pay
//! for compiling them.
//!
//! The job's files go to `<work_dir>/warm/<id>/` (its script and `warm.out`,
//! the log), through the cluster's transport as `submit` sends its arrays. It
//! belongs to no sweep: no experiment's state records it.

use serde::Serialize;

use super::{CommandError, Options, Target};
use crate::experiment::WorkerBackend;
use crate::render::{Renderer, WarmVars};
use crate::slurm::JobId;
use crate::target::blocking;

/// A warm-up job's time limit when the cluster's `defaults:` set none: a
/// short run of four small models, so a stuck one does not hold a GPU for
/// the partition's maximum.
pub const DEFAULT_TIME: &str = "00:30:00";

/// The warm-up job as submitted.
#[derive(Debug, Clone, Serialize)]
pub struct WarmJob {
    pub job_id: JobId,
    pub job_name: String,
    /// Its output on the cluster (`<work_dir>/warm/<id>/warm.out`).
    pub log: String,
    /// The cache it fills: `<work_dir>/cache/<host of the node it runs on>`.
    pub cache: String,
    /// The backend the worker runs (`--backend`, or what it picks itself).
    pub backend: String,
    /// SLURM runs it (`sacct` knows it), not the `local` transport's runner.
    pub on_slurm: bool,
}

/// Renders and submits the warm-up job on `target`; `backend` is passed to
/// `worker warm` (none: it picks its first GPU backend). The worker must be
/// in place (`install`) and have `backend` compiled in: both are asked of it
/// (`worker backends`) before anything is submitted.
pub async fn submit(opts: &Options, target: &Target, backend: Option<WorkerBackend>) -> Result<WarmJob, CommandError> {
    let state_root = blocking(&target.transport, |t| t.files().remote_state_root()).await?;
    let worker = blocking(&target.transport, |t| t.files().worker_path()).await?;
    let backend_name = chosen_backend(target, &worker, backend).await?;
    let work_dir = super::arrays::work_dir_of(&target.config, &state_root);
    let id = format!("{}-{}", crate::fsio::now() as u64, super::arrays::random_suffix());
    let job_dir = format!("{work_dir}/warm/{id}");
    let mut slurm: crate::render::SlurmVars = (&target.config.defaults).into();
    slurm.time = slurm.time.or_else(|| Some(DEFAULT_TIME.into()));
    let vars = WarmVars {
        job_name: format!("sweep-warm-{id}"),
        slurm,
        work_dir: work_dir.clone(),
        job_dir: job_dir.clone(),
        log: format!("{job_dir}/warm.out"),
        worker,
        backend: backend.map(|b| b.name().to_string()),
        setup: (&target.config.setup).into(),
    };
    let script = Renderer::new(opts.template_dirs.clone()).render_warm(&vars)?;
    let script_path = format!("{job_dir}/job.sbatch");
    let p = script_path.clone();
    blocking(&target.transport, move |t| t.files().put_file(&p, script.as_bytes(), false)).await?;
    let job_id = blocking(&target.transport, move |t| t.submit(&script_path)).await.map_err(|e| {
        CommandError::Refused(format!(
            "submitting the warm-up job {} failed: {e} (SLURM may still have queued it: `squeue --name {}`)",
            vars.job_name, vars.job_name
        ))
    })?;
    Ok(WarmJob {
        job_id,
        job_name: vars.job_name,
        log: vars.log,
        cache: format!("{work_dir}/cache/<host>"),
        backend: backend_name,
        on_slurm: target.config.transport != crate::cluster::TransportKind::Local,
    })
}

/// The backend `worker warm` will run: `wanted` when the installed worker
/// has it, else its first GPU backend, else `flex` (as the worker picks).
async fn chosen_backend(target: &Target, worker: &str, wanted: Option<WorkerBackend>) -> Result<String, CommandError> {
    let listed = super::probe::backends(target, worker).await?.map_err(|why| {
        CommandError::Refused(format!(
            "the worker {worker} on `{}` does not run: {why} (install it first)",
            target.name
        ))
    })?;
    pick_backend(&listed, wanted)
        .map_err(|e| CommandError::Refused(format!("{e} (the worker {worker} on `{}`)", target.name)))
}

/// `wanted` if `listed` (what `worker backends` printed) has it; else the
/// first GPU backend listed, else `flex`.
fn pick_backend(listed: &[String], wanted: Option<WorkerBackend>) -> Result<String, String> {
    match wanted {
        Some(b) if listed.iter().any(|l| l == b.name()) => Ok(b.name().to_string()),
        Some(b) => Err(format!("backend `{}` is not compiled in: it has {}", b.name(), listed.join(", "))),
        None => Ok(listed.iter().find(|l| *l != "flex").or(listed.first()).cloned().unwrap_or_else(|| "flex".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_is_the_one_asked_for_if_compiled_in_else_the_first_gpu_one() {
        let listed: Vec<String> = ["flex", "vulkan", "wgpu"].map(String::from).to_vec();
        assert_eq!(pick_backend(&listed, None).as_deref(), Ok("vulkan"));
        assert_eq!(pick_backend(&listed, Some(WorkerBackend::Flex)).as_deref(), Ok("flex"));
        let e = pick_backend(&listed, Some(WorkerBackend::Cuda)).unwrap_err();
        assert_eq!(e, "backend `cuda` is not compiled in: it has flex, vulkan, wgpu");
        assert_eq!(pick_backend(&["flex".into()], None).as_deref(), Ok("flex"));
    }
}
