//! The `ssh` shell: commands over SSH exec channels, files over SFTP (ssh2).
//!
//! Connection settings come from the clusters file, then `~/.ssh/config`
//! (`Host` patterns; `HostName`, `User`, `Port`, `IdentityFile`,
//! `UserKnownHostsFile`; first value wins, as in OpenSSH). The host key must
//! match known_hosts: an unknown or changed key is refused with the
//! fingerprint and what to do, never accepted. Authentication tries the
//! configured key files, then ssh-agent, then the default key files.
//!
//! One session is kept and reused; a dropped one is reopened with backoff.
//! Read-only commands are retried over the new session; `sbatch` is not (it
//! may have run): the caller gets [`TransportError::Uncertain`] and the
//! submission's recorded intent is settled by `resume`.

use base64::Engine;
use ssh2::{CheckResult, KnownHostFileKind, Session};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use super::{Counters, ExecOutput, Shell, TransportError};
use crate::cluster::ClusterConfig;
use crate::render::sh_quote;

/// Resolved connection settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SshTarget {
    pub alias: String,
    pub host: String,
    pub port: u16,
    pub user: String,
    pub identity_files: Vec<PathBuf>,
    /// Whether `identity_files` came from configuration (else: the defaults).
    pub explicit_identity: bool,
    pub known_hosts: Vec<PathBuf>,
}

impl SshTarget {
    fn label(&self) -> String {
        if self.port == 22 {
            format!("{}@{}", self.user, self.host)
        } else {
            format!("{}@{}:{}", self.user, self.host, self.port)
        }
    }
}

/// The settings `~/.ssh/config` gives for `alias` (only the keys used here).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct SshConfigEntry {
    pub host_name: Option<String>,
    pub user: Option<String>,
    pub port: Option<u16>,
    pub identity_files: Vec<String>,
    pub known_hosts: Vec<String>,
}

/// Applies every `Host` block matching `alias`, first value winning.
pub fn parse_ssh_config(text: &str, alias: &str) -> SshConfigEntry {
    let mut e = SshConfigEntry::default();
    let mut active = true; // options before the first Host apply to all
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = match line.split_once(|c: char| c.is_whitespace() || c == '=') {
            Some((k, v)) => (k.trim().to_ascii_lowercase(), v.trim().trim_start_matches('=').trim()),
            None => continue,
        };
        let value = value.trim_matches('"');
        match key.as_str() {
            "host" => active = host_matches(value, alias),
            "match" => active = false, // Match blocks are not supported: skipped, not guessed
            _ if !active => {}
            "hostname" if e.host_name.is_none() => e.host_name = Some(value.to_string()),
            "user" if e.user.is_none() => e.user = Some(value.to_string()),
            "port" if e.port.is_none() => e.port = value.parse().ok(),
            "identityfile" => e.identity_files.push(value.to_string()),
            "userknownhostsfile" if e.known_hosts.is_empty() => {
                e.known_hosts = value.split_whitespace().map(str::to_string).collect()
            }
            _ => {}
        }
    }
    e
}

fn host_matches(patterns: &str, alias: &str) -> bool {
    let mut matched = false;
    for p in patterns.split_whitespace() {
        if let Some(neg) = p.strip_prefix('!') {
            if glob(neg, alias) {
                return false;
            }
        } else if glob(p, alias) {
            matched = true;
        }
    }
    matched
}

/// `*` and `?` wildcards, as ssh_config patterns.
fn glob(p: &str, s: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (p.chars().collect(), s.chars().collect());
    fn m(p: &[char], s: &[char]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some('*'), _) => m(&p[1..], s) || (!s.is_empty() && m(p, &s[1..])),
            (Some('?'), Some(_)) => m(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a.eq_ignore_ascii_case(b) => m(&p[1..], &s[1..]),
            _ => false,
        }
    }
    m(&p, &s)
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from)
}

/// `~` and the `%d %u %h %r %p` tokens ssh_config allows in paths.
fn expand_path(p: &str, host: &str, user: &str, port: u16) -> PathBuf {
    let local_user = std::env::var("USER").unwrap_or_default();
    let h = home().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
    let p = p
        .replace("%d", &h)
        .replace("%u", &local_user)
        .replace("%h", host)
        .replace("%r", user)
        .replace("%p", &port.to_string());
    match p.strip_prefix("~/") {
        Some(rest) => home().unwrap_or_default().join(rest),
        None => PathBuf::from(p),
    }
}

/// Clusters file first, then `~/.ssh/config`, then defaults.
pub fn resolve_target(cluster: &ClusterConfig) -> Result<SshTarget, TransportError> {
    let alias = cluster.host.clone().ok_or_else(|| TransportError::Other("ssh cluster without `host`".into()))?;
    let cfg_path = cluster.ssh_config.clone().or_else(|| home().map(|h| h.join(".ssh/config")));
    let entry = cfg_path
        .as_deref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|t| parse_ssh_config(&t, &alias))
        .unwrap_or_default();
    let host = entry.host_name.clone().unwrap_or_else(|| alias.clone());
    let port = cluster.port.or(entry.port).unwrap_or(22);
    let user = cluster
        .user
        .clone()
        .or(entry.user.clone())
        .or_else(|| std::env::var("USER").ok())
        .ok_or_else(|| TransportError::Other(format!("no SSH user for `{alias}`: set `user` in the clusters file")))?;
    let mut identity_files: Vec<PathBuf> = cluster.identity_file.iter().cloned().collect();
    identity_files.extend(entry.identity_files.iter().map(|p| expand_path(p, &host, &user, port)));
    let explicit_identity = !identity_files.is_empty();
    if !explicit_identity {
        if let Some(h) = home() {
            identity_files = ["id_ed25519", "id_ecdsa", "id_rsa"].iter().map(|n| h.join(".ssh").join(n)).collect();
        }
    }
    let known_hosts = match &cluster.known_hosts {
        Some(k) => vec![k.clone()],
        None if !entry.known_hosts.is_empty() => {
            entry.known_hosts.iter().map(|p| expand_path(p, &host, &user, port)).collect()
        }
        None => home().map(|h| vec![h.join(".ssh/known_hosts")]).unwrap_or_default(),
    };
    Ok(SshTarget { alias, host, port, user, identity_files, explicit_identity, known_hosts })
}

struct Conn {
    session: Session,
    sftp: Option<ssh2::Sftp>,
    home: Option<String>,
}

pub struct SshShell {
    target: SshTarget,
    conn: Mutex<Option<Conn>>,
    counters: Counters,
    /// How long to keep trying to reconnect a dropped session.
    reconnect_for: Duration,
}

/// An ssh2 error from a live session: the connection is suspect; drop it.
fn session_err(target: &SshTarget, what: &str, e: ssh2::Error) -> TransportError {
    TransportError::Connect { target: target.label(), message: format!("{what}: {e}") }
}

fn is_permanent(e: &TransportError) -> bool {
    matches!(e, TransportError::HostKey(_) | TransportError::Auth { .. })
}

impl SshShell {
    pub fn new(_name: &str, cluster: &ClusterConfig) -> Result<Self, TransportError> {
        let target = resolve_target(cluster)?;
        Ok(Self::with_target(target))
    }

    pub fn with_target(target: SshTarget) -> Self {
        let secs = std::env::var("SWEEP_SSH_RECONNECT_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
        SshShell { target, conn: Mutex::new(None), counters: Counters::default(), reconnect_for: Duration::from_secs(secs) }
    }

    pub fn target(&self) -> &SshTarget {
        &self.target
    }

    /// Opens, verifies and authenticates a session.
    pub fn connect(&self) -> Result<Session, TransportError> {
        let t = &self.target;
        let cerr = |m: String| TransportError::Connect { target: t.label(), message: m };
        let addr = (t.host.as_str(), t.port)
            .to_socket_addrs()
            .map_err(|e| cerr(format!("cannot resolve: {e}")))?
            .next()
            .ok_or_else(|| cerr("no address".into()))?;
        let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(15)).map_err(|e| cerr(e.to_string()))?;
        let mut s = Session::new().map_err(|e| cerr(e.to_string()))?;
        s.set_tcp_stream(tcp);
        s.set_timeout(120_000);
        s.handshake().map_err(|e| cerr(format!("SSH handshake: {e}")))?;
        self.verify_host_key(&s)?;
        self.authenticate(&s)?;
        s.set_keepalive(true, 15);
        self.counters.connects.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(target = %t.label(), "SSH connected");
        Ok(s)
    }

    fn verify_host_key(&self, s: &Session) -> Result<(), TransportError> {
        let t = &self.target;
        let (key, kind) = s.host_key().ok_or_else(|| TransportError::HostKey(format!("{}: server sent no host key", t.label())))?;
        let fp = s
            .host_key_hash(ssh2::HashType::Sha256)
            .map(|h| format!("SHA256:{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(h)))
            .unwrap_or_else(|| "(no fingerprint)".into());
        let kind = format!("{kind:?}");
        let shown = if t.port == 22 { t.host.clone() } else { format!("[{}]:{}", t.host, t.port) };
        let mut kh = s.known_hosts().map_err(|e| TransportError::HostKey(format!("cannot check host keys: {e}")))?;
        let mut read_any = false;
        for f in &t.known_hosts {
            if f.exists() {
                kh.read_file(f, KnownHostFileKind::OpenSSH).map_err(|e| {
                    TransportError::HostKey(format!("cannot read known_hosts {}: {e}; refusing to connect to {shown}", f.display()))
                })?;
                read_any = true;
            }
        }
        let files = t.known_hosts.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
        match kh.check_port(&t.host, t.port, key) {
            CheckResult::Match => Ok(()),
            CheckResult::Mismatch => Err(TransportError::HostKey(format!(
                "HOST KEY CHANGED for {shown}: the server presented {kind} key {fp}, which differs from the key \
                 recorded in {files}. This can mean a man-in-the-middle attack, or a reinstalled server. \
                 Refusing to connect. If the cluster admins confirm the new key, remove the old line \
                 (ssh-keygen -R '{shown}') and connect once with ssh to record the new one."
            ))),
            CheckResult::NotFound => Err(TransportError::HostKey(format!(
                "UNKNOWN HOST KEY for {shown}: {kind} key {fp} is not in {}. Refusing to connect to a host \
                 that cannot be verified. Check the fingerprint with the cluster admins, then connect once \
                 with `ssh -p {} {}` to record it (or add it to known_hosts yourself).",
                if read_any { files.clone() } else { format!("{files} (no such file)") },
                t.port,
                t.host
            ))),
            CheckResult::Failure => {
                Err(TransportError::HostKey(format!("cannot verify the host key of {shown}; refusing to connect")))
            }
        }
    }

    fn authenticate(&self, s: &Session) -> Result<(), TransportError> {
        let t = &self.target;
        let mut tried = Vec::new();
        let try_files = |files: &[PathBuf], tried: &mut Vec<String>| {
            for f in files {
                if !f.exists() {
                    continue;
                }
                match s.userauth_pubkey_file(&t.user, None, f, None) {
                    Ok(()) if s.authenticated() => return true,
                    Ok(()) => tried.push(format!("{}: rejected", f.display())),
                    Err(e) => tried.push(format!("{}: {e}", f.display())),
                }
            }
            false
        };
        if t.explicit_identity && try_files(&t.identity_files, &mut tried) {
            return Ok(());
        }
        if std::env::var_os("SSH_AUTH_SOCK").is_some() {
            match s.userauth_agent(&t.user) {
                Ok(()) if s.authenticated() => return Ok(()),
                Ok(()) => tried.push("ssh-agent: no key accepted".into()),
                Err(e) => tried.push(format!("ssh-agent: {e}")),
            }
        }
        if !t.explicit_identity && try_files(&t.identity_files, &mut tried) {
            return Ok(());
        }
        Err(TransportError::Auth {
            target: t.label(),
            message: if tried.is_empty() {
                "no key file found and no ssh-agent (set identity_file, IdentityFile in ~/.ssh/config, or start ssh-agent)".into()
            } else {
                tried.join("; ")
            },
        })
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
                    Ok(session) => *guard = Some(Conn { session, sftp: None, home: None }),
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
                        return Err(TransportError::Uncertain { target: self.target.label(), command: what.to_string() });
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
            let s = conn.session.sftp().map_err(|e| OpError::Dropped(session_err(&self.target, "SFTP", e)))?;
            conn.sftp = Some(s);
        }
        Ok(conn.sftp.as_ref().expect("set above"))
    }

    fn home_dir(&self, conn: &mut Conn) -> Result<String, OpError> {
        if let Some(h) = &conn.home {
            return Ok(h.clone());
        }
        let sftp = self.sftp(conn)?;
        let h = sftp.realpath(Path::new(".")).map_err(|e| OpError::Dropped(session_err(&self.target, "realpath .", e)))?;
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
            let mut ch = conn.session.channel_session().map_err(drop)?;
            ch.exec(&command).map_err(drop)?;
            let mut stdout = Vec::new();
            ch.read_to_end(&mut stdout).map_err(|e| OpError::Dropped(TransportError::Connect {
                target: self.target.label(),
                message: format!("{what}: reading output: {e}"),
            }))?;
            let mut stderr = Vec::new();
            ch.stderr().read_to_end(&mut stderr).map_err(|e| OpError::Dropped(TransportError::Connect {
                target: self.target.label(),
                message: format!("{what}: reading errors: {e}"),
            }))?;
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
                    OpError::Final(TransportError::File { target: target.clone(), path: p.into(), message: e.to_string() })
                } else {
                    OpError::Dropped(session_err(&self.target, "SFTP", e))
                }
            };
            // mkdir -p, ignoring "exists".
            let p = Path::new(&path);
            let mut dirs: Vec<&Path> = p.ancestors().skip(1).take_while(|d| !d.as_os_str().is_empty() && *d != Path::new("/")).collect();
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
                    .open_mode(Path::new(&tmp), ssh2::OpenFlags::WRITE | ssh2::OpenFlags::CREATE | ssh2::OpenFlags::TRUNCATE, mode, ssh2::OpenType::File)
                    .map_err(|e| ferr(e, &tmp))?;
                f.write_all(data).map_err(|e| OpError::Dropped(TransportError::Connect { target: target.clone(), message: format!("SFTP write {tmp}: {e}") }))?;
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
                    return Err(OpError::Final(TransportError::File { target, path: path.clone(), message: e.to_string() }))
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

    const CONFIG: &str = "\
# comment
Host idun idun-login
    HostName idun-login1.hpc.ntnu.no
    User alice
    IdentityFile ~/.ssh/id_idun

Host *.internal !bastion.internal
    Port 2222

Host *
    User nobody
    Port 22
    IdentityFile ~/.ssh/id_default
";

    #[test]
    fn ssh_config_first_value_wins() {
        let e = parse_ssh_config(CONFIG, "idun");
        assert_eq!(e.host_name.as_deref(), Some("idun-login1.hpc.ntnu.no"));
        assert_eq!(e.user.as_deref(), Some("alice"));
        assert_eq!(e.port, Some(22));
        assert_eq!(e.identity_files, vec!["~/.ssh/id_idun".to_string(), "~/.ssh/id_default".to_string()]);
        let e = parse_ssh_config(CONFIG, "db.internal");
        assert_eq!(e.port, Some(2222));
        assert_eq!(e.user.as_deref(), Some("nobody"));
        let e = parse_ssh_config(CONFIG, "bastion.internal");
        assert_eq!(e.port, Some(22), "negated pattern excludes");
    }

    #[test]
    fn globs() {
        assert!(glob("*.example.org", "a.example.org"));
        assert!(glob("node??", "node12"));
        assert!(!glob("node??", "node123"));
        assert!(glob("*", ""));
    }

    #[test]
    fn target_from_clusters_file_overrides_ssh_config() {
        let d = tempfile::tempdir().expect("tempdir");
        let cfg = d.path().join("config");
        std::fs::write(&cfg, CONFIG).expect("write");
        let mut c = ClusterConfig::local();
        c.transport = crate::cluster::TransportKind::Ssh;
        c.host = Some("idun".into());
        c.ssh_config = Some(cfg);
        c.port = Some(2200);
        let t = resolve_target(&c).expect("resolves");
        assert_eq!(t.host, "idun-login1.hpc.ntnu.no");
        assert_eq!(t.port, 2200);
        assert_eq!(t.user, "alice");
        assert!(t.explicit_identity);
        assert!(t.identity_files[0].ends_with(".ssh/id_idun"));
    }
}
