//! The data plane: where job files, the worker binary and results live, and
//! how they move (SFTP, or this machine's filesystem). Shared by every SLURM
//! transport, whatever drives SLURM (the control plane: commands over a
//! [`Shell`], or the REST API).

use std::sync::Arc;

use super::{FileStore, Shell, TransportError, WorkerProbe};
use crate::cluster::ClusterConfig;

/// Files on the cluster through a [`Shell`], relative to the cluster's `work_dir`.
pub struct Files {
    shell: Arc<dyn Shell>,
    work_dir: String,
    worker: Option<String>,
}

impl Files {
    pub fn new(shell: Arc<dyn Shell>, cluster: &ClusterConfig) -> Self {
        Files {
            shell,
            work_dir: cluster.work_dir.clone().unwrap_or_else(|| ".".into()),
            worker: cluster.worker.clone(),
        }
    }

    pub fn shell(&self) -> &dyn Shell {
        self.shell.as_ref()
    }

    fn work_dir_abs(&self) -> Result<String, TransportError> {
        self.shell.absolute(&self.work_dir)
    }
}

impl FileStore for Files {
    /// `<work_dir>/state`, absolute.
    fn remote_state_root(&self) -> Result<String, TransportError> {
        Ok(format!("{}/state", self.work_dir_abs()?.trim_end_matches('/')))
    }

    /// The worker binary: `worker` if set, else `<work_dir>/bin/worker`.
    fn worker_path(&self) -> Result<String, TransportError> {
        match &self.worker {
            Some(w) => self.shell.absolute(w),
            None => Ok(format!("{}/bin/worker", self.work_dir_abs()?.trim_end_matches('/'))),
        }
    }

    fn put_file(&self, path: &str, data: &[u8], executable: bool) -> Result<(), TransportError> {
        self.shell.write_file(path, data, executable)
    }

    fn get_file(&self, path: &str) -> Result<Option<Vec<u8>>, TransportError> {
        self.shell.read_file(path)
    }

    fn read_from(&self, path: &str, offset: u64) -> Result<Option<Vec<u8>>, TransportError> {
        self.shell.read_file_from(path, offset)
    }

    /// Size and SHA-256 of a file, computed where it lives.
    fn file_digest(&self, path: &str) -> Result<Option<(u64, String)>, TransportError> {
        // The path is `$1`, never part of the script text; exit 2 means absent.
        const SCRIPT: &str = r#"[ -e "$1" ] || exit 2; stat -L -c %s "$1" && sha256sum < "$1""#;
        let argv: Vec<String> = ["sh", "-c", SCRIPT, "sh", path].iter().map(|s| s.to_string()).collect();
        let out = self.shell.run(&argv, true)?;
        match out.status {
            0 => {}
            2 => return Ok(None),
            status => {
                return Err(TransportError::Command {
                    command: format!("sha256sum {path}"),
                    status,
                    stderr: out.stderr.trim().to_string(),
                })
            }
        }
        parse_digest(&out.stdout).map(Some).ok_or_else(|| {
            TransportError::Other(format!("unexpected `stat`/`sha256sum` output for {path}: {:?}", out.stdout))
        })
    }

    fn probe_worker(&self, path: &str, arg: &str) -> Result<WorkerProbe, TransportError> {
        let out = self.shell.run(&[path.to_string(), arg.to_string()], true)?;
        Ok(WorkerProbe::from_exit(out.status, &out.stdout, &out.stderr))
    }
}

/// `stat -c %s` then `sha256sum` of stdin: `"<size>\n<64 hex>  -\n"`.
fn parse_digest(out: &str) -> Option<(u64, String)> {
    let mut lines = out.lines();
    let size = lines.next()?.trim().parse().ok()?;
    let hash = lines.next()?.split_whitespace().next()?.to_ascii_lowercase();
    (hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit())).then_some((size, hash))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_output_is_parsed() {
        let h = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(parse_digest(&format!("0\n{h}  -\n")), Some((0, h.to_string())));
        assert_eq!(parse_digest("12\nnot-a-hash  -\n"), None);
        assert_eq!(parse_digest(""), None);
    }
}
