//! Before a job array is submitted: does the worker its script runs start on
//! the cluster, with the backend the experiment asks for? A job that cannot
//! start says so only in its SLURM log; this says it before anything is
//! submitted.

use super::{blocking, CommandError, Target};
use crate::cluster::TransportKind;
use crate::experiment::WorkerBackend;
use crate::transport::WorkerProbe;

/// Runs `<worker> --version` (and `<worker> backends` when the experiment
/// names a backend) on the target; refuses, with how to fix it, when the
/// worker is missing, does not start, or lacks the backend.
pub(crate) async fn check_worker(
    target: &Target,
    worker: &str,
    backend: Option<WorkerBackend>,
) -> Result<(), CommandError> {
    let refuse = |why: String| {
        CommandError::Refused(format!(
            "the worker `{worker}` {why}; nothing was submitted. {}",
            how_to_get_one(target, backend)
        ))
    };
    let version = match probe(target, worker, "--version").await? {
        WorkerProbe::Runs(version) => version,
        WorkerProbe::Fails(why) => return Err(refuse(format!("does not run on cluster `{}`: {why}", target.name))),
    };
    tracing::info!("worker on `{}`: {worker} ({version})", target.name);
    let Some(backend) = backend else { return Ok(()) };
    match backends(target, worker).await? {
        Ok(list) if list.iter().any(|l| l == backend.name()) => Ok(()),
        Ok(list) => Err(refuse(format!(
            "on cluster `{}` was built without the `{}` backend the experiment asks for (it has: {})",
            target.name,
            backend.name(),
            list.join(", ")
        ))),
        Err(why) => Err(refuse(format!("cannot list its backends on `{}`: {why}", target.name))),
    }
}

/// The backends `<worker> backends` lists on the target, one a line; `Err`:
/// why the worker did not run.
pub(crate) async fn backends(target: &Target, worker: &str) -> Result<Result<Vec<String>, String>, CommandError> {
    Ok(match probe(target, worker, "backends").await? {
        WorkerProbe::Runs(out) => {
            Ok(out.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect())
        }
        WorkerProbe::Fails(why) => Err(why),
    })
}

async fn probe(target: &Target, worker: &str, arg: &'static str) -> Result<WorkerProbe, CommandError> {
    let worker = worker.to_string();
    Ok(blocking(&target.transport, move |t| t.files().probe_worker(&worker, arg)).await?)
}

/// The build (with the experiment's backend) and where to put it.
fn how_to_get_one(target: &Target, backend: Option<WorkerBackend>) -> String {
    let features = match backend {
        None | Some(WorkerBackend::Flex) => String::new(),
        Some(b) => format!(" --features {}", b.name()),
    };
    let build = format!("cargo build --release -p worker{features}");
    let cuda = if backend == Some(WorkerBackend::Cuda) {
        " (cuda downloads CubeCL's LLVM bundle: worker/README.md)"
    } else {
        ""
    };
    match target.config.transport {
        TransportKind::Local => format!(
            "Build it beside the orchestrator (`{build}`{cuda}), put it on PATH, or name it with `worker:` for \
             this cluster in clusters.yaml"
        ),
        _ => format!(
            "Build it (`{build}`{cuda}) and install it with `orchestrator install --cluster {} --worker \
             target/release/worker`, or set `worker:` in clusters.yaml",
            target.name
        ),
    }
}
