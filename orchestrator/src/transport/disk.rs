//! The file store of the clusters whose files are this machine's (`local`
//! and `replay`): the state root is a local directory, read and written in
//! place. Each says only where its worker is and how it answers a probe.

use std::path::Path;

use super::{local_slurm, Counters, FileStore, TransportError, WorkerProbe};

/// A cluster on this machine's disk; [`FileStore`] comes with it.
pub(super) trait OnDisk: Send + Sync {
    /// The cluster's name in errors (`local`, `replay`).
    const NAME: &'static str;
    /// The state root, absolute.
    fn root(&self) -> &Path;
    /// Where each file operation is counted.
    fn file_counters(&self) -> &Counters;
    fn worker(&self) -> Result<String, TransportError>;
    fn probe(&self, path: &str, arg: &str) -> Result<WorkerProbe, TransportError>;

    /// Size and SHA-256 of a file (`install` skips an upload already in place).
    fn digest(&self, path: &str) -> Result<Option<(u64, String)>, TransportError> {
        use sha2::{Digest, Sha256};
        match std::fs::read(path) {
            Ok(b) => Ok(Some((b.len() as u64, hex::encode(Sha256::digest(&b))))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => {
                Err(TransportError::File { target: Self::NAME.into(), path: path.into(), message: e.to_string() })
            }
        }
    }
}

impl<T: OnDisk> FileStore for T {
    fn remote_state_root(&self) -> Result<String, TransportError> {
        Ok(self.root().to_string_lossy().into_owned())
    }

    fn worker_path(&self) -> Result<String, TransportError> {
        self.worker()
    }

    fn put_file(&self, path: &str, data: &[u8], executable: bool) -> Result<(), TransportError> {
        self.file_counters().file();
        local_slurm::write_local(path, data, executable)
    }

    fn get_file(&self, path: &str) -> Result<Option<Vec<u8>>, TransportError> {
        self.read_from(path, 0)
    }

    fn read_from(&self, path: &str, offset: u64) -> Result<Option<Vec<u8>>, TransportError> {
        self.file_counters().file();
        local_slurm::read_local_from(path, offset)
    }

    fn file_digest(&self, path: &str) -> Result<Option<(u64, String)>, TransportError> {
        self.digest(path)
    }

    fn probe_worker(&self, path: &str, arg: &str) -> Result<WorkerProbe, TransportError> {
        self.probe(path, arg)
    }
}
