//! The `ssh` shell: commands over SSH exec channels, files over SFTP (ssh2).
//!
//! Connection settings come from the clusters file, then the ssh config
//! ([`config`]: OpenSSH's reading of `Host`, `Match`, `Include`, `ProxyJump`,
//! `ProxyCommand`, …), resolved into a chain of hops ([`target`]). Every hop's
//! host key must match known_hosts: an unknown or changed key is refused with
//! the fingerprint and what to do, never accepted ([`session`]).
//!
//! One session is kept and reused; a dropped one is reopened with backoff (a
//! host name that does not resolve is not retried). Read-only commands are
//! retried over the new session; `sbatch` is not (it may have run): the caller
//! gets [`TransportError::Uncertain`] and the submission's recorded intent is
//! settled by `resume`.

pub mod config;
pub mod hops;
mod link;
mod session;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

pub use hops::{resolve_target, Hop, SshTarget, Via};

use super::{Counters, ExecOutput, Shell, TransportError};
use crate::cluster::ClusterConfig;
use crate::util::shell::sh_quote;
use session::Connection;

fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from)
}

struct Conn {
    live: Connection,
    sftp: Option<ssh2::Sftp>,
    home: Option<String>,
}

pub struct SshShell {
    target: SshTarget,
    conn: Mutex<Option<Conn>>,
    counters: Counters,
    /// How long to keep trying to reconnect a dropped session.
    reconnect_for: Duration,
    /// How long one command may be silent before it counts as hung.
    command_timeout: Duration,
}

/// An ssh2 error from a live session: the connection is suspect; drop it.
fn session_err(target: &SshTarget, what: &str, e: ssh2::Error) -> TransportError {
    TransportError::Connect { target: target.label(), message: format!("{what}: {e}") }
}

/// Errors a reconnect cannot cure: a refused host key or login, a host name
/// that does not resolve, a broken ssh config.
fn is_permanent(e: &TransportError) -> bool {
    matches!(
        e,
        TransportError::HostKey(_)
            | TransportError::Auth { .. }
            | TransportError::Resolve { .. }
            | TransportError::SshConfig(_)
    )
}

impl SshShell {
    pub fn new(_name: &str, cluster: &ClusterConfig) -> Result<Self, TransportError> {
        let target = resolve_target(cluster)?;
        Ok(Self::with_target(target))
    }

    pub fn with_target(target: SshTarget) -> Self {
        let secs = |var: &str, default: u64| std::env::var(var).ok().and_then(|s| s.parse().ok()).unwrap_or(default);
        SshShell {
            target,
            conn: Mutex::new(None),
            counters: Counters::default(),
            reconnect_for: Duration::from_secs(secs("SWEEP_SSH_RECONNECT_SECS", 60)),
            command_timeout: Duration::from_secs(secs("SWEEP_SSH_COMMAND_SECS", 120).max(1)),
        }
    }

    /// How long a dropped or refused connection is retried (default 60 s, `SWEEP_SSH_RECONNECT_SECS`).
    pub fn reconnect_window(mut self, d: Duration) -> Self {
        self.reconnect_for = d;
        self
    }

    pub fn target(&self) -> &SshTarget {
        &self.target
    }

    /// Opens, verifies and authenticates a session over every hop.
    fn connect(&self) -> Result<Connection, TransportError> {
        let c = session::open(&self.target)?;
        c.session.set_timeout(u32::try_from(self.command_timeout.as_millis()).unwrap_or(u32::MAX));
        self.counters.connects.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(target = %self.target.label(), "SSH connected");
        Ok(c)
    }

    /// Runs `op` on a live connection, reconnecting (with backoff) when the
    /// session is gone or `op` fails on a dropped one and `retry` allows.
    fn with_conn<T>(
        &self,
        retry: bool,
        what: &str,
        mut op: impl FnMut(&mut Conn) -> Result<T, OpError>,
    ) -> Result<T, TransportError> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let deadline = std::time::Instant::now() + self.reconnect_for;
        let mut delay = Duration::from_millis(250);
        let mut used_existing = guard.is_some();
        loop {
            if guard.is_none() {
                match self.connect() {
                    Ok(live) => *guard = Some(Conn { live, sftp: None, home: None }),
                    Err(e) if is_permanent(&e) => return Err(e),
                    Err(e) => {
                        if std::time::Instant::now() + delay > deadline {
                            return Err(e);
                        }
                        tracing::warn!(target = %self.target.label(), "reconnecting in {:?}: {e}", delay);
                        std::thread::sleep(delay);
                        delay = (delay * 2).min(Duration::from_secs(5));
                        continue;
                    }
                }
            }
            let conn = guard.as_mut().expect("connected above");
            match op(conn) {
                Ok(v) => return Ok(v),
                Err(OpError::Final(e)) => return Err(e),
                Err(OpError::Dropped(e)) => {
                    // The session is unusable: forget it either way.
                    *guard = None;
                    tracing::warn!(target = %self.target.label(), "SSH session lost during {what}: {e}");
                    if !retry && used_existing {
                        return Err(TransportError::Uncertain {
                            target: self.target.label(),
                            command: what.to_string(),
                        });
                    }
                    if !retry {
                        return Err(e);
                    }
                    if std::time::Instant::now() > deadline {
                        return Err(e);
                    }
                    used_existing = false;
                }
            }
        }
    }

    fn sftp<'a>(&self, conn: &'a mut Conn) -> Result<&'a ssh2::Sftp, OpError> {
        if conn.sftp.is_none() {
            let s = conn.live.session.sftp().map_err(|e| OpError::Dropped(session_err(&self.target, "SFTP", e)))?;
            conn.sftp = Some(s);
        }
        Ok(conn.sftp.as_ref().expect("set above"))
    }

    fn home_dir(&self, conn: &mut Conn) -> Result<String, OpError> {
        if let Some(h) = &conn.home {
            return Ok(h.clone());
        }
        let sftp = self.sftp(conn)?;
        let h =
            sftp.realpath(Path::new(".")).map_err(|e| OpError::Dropped(session_err(&self.target, "realpath .", e)))?;
        let h = h.to_string_lossy().into_owned();
        conn.home = Some(h.clone());
        Ok(h)
    }
}

enum OpError {
    /// The session failed: reconnect (and maybe retry).
    Dropped(TransportError),
    /// The operation failed on a healthy session.
    Final(TransportError),
}

/// SFTP status codes that mean the request failed, not the session.
fn sftp_status(e: &ssh2::Error) -> Option<i32> {
    match e.code() {
        ssh2::ErrorCode::SFTP(c) => Some(c),
        _ => None,
    }
}
const FX_NO_SUCH_FILE: i32 = 2;

impl Shell for SshShell {
    fn run(&self, argv: &[String], idempotent: bool) -> Result<ExecOutput, TransportError> {
        let command = argv.iter().map(|a| sh_quote(a)).collect::<Vec<_>>().join(" ");
        let what = argv.first().cloned().unwrap_or_default();
        self.with_conn(idempotent, &what, |conn| {
            self.counters.command();
            let drop = |e: ssh2::Error| OpError::Dropped(session_err(&self.target, &what, e));
            let mut ch = conn.live.session.channel_session().map_err(drop)?;
            ch.exec(&command).map_err(drop)?;
            let mut stdout = Vec::new();
            ch.read_to_end(&mut stdout).map_err(|e| {
                // A silent link and a silent command look the same from here:
                // reconnected and retried like a drop, but said as what it is.
                if e.kind() == std::io::ErrorKind::TimedOut {
                    return OpError::Dropped(TransportError::Silent {
                        target: self.target.label(),
                        command: command.clone(),
                        seconds: self.command_timeout.as_secs(),
                    });
                }
                OpError::Dropped(TransportError::Connect {
                    target: self.target.label(),
                    message: format!("{what}: reading output: {e}"),
                })
            })?;
            let mut stderr = Vec::new();
            ch.stderr().read_to_end(&mut stderr).map_err(|e| {
                OpError::Dropped(TransportError::Connect {
                    target: self.target.label(),
                    message: format!("{what}: reading errors: {e}"),
                })
            })?;
            ch.wait_close().map_err(drop)?;
            let status = ch.exit_status().map_err(drop)?;
            Ok(ExecOutput {
                status,
                stdout: String::from_utf8_lossy(&stdout).into_owned(),
                stderr: String::from_utf8_lossy(&stderr).into_owned(),
            })
        })
    }

    fn write_file(&self, path: &str, data: &[u8], executable: bool) -> Result<(), TransportError> {
        let path = self.absolute(path)?;
        self.with_conn(true, "SFTP upload", |conn| {
            self.counters.file();
            let target = self.target.label();
            let sftp = self.sftp(conn)?;
            let ferr = |e: ssh2::Error, p: &str| {
                if sftp_status(&e).is_some() {
                    OpError::Final(TransportError::File {
                        target: target.clone(),
                        path: p.into(),
                        message: e.to_string(),
                    })
                } else {
                    OpError::Dropped(session_err(&self.target, "SFTP", e))
                }
            };
            // mkdir -p, ignoring "exists".
            let p = Path::new(&path);
            let mut dirs: Vec<&Path> =
                p.ancestors().skip(1).take_while(|d| !d.as_os_str().is_empty() && *d != Path::new("/")).collect();
            dirs.reverse();
            for d in dirs {
                if sftp.stat(d).is_err() {
                    if let Err(e) = sftp.mkdir(d, 0o755) {
                        if sftp.stat(d).is_err() {
                            return Err(ferr(e, &d.to_string_lossy()));
                        }
                    }
                }
            }
            let tmp = format!("{path}.tmp-{}", std::process::id());
            let mode = if executable { 0o755 } else { 0o644 };
            {
                let mut f = sftp
                    .open_mode(
                        Path::new(&tmp),
                        ssh2::OpenFlags::WRITE | ssh2::OpenFlags::CREATE | ssh2::OpenFlags::TRUNCATE,
                        mode,
                        ssh2::OpenType::File,
                    )
                    .map_err(|e| ferr(e, &tmp))?;
                f.write_all(data).map_err(|e| {
                    OpError::Dropped(TransportError::Connect {
                        target: target.clone(),
                        message: format!("SFTP write {tmp}: {e}"),
                    })
                })?;
                let _ = f.fsync();
            }
            let flags = ssh2::RenameFlags::OVERWRITE | ssh2::RenameFlags::ATOMIC | ssh2::RenameFlags::NATIVE;
            if let Err(e) = sftp.rename(Path::new(&tmp), p, Some(flags)) {
                // Servers without posix-rename: remove the target, then rename.
                let _ = sftp.unlink(p);
                sftp.rename(Path::new(&tmp), p, None).map_err(|_| ferr(e, &path))?;
            }
            Ok(())
        })
    }

    fn read_file(&self, path: &str) -> Result<Option<Vec<u8>>, TransportError> {
        let path = self.absolute(path)?;
        self.with_conn(true, "SFTP download", |conn| {
            self.counters.file();
            let target = self.target.label();
            let sftp = self.sftp(conn)?;
            let mut f = match sftp.open(Path::new(&path)) {
                Ok(f) => f,
                Err(e) if sftp_status(&e) == Some(FX_NO_SUCH_FILE) => return Ok(None),
                Err(e) if sftp_status(&e).is_some() => {
                    return Err(OpError::Final(TransportError::File {
                        target,
                        path: path.clone(),
                        message: e.to_string(),
                    }))
                }
                Err(e) => return Err(OpError::Dropped(session_err(&self.target, "SFTP open", e))),
            };
            let mut buf = Vec::new();
            f.read_to_end(&mut buf).map_err(|e| {
                OpError::Dropped(TransportError::Connect { target, message: format!("SFTP read {path}: {e}") })
            })?;
            Ok(Some(buf))
        })
    }

    fn absolute(&self, path: &str) -> Result<String, TransportError> {
        if path.starts_with('/') {
            return Ok(path.to_string());
        }
        let home = self.with_conn(true, "realpath", |conn| self.home_dir(conn))?;
        let rest = path.strip_prefix("~/").unwrap_or(if path == "~" { "" } else { path });
        Ok(if rest.is_empty() || rest == "." { home } else { format!("{}/{}", home.trim_end_matches('/'), rest) })
    }

    fn describe(&self) -> String {
        format!("ssh {}", self.target.label())
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::TransportKind;
    use std::net::ToSocketAddrs;
    use std::time::Instant;

    /// Issue 14: a host that does not resolve fails at once instead of being
    /// retried for the reconnect window (`.invalid` never resolves, RFC 6761).
    #[test]
    fn a_host_name_that_does_not_resolve_is_not_retried() {
        let t0 = Instant::now();
        assert!(("sweep-no-such-host.invalid", 22).to_socket_addrs().is_err());
        let one_lookup = t0.elapsed();
        let mut c = ClusterConfig::local();
        c.transport = TransportKind::Ssh;
        c.host = Some("sweep-no-such-host.invalid".into());
        c.user = Some("me".into());
        c.ssh_config = Some("/dev/null".into());
        let shell = SshShell::new("t", &c).expect("target");
        // A refused connection would be retried for `reconnect_for` (60 s by default).
        let t0 = Instant::now();
        let e = shell.run(&["true".to_string()], true).expect_err("does not resolve");
        let took = t0.elapsed();
        eprintln!("DNS failure: one lookup {one_lookup:?}, the shell gave up after {took:?}");
        assert!(matches!(e, TransportError::Resolve { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("`sweep-no-such-host.invalid` does not resolve") && msg.contains("not retried"), "{msg}");
        assert!(took < one_lookup * 3 + Duration::from_secs(2), "retried: {took:?} (one lookup {one_lookup:?})");
    }
}
