//! Opening a session over a chain of hops: connect (TCP, ProxyCommand, or a
//! `direct-tcpip` channel of the previous hop), handshake, verify the host key
//! against known_hosts, authenticate: for every hop, bastions included.
//! Errors name the hop that failed.

use base64::Engine;
use ssh2::{CheckResult, KnownHostFileKind, Session};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use super::hops::{Hop, Keepalive, SshTarget, Via};
use super::link::{Health, Link};
use crate::transport::TransportError;

/// A live session to the target and what keeps it alive.
pub struct Connection {
    pub session: Session,
    /// Dropping it stops the keepalive thread.
    _keepalive: Option<mpsc::Sender<()>>,
}

/// How long one command may wait on a silent server.
const SESSION_TIMEOUT_MS: u32 = 120_000;

fn connect_err(target: &SshTarget, i: usize, message: String) -> TransportError {
    TransportError::Connect { target: target.role(i), message }
}

/// Opens, verifies and authenticates every hop of `target`.
pub fn open(target: &SshTarget) -> Result<Connection, TransportError> {
    let mut prev: Option<(Session, RawFd, Arc<Health>)> = None;
    for (i, hop) in target.hops.iter().enumerate() {
        let link = match (&hop.via, prev.take()) {
            (Via::Direct, _) => tcp(target, i)?,
            (Via::Command(c), _) => {
                Link::command(c).map_err(|e| connect_err(target, i, format!("cannot start the ProxyCommand: {e}")))?
            }
            (Via::Jump, Some((bastion, fd, health))) => {
                let b = i - 1;
                bastion.set_timeout(millis(hop.connect_timeout));
                let ch = bastion.channel_direct_tcpip(&hop.host, hop.port, None).map_err(|e| {
                    connect_err(target, b, format!("it could not open a connection to {}:{}: {e}", hop.host, hop.port))
                })?;
                Link::channel(bastion, ch, fd, health, target.hops[b].keepalive)
                    .map_err(|e| connect_err(target, b, format!("cannot start the forwarding thread: {e}")))?
            }
            (Via::Jump, None) => {
                return Err(TransportError::Other(format!("{}: ProxyJump without a bastion", target.role(i))))
            }
        };
        let (session, fd) = handshake(target, i, &link)?;
        prev = Some((session, fd, link.health.clone()));
    }
    let (session, _, health) = prev.ok_or_else(|| TransportError::Other("no SSH hop to connect to".into()))?;
    session.set_timeout(SESSION_TIMEOUT_MS);
    let keepalive = spawn_keepalive(&session, health, target.target().keepalive, target.label());
    Ok(Connection { session, _keepalive: keepalive })
}

fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// TCP to the first hop. A name that does not resolve fails at once
/// ([`TransportError::Resolve`], never retried); each address is tried in turn.
fn tcp(target: &SshTarget, i: usize) -> Result<Link, TransportError> {
    let hop = &target.hops[i];
    let resolve_err =
        |message: String| TransportError::Resolve { target: target.role(i), host: hop.host.clone(), message };
    let addrs: Vec<SocketAddr> =
        (hop.host.as_str(), hop.port).to_socket_addrs().map_err(|e| resolve_err(e.to_string()))?.collect();
    if addrs.is_empty() {
        return Err(resolve_err("no address".into()));
    }
    let mut last = String::new();
    for a in &addrs {
        match TcpStream::connect_timeout(a, hop.connect_timeout) {
            Ok(t) => {
                return Link::tcp(t).map_err(|e| connect_err(target, i, format!("cannot start the link thread: {e}")))
            }
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                last = format!("{a}: no answer within {} s (ConnectTimeout)", hop.connect_timeout.as_secs())
            }
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    Err(connect_err(target, i, last))
}

/// The session and the socket it owns (the channel pump of the next hop polls it).
fn handshake(target: &SshTarget, i: usize, link: &Link) -> Result<(Session, RawFd), TransportError> {
    let hop = &target.hops[i];
    let err = |m: String| connect_err(target, i, m);
    let stream = link.stream.try_clone().map_err(|e| err(e.to_string()))?;
    let fd = stream.as_raw_fd();
    let mut s = Session::new().map_err(|e| err(e.to_string()))?;
    s.set_tcp_stream(stream);
    s.set_timeout(millis(hop.connect_timeout.max(Duration::from_secs(30))));
    if let Err(e) = s.handshake() {
        let mut m = format!("SSH handshake: {e}");
        if let Some(t) = link.stderr_tail() {
            m.push_str(&format!("; the ProxyCommand said: {t}"));
        }
        return Err(err(m));
    }
    verify_host_key(&s, hop, &target.role(i))?;
    authenticate(&s, hop, &target.role(i))?;
    s.set_keepalive(true, hop.keepalive.interval);
    tracing::debug!(hop = %target.role(i), "SSH hop connected");
    Ok((s, fd))
}

fn verify_host_key(s: &Session, hop: &Hop, role: &str) -> Result<(), TransportError> {
    let (key, kind) =
        s.host_key().ok_or_else(|| TransportError::HostKey(format!("{role}: server sent no host key")))?;
    let fp = s
        .host_key_hash(ssh2::HashType::Sha256)
        .map(|h| format!("SHA256:{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(h)))
        .unwrap_or_else(|| "(no fingerprint)".into());
    let kind = format!("{kind:?}");
    // HostKeyAlias replaces host and port in the lookup, as in OpenSSH.
    let (name, port) = match &hop.host_key_alias {
        Some(a) => (a.clone(), 22),
        None => (hop.host.clone(), hop.port),
    };
    let shown = if port == 22 { name.clone() } else { format!("[{name}]:{port}") };
    let mut kh = s.known_hosts().map_err(|e| TransportError::HostKey(format!("cannot check host keys: {e}")))?;
    let mut read_any = false;
    for f in &hop.known_hosts {
        if f.exists() {
            kh.read_file(f, KnownHostFileKind::OpenSSH).map_err(|e| {
                TransportError::HostKey(format!(
                    "cannot read known_hosts {}: {e}; refusing to connect to {shown}",
                    f.display()
                ))
            })?;
            read_any = true;
        }
    }
    let files = hop.known_hosts.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
    let whose = if role.starts_with("bastion") { format!(" (the {role})") } else { String::new() };
    match kh.check_port(&name, port, key) {
        CheckResult::Match => Ok(()),
        CheckResult::Mismatch => Err(TransportError::HostKey(format!(
            "HOST KEY CHANGED for {shown}{whose}: the server presented {kind} key {fp}, which differs from the key \
             recorded in {files}. This can mean a man-in-the-middle attack, or a reinstalled server. \
             Refusing to connect. If the cluster admins confirm the new key, remove the old line \
             (ssh-keygen -R '{shown}') and connect once with ssh to record the new one."
        ))),
        CheckResult::NotFound => Err(TransportError::HostKey(format!(
            "UNKNOWN HOST KEY for {shown}{whose}: {kind} key {fp} is not in {}. Refusing to connect to a host \
             that cannot be verified. Check the fingerprint with the cluster admins, then connect once \
             with `ssh -p {} {}` to record it (or add it to known_hosts yourself).",
            if read_any { files.clone() } else { format!("{files} (no such file)") },
            hop.port,
            hop.host
        ))),
        CheckResult::Failure => {
            Err(TransportError::HostKey(format!("cannot verify the host key of {shown}{whose}; refusing to connect")))
        }
    }
}

/// Configured key files, then ssh-agent (unless `IdentitiesOnly`), then the default files.
fn authenticate(s: &Session, hop: &Hop, role: &str) -> Result<(), TransportError> {
    let mut tried = Vec::new();
    let try_files = |files: &[PathBuf], tried: &mut Vec<String>| {
        for f in files {
            if !f.exists() {
                continue;
            }
            match s.userauth_pubkey_file(&hop.user, None, f, None) {
                Ok(()) if s.authenticated() => return true,
                Ok(()) => tried.push(format!("{}: rejected", f.display())),
                Err(e) => tried.push(format!("{}: {e}", f.display())),
            }
        }
        false
    };
    if hop.explicit_identity && try_files(&hop.identity_files, &mut tried) {
        return Ok(());
    }
    if !hop.identities_only && std::env::var_os("SSH_AUTH_SOCK").is_some() {
        match s.userauth_agent(&hop.user) {
            Ok(()) if s.authenticated() => return Ok(()),
            Ok(()) => tried.push("ssh-agent: no key accepted".into()),
            Err(e) => tried.push(format!("ssh-agent: {e}")),
        }
    }
    if !hop.explicit_identity && try_files(&hop.identity_files, &mut tried) {
        return Ok(());
    }
    Err(TransportError::Auth {
        target: role.to_string(),
        message: if tried.is_empty() {
            "no key file found and no ssh-agent (set identity_file, IdentityFile in ~/.ssh/config, or start ssh-agent)"
                .into()
        } else {
            tried.join("; ")
        },
    })
}

/// ServerAliveInterval: a keepalive every `interval` s while the session is
/// idle; `count_max` unanswered ones close the link (the next command then
/// reconnects). A command in flight holds the session, so none are sent then
/// (the session timeout bounds that wait instead).
fn spawn_keepalive(session: &Session, health: Arc<Health>, ka: Keepalive, label: String) -> Option<mpsc::Sender<()>> {
    if ka.interval == 0 {
        return None;
    }
    let (tx, rx) = mpsc::channel::<()>();
    let s = session.clone();
    let every = Duration::from_secs(u64::from(ka.interval));
    std::thread::Builder::new()
        .name("ssh-keepalive".into())
        .spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(every) {
                if health.killed() {
                    break;
                }
                if !health.may_send_keepalive(ka) {
                    tracing::warn!(target = %label, "no answer to {} keepalives in {} s; dropping the connection", ka.count_max, ka.count_max * ka.interval);
                    break;
                }
                // libssh2 sends only when `interval` passed since its last one;
                // it then reports a full interval to the next.
                if let Ok(next) = s.keepalive_send() {
                    if next >= ka.interval.max(2) {
                        health.keepalive_sent();
                    }
                }
            }
        })
        .ok()?;
    Some(tx)
}
