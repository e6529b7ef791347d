//! The `local-slurm` shell: SLURM commands and files on this machine (the
//! orchestrator runs on a login node). No shell is involved: argv goes to the
//! program as is, so nothing needs quoting.

use std::path::Path;
use std::process::Command;

use super::{Counters, ExecOutput, Shell, TransportError};
use crate::cluster::ClusterConfig;

pub struct LocalShell {
    env: Vec<(String, String)>,
    counters: Counters,
}

impl LocalShell {
    pub fn new(cluster: &ClusterConfig) -> Self {
        LocalShell {
            env: cluster.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            counters: Counters::default(),
        }
    }
}

fn file_err(path: &str, e: impl std::fmt::Display) -> TransportError {
    TransportError::File { target: "localhost".into(), path: path.into(), message: e.to_string() }
}

impl Shell for LocalShell {
    fn run(&self, argv: &[String], _idempotent: bool) -> Result<ExecOutput, TransportError> {
        self.counters.command();
        let (prog, args) = argv.split_first().ok_or_else(|| TransportError::Other("empty command".into()))?;
        let out = Command::new(prog)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| TransportError::Other(format!("cannot run `{prog}`: {e}")))?;
        Ok(ExecOutput {
            status: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    fn write_file(&self, path: &str, data: &[u8], executable: bool) -> Result<(), TransportError> {
        self.counters.file();
        write_local(path, data, executable)
    }

    fn read_file(&self, path: &str) -> Result<Option<Vec<u8>>, TransportError> {
        self.counters.file();
        match std::fs::read(path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(file_err(path, e)),
        }
    }

    fn read_file_from(&self, path: &str, offset: u64) -> Result<Option<Vec<u8>>, TransportError> {
        self.counters.file();
        read_local_from(path, offset)
    }

    fn absolute(&self, path: &str) -> Result<String, TransportError> {
        let p = match path.strip_prefix("~/") {
            Some(rest) => std::env::var_os("HOME")
                .map(|h| Path::new(&h).join(rest))
                .ok_or_else(|| TransportError::Other("HOME is not set".into()))?,
            None => std::path::absolute(path).map_err(|e| file_err(path, e))?,
        };
        Ok(p.to_string_lossy().into_owned())
    }

    fn describe(&self) -> String {
        "local SLURM commands".into()
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }
}

/// Atomic local write with parents created; `executable` sets mode 0755 on
/// the temp file before the rename, so no one ever sees the new file without it.
pub(crate) fn write_local(path: &str, data: &[u8], executable: bool) -> Result<(), TransportError> {
    let p = Path::new(path);
    let mode = if executable { 0o755 } else { 0o644 };
    crate::fsio::write_atomic_mode(p, data, mode).map_err(|e| file_err(path, e))
}

/// A local file's bytes from `offset` on (`None`: no such file).
pub(crate) fn read_local_from(path: &str, offset: u64) -> Result<Option<Vec<u8>>, TransportError> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(file_err(path, e)),
    };
    let mut out = Vec::new();
    f.seek(SeekFrom::Start(offset)).and_then(|_| f.read_to_end(&mut out)).map_err(|e| file_err(path, e))?;
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn an_installed_executable_has_its_mode_when_it_appears() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("bin/worker");
        write_local(p.to_str().expect("utf-8"), b"#!/bin/sh\n", true).expect("write");
        assert_eq!(std::fs::metadata(&p).expect("stat").permissions().mode() & 0o777, 0o755);
        write_local(p.to_str().expect("utf-8"), b"data", false).expect("rewrite");
        assert_eq!(std::fs::metadata(&p).expect("stat").permissions().mode() & 0o777, 0o644);
    }

    #[test]
    fn reads_from_an_offset() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("events.jsonl");
        std::fs::write(&p, b"abc\ndef\n").expect("write");
        let path = p.to_str().expect("utf-8");
        assert_eq!(read_local_from(path, 4).expect("read"), Some(b"def\n".to_vec()));
        assert_eq!(read_local_from(path, 8).expect("read"), Some(vec![]));
        assert_eq!(read_local_from(&format!("{path}.missing"), 0).expect("read"), None);
    }
}
