//! The cluster a command talks to (its clusters-file entry and an open
//! transport), and how blocking transport calls run under the async runtime.
//! Plumbing shared by the cluster commands and `install`.

use std::path::Path;
use std::sync::Arc;

use crate::cluster::{ClusterConfig, ClusterError, ClustersFile};
use crate::transport::{self, Transport, TransportError};

/// A named cluster and the connection to it.
pub struct Target {
    pub name: String,
    pub config: ClusterConfig,
    pub transport: Arc<dyn Transport>,
}

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Transport(#[from] TransportError),
}

/// Cluster `name` of the clusters file (default `$SWEEP_CLUSTERS` or
/// `./clusters.yaml`), connected. `state_root` is the local state directory
/// (the `local` transport runs jobs there).
pub fn open(clusters_file: Option<&Path>, name: &str, state_root: &Path) -> Result<Target, TargetError> {
    let (file, label) = ClustersFile::load_or_default(clusters_file)?;
    let (name, config) = file.get(name, &label)?;
    let transport = transport::open(&name, &config, state_root)?;
    Ok(Target { name, config, transport })
}

/// Runs an async command to completion on a fresh runtime (for a sync `main`).
pub fn block_on<F: std::future::Future>(f: F) -> Result<F::Output, std::io::Error> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?.block_on(f))
}

/// Runs a blocking transport call off the async runtime's worker threads.
pub async fn blocking<T, F>(t: &Arc<dyn Transport>, f: F) -> Result<T, TransportError>
where
    T: Send + 'static,
    F: FnOnce(&dyn Transport) -> Result<T, TransportError> + Send + 'static,
{
    let t = Arc::clone(t);
    tokio::task::spawn_blocking(move || f(&*t))
        .await
        .map_err(|e| TransportError::Other(format!("transport call panicked or was cancelled: {e}")))?
}
