//! Before a job array is submitted (or a worker installed): does the worker
//! its script runs start on the cluster, with the backend the experiment asks
//! for? A job that cannot start says so only in its SLURM log; a worker
//! without a GPU backend on a GPU node runs every config on the node's CPU
//! and says nothing at all. This says both before anything is submitted.

use std::path::Path;

use super::{blocking, CommandError, Target};
use crate::cluster::TransportKind;
use crate::experiment::{SlurmResources, WorkerBackend};
use crate::transport::WorkerProbe;

/// What the worker a job runs must have compiled in (`worker backends`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// Nothing but that it starts: no backend named, no GPU asked of SLURM.
    Starts,
    /// This backend; `by` says who asks for it ("the experiment asks for").
    Backend { backend: WorkerBackend, by: &'static str },
    /// A GPU backend, any: the jobs ask SLURM for a GPU (the directive, e.g.
    /// `--gres=gpu:1`) and name no backend, so a worker without one would
    /// pick `flex` and measure every config on the node's CPU.
    AnyGpu(String),
}

impl Need {
    /// The need of jobs that run `backend` (none named: the worker picks its
    /// first GPU backend, else `flex`) with SLURM resources `resources`.
    pub fn of(backend: Option<WorkerBackend>, by: &'static str, resources: &SlurmResources) -> Need {
        match backend {
            Some(backend) => Need::Backend { backend, by },
            None => gpu_request(resources).map_or(Need::Starts, Need::AnyGpu),
        }
    }

    /// Why a worker whose `worker backends` printed `listed` does not meet
    /// this need (`None`: it does).
    pub fn unmet(&self, listed: &[String]) -> Option<String> {
        let has = listed.join(", ");
        match self {
            Need::Starts => None,
            Need::Backend { backend, .. } if listed.iter().any(|l| l == backend.name()) => None,
            Need::Backend { backend, by } => {
                Some(format!("was built without the `{}` backend {by} (it has: {has})", backend.name()))
            }
            Need::AnyGpu(_) if listed.iter().any(|l| l != "flex") => None,
            Need::AnyGpu(directive) => Some(format!(
                "has no GPU backend (it has: {has}) and the jobs ask SLURM for a GPU (`{directive}`): \
                 it would run every config on the node's CPU"
            )),
        }
    }

    /// The backend a build for this need adds (`--features B`), if any.
    fn features(&self) -> Option<&'static str> {
        match self {
            Need::Starts | Need::Backend { backend: WorkerBackend::Flex, .. } => None,
            Need::Backend { backend, .. } => Some(backend.name()),
            Need::AnyGpu(_) => Some("vulkan"),
        }
    }
}

/// The `#SBATCH` request for a GPU among `r`, as sbatch would read it: a
/// `gres` of `gpu` (`gpu:1`, `gpu:a100:1`), or an extra `--gpus…`/`-G`/`--gres=gpu…`.
fn gpu_request(r: &SlurmResources) -> Option<String> {
    if let Some(g) = r.gres.as_deref().filter(|g| g.split(',').any(|item| item.trim().split(':').next() == Some("gpu")))
    {
        return Some(format!("--gres={g}"));
    }
    r.extra
        .iter()
        .map(|e| e.trim())
        .find(|e| e.starts_with("--gpus") || e.starts_with("--gres=gpu") || e.starts_with("-G"))
        .map(str::to_string)
}

/// Runs `<worker> --version` (and `<worker> backends` when `need` asks for
/// a backend) on the target; refuses, with how to fix it, when the worker is
/// missing, does not start, or lacks what `need` asks for.
pub(crate) async fn check_worker(target: &Target, worker: &str, need: &Need) -> Result<(), CommandError> {
    let refuse = |why: String| {
        CommandError::Refused(format!(
            "the worker `{worker}` {why}; nothing was submitted. {}",
            how_to_get_one(target, need)
        ))
    };
    let version = match probe(target, worker, "--version").await? {
        WorkerProbe::Runs(version) => version,
        WorkerProbe::Fails(why) => return Err(refuse(format!("does not run on cluster `{}`: {why}", target.name))),
    };
    tracing::info!("worker on `{}`: {worker} ({version})", target.name);
    if *need == Need::Starts {
        return Ok(());
    }
    match backends(target, worker).await? {
        Ok(list) => match need.unmet(&list) {
            None => Ok(()),
            Some(why) => Err(refuse(format!("on cluster `{}` {why}", target.name))),
        },
        Err(why) => Err(refuse(format!("cannot list its backends on `{}`: {why}", target.name))),
    }
}

/// `install`'s check of the binary it is about to upload, run here (the
/// cluster's copy is asked again by `submit`): refuses one that lacks what
/// `need` asks for, before anything is uploaded. A binary that does not run
/// on this machine (built for another) is not checked, with a warning.
pub(crate) fn check_local_worker(target: &Target, worker: &Path, need: &Need) -> Result<(), CommandError> {
    if *need == Need::Starts {
        return Ok(());
    }
    let out = std::process::Command::new(worker).arg("backends").stdin(std::process::Stdio::null()).output();
    let listed: Vec<String> = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect(),
        other => {
            let why = match other {
                Ok(o) => format!("{}: {}", o.status, String::from_utf8_lossy(&o.stderr).trim()),
                Err(e) => e.to_string(),
            };
            tracing::warn!(
                "cannot run {} here to list its backends ({why}); not checked: `submit` asks the installed one",
                worker.display()
            );
            return Ok(());
        }
    };
    match need.unmet(&listed) {
        None => Ok(()),
        Some(why) => Err(CommandError::Refused(format!(
            "the worker {} {why}; nothing was uploaded to `{}`. {}",
            worker.display(),
            target.name,
            how_to_get_one(target, need)
        ))),
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

/// The build (with the backend `need` asks for) and where to put it.
fn how_to_get_one(target: &Target, need: &Need) -> String {
    let features = need.features().map(|f| format!(" --features {f}")).unwrap_or_default();
    let note = match need {
        Need::Backend { backend: WorkerBackend::Cuda, .. } => " (it downloads CubeCL's LLVM bundle: worker/README.md)",
        Need::AnyGpu(_) => {
            " (README.md, \"A worker for a GPU\": `wgpu` builds offline too, `cuda` only where cargo may download)"
        }
        _ => "",
    };
    let place = match target.config.transport {
        TransportKind::Local => {
            "beside the orchestrator, put it on PATH, or name it with `worker:` for this cluster in clusters.yaml"
                .to_string()
        }
        _ => format!(
            "and install it with `orchestrator install --cluster {} --worker target/release/worker`, or set \
             `worker:` in clusters.yaml",
            target.name
        ),
    };
    let mut out = format!("Build it with `cargo build --release -p worker{features}`{note} {place}.");
    if matches!(need, Need::AnyGpu(_)) {
        let install = if target.config.transport == TransportKind::Local { "" } else { "; `install --backend flex`" };
        out += &format!(
            " To run the jobs on the CPU, name that backend (`worker: {{backend: flex}}` in the experiment{install})."
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_gpu_asked_of_slurm_needs_a_gpu_backend_unless_one_is_named() {
        let gres = |g: &str| SlurmResources { gres: Some(g.into()), ..SlurmResources::default() };
        assert_eq!(Need::of(None, "x", &gres("gpu:1")), Need::AnyGpu("--gres=gpu:1".into()));
        assert_eq!(
            Need::of(None, "x", &gres("tmpfs:10G,gpu:a100:1")),
            Need::AnyGpu("--gres=tmpfs:10G,gpu:a100:1".into())
        );
        assert_eq!(Need::of(None, "x", &gres("tmpfs:10G")), Need::Starts);
        assert_eq!(Need::of(None, "x", &SlurmResources::default()), Need::Starts);
        let extra = SlurmResources { extra: vec!["--gpus-per-node=1".into()], ..SlurmResources::default() };
        assert_eq!(Need::of(None, "x", &extra), Need::AnyGpu("--gpus-per-node=1".into()));
        let flex = Need::of(Some(WorkerBackend::Flex), "x", &gres("gpu:1"));
        assert_eq!(flex, Need::Backend { backend: WorkerBackend::Flex, by: "x" });
        assert_eq!(flex.unmet(&listed(&["flex"])), None);

        let any = Need::AnyGpu("--gres=gpu:1".into());
        assert_eq!(any.unmet(&listed(&["flex", "vulkan"])), None);
        let why = any.unmet(&listed(&["flex"])).expect("a CPU-only worker is refused");
        assert!(why.starts_with("has no GPU backend (it has: flex) and the jobs ask SLURM for a GPU (`--gres=gpu:1`)"));
        let cuda = Need::Backend { backend: WorkerBackend::Cuda, by: "the experiment asks for" };
        assert_eq!(
            cuda.unmet(&listed(&["flex", "vulkan"])).as_deref(),
            Some("was built without the `cuda` backend the experiment asks for (it has: flex, vulkan)")
        );
        assert_eq!(Need::Starts.unmet(&[]), None);
    }
}
