//! `orchestrator install --cluster NAME [--worker PATH]`: puts the worker binary
//! where the sbatch template calls it on a SLURM cluster (`<work_dir>/bin/worker`,
//! or the cluster's `worker:` path).
//!
//! The upload goes through the cluster's transport (SFTP for `ssh`) to a temp
//! name, then a rename, so a job starting meanwhile runs either the old binary
//! or the new one, never half a file. It is skipped when the file on the
//! cluster already has the same size and SHA-256 (computed there), so running
//! `install` before every sweep costs one command.
//!
//! Before the upload, the binary is asked here (`worker backends`) whether it
//! has the backend `--backend` names, or, with none named, a GPU backend where
//! the cluster's `defaults:` ask SLURM for a GPU ([`super::probe::Need`]): a
//! CPU-only build on a GPU cluster is refused, with how to build the GPU one.
//!
//! `--warm` then submits a job that fills a node's kernel cache ([`super::warm`]).

use serde::Serialize;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{CommandError, Options, Target};
use crate::cluster::TransportKind;
use crate::experiment::WorkerBackend;
use crate::target::blocking;

/// What `install` did.
#[derive(Debug, Clone, Serialize)]
pub struct InstallReport {
    pub cluster: String,
    /// Where the worker is on the cluster.
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
    /// `false`: the cluster already had this exact binary.
    pub uploaded: bool,
    pub wall_s: f64,
}

/// The worker built beside the running orchestrator (`target/<profile>/worker`).
pub fn default_worker() -> Option<PathBuf> {
    std::env::current_exe().ok()?.parent().map(|d| d.join("worker"))
}

/// What `install [--warm]` did: the upload (none for the `local` transport,
/// whose jobs run the worker beside the orchestrator), the warm-up job.
pub struct Installed {
    pub upload: Option<InstallReport>,
    pub warm: Option<super::warm::WarmJob>,
}

/// Uploads `worker` to cluster `cluster` unless it is already there (refused
/// when it lacks `backend`, or, with none, a GPU backend the cluster's
/// defaults ask for); then, with `warm`, the warm-up job
/// ([`super::warm::submit`]), with `backend` when given.
pub async fn install(
    opts: &Options,
    cluster: &str,
    worker: &Path,
    backend: Option<WorkerBackend>,
    warm: bool,
) -> Result<Installed, CommandError> {
    let target = crate::target::open(opts.clusters_file.as_deref(), cluster, &opts.state_root)?;
    if !warm {
        return Ok(Installed { upload: Some(install_on(&target, worker, backend).await?), warm: None });
    }
    let upload = match target.config.transport {
        TransportKind::Local => None,
        _ => Some(install_on(&target, worker, backend).await?),
    };
    let job = super::warm::submit(opts, &target, backend).await?;
    Ok(Installed { upload, warm: Some(job) })
}

/// Uploads `worker` to `target` unless it is already there; first refuses
/// one that lacks `backend` (none: a GPU backend, where the cluster's
/// defaults ask SLURM for a GPU).
pub async fn install_on(
    target: &Target,
    worker: &Path,
    backend: Option<WorkerBackend>,
) -> Result<InstallReport, CommandError> {
    let t0 = Instant::now();
    if target.config.transport == TransportKind::Replay {
        return Err(CommandError::Refused(format!(
            "cluster `{}` replays recorded measurements: it runs no worker, so there is nothing to install",
            target.name
        )));
    }
    if target.config.transport == TransportKind::Local {
        return Err(CommandError::Refused(format!(
            "cluster `{}` uses the `local` transport: its jobs run the worker beside the orchestrator \
             (or the cluster's `worker:` path), so there is nothing to install",
            target.name
        )));
    }
    let data = std::fs::read(worker).map_err(|e| {
        CommandError::Refused(format!(
            "cannot read the worker binary {}: {e} (build it with `cargo build -p worker --release`, or pass --worker PATH)",
            worker.display()
        ))
    })?;
    let need = super::probe::Need::of(backend, "`install --backend` names", &target.config.defaults);
    super::probe::check_local_worker(target, worker, &need)?;
    let sha256 = hex::encode(Sha256::digest(&data));
    let bytes = data.len() as u64;
    let path = blocking(&target.transport, |t| t.files().worker_path()).await?;
    let present = blocking(&target.transport, {
        let path = path.clone();
        move |t| t.files().file_digest(&path)
    })
    .await?;
    let uploaded = present.as_ref() != Some(&(bytes, sha256.clone()));
    if uploaded {
        let p = path.clone();
        blocking(&target.transport, move |t| t.files().put_file(&p, &data, true)).await?;
        // Read back what the cluster has: a short write must not pass as installed.
        let p = path.clone();
        let now = blocking(&target.transport, move |t| t.files().file_digest(&p)).await?;
        if now.as_ref() != Some(&(bytes, sha256.clone())) {
            return Err(CommandError::Refused(format!(
                "{path} on `{}` does not match the uploaded worker after the upload ({now:?}, expected {bytes} bytes, sha256 {sha256})",
                target.name
            )));
        }
    }
    Ok(InstallReport {
        cluster: target.name.clone(),
        path,
        bytes,
        sha256,
        uploaded,
        wall_s: t0.elapsed().as_secs_f64(),
    })
}
