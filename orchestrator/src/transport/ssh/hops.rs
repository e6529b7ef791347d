//! From a cluster's `host` to the chain of SSH hops that reaches it.
//!
//! The clusters file's `port`, `user`, `identity_file` and `known_hosts`
//! override the ssh config for the target itself; every hop's other settings
//! come from the ssh config evaluated for that hop's own name, as OpenSSH does
//! for `ProxyJump` (`ProxyJump a,b`: `a` with its own proxy settings, `b`
//! reached through `a`, the target through `b`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use super::config::{expand_percent_h, ConfigFile, HostSettings, JumpHost, Loc, Proxy};
use super::home_dir;
use crate::cluster::ClusterConfig;
use crate::transport::TransportError;

/// A target and the hops before it (first: the one this machine connects to).
#[derive(Debug, Clone, PartialEq)]
pub struct SshTarget {
    /// The name the cluster gave (`host:`).
    pub alias: String,
    /// Bastions first, the target last; never empty.
    pub hops: Vec<Hop>,
}

/// One SSH server on the way, with everything needed to reach and trust it.
#[derive(Debug, Clone, PartialEq)]
pub struct Hop {
    /// The name this hop was asked for (a config alias or a ProxyJump host).
    pub alias: String,
    /// Where to connect (HostName), resolved by this machine for the first hop
    /// and by the previous hop for the others.
    pub host: String,
    pub port: u16,
    pub user: String,
    pub identity_files: Vec<PathBuf>,
    /// Whether `identity_files` came from configuration (else: the defaults).
    pub explicit_identity: bool,
    /// `IdentitiesOnly yes`: never ask ssh-agent.
    pub identities_only: bool,
    pub known_hosts: Vec<PathBuf>,
    /// `HostKeyAlias`: the name to look the host key up under.
    pub host_key_alias: Option<String>,
    pub keepalive: Keepalive,
    pub connect_timeout: Duration,
    pub via: Via,
}

/// How a hop's connection is carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// TCP from this machine.
    Direct,
    /// stdin/stdout of this `sh -c` command (tokens expanded).
    Command(String),
    /// A `direct-tcpip` channel of the previous hop's session.
    Jump,
}

/// `ServerAliveInterval` (0: off) and `ServerAliveCountMax`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    pub interval: u32,
    pub count_max: u32,
}

/// Without `ServerAliveInterval` the orchestrator still sends keepalives, so
/// an idle session between `status --watch` polls survives NAT and firewalls.
pub const DEFAULT_KEEPALIVE: Keepalive = Keepalive { interval: 15, count_max: 3 };
const DEFAULT_CONNECT_TIMEOUT: u32 = 15;
/// A longer chain is almost certainly a ProxyJump loop.
const MAX_HOPS: usize = 8;

impl Hop {
    /// `user@host[:port]`.
    pub fn label(&self) -> String {
        if self.port == 22 {
            format!("{}@{}", self.user, self.host)
        } else {
            format!("{}@{}:{}", self.user, self.host, self.port)
        }
    }
}

impl SshTarget {
    pub fn target(&self) -> &Hop {
        self.hops.last().expect("a target has at least one hop")
    }

    /// The target as messages name it, with the bastions it is reached through.
    pub fn label(&self) -> String {
        let t = self.target().label();
        if self.hops.len() == 1 {
            return t;
        }
        let via: Vec<String> = self.hops[..self.hops.len() - 1].iter().map(Hop::label).collect();
        format!("{t} via {}", via.join(", "))
    }

    /// Hop `i` as error messages name it: "bastion me@b:2222 (ProxyJump for node)".
    pub fn role(&self, i: usize) -> String {
        let hop = &self.hops[i];
        let how = match &hop.via {
            Via::Command(c) => format!(" through ProxyCommand `{c}`"),
            _ => String::new(),
        };
        if i + 1 == self.hops.len() {
            return format!("{}{how}", self.label());
        }
        format!("bastion {}{how} (ProxyJump for {})", hop.label(), self.hops[i + 1].alias)
    }
}

/// What the clusters file (or a ProxyJump spec) says over the ssh config.
#[derive(Default)]
struct Overrides {
    user: Option<String>,
    port: Option<u16>,
    identity_file: Option<PathBuf>,
    known_hosts: Option<PathBuf>,
}

struct Ctx {
    cfg: ConfigFile,
    local_user: String,
}

/// Resolves a cluster's SSH settings: clusters file first, then its
/// `ssh_config` (default `~/.ssh/config`; absent is fine for the default).
pub fn resolve_target(cluster: &ClusterConfig) -> Result<SshTarget, TransportError> {
    let alias = cluster.host.clone().ok_or_else(|| TransportError::Other("ssh cluster without `host`".into()))?;
    let ssh_dir = home_dir().map(|h| h.join(".ssh"));
    let includes_from = ssh_dir.clone().unwrap_or_else(|| PathBuf::from("/nonexistent"));
    let cfg = match (&cluster.ssh_config, &ssh_dir) {
        (Some(p), _) => ConfigFile::load(p, &includes_from)?,
        (None, Some(d)) if d.join("config").exists() => ConfigFile::load(&d.join("config"), d)?,
        (None, _) => ConfigFile::default(),
    };
    let local_user = local_user_name();
    let ctx = Ctx { cfg, local_user };
    let over = Overrides {
        user: cluster.user.clone(),
        port: cluster.port,
        identity_file: cluster.identity_file.clone(),
        known_hosts: cluster.known_hosts.clone(),
    };
    let hops = chain(&ctx, &alias, &over, None, 0)?;
    if hops.len() > MAX_HOPS {
        return Err(TransportError::Other(format!(
            "`{alias}`: its ProxyJump chain has more than {MAX_HOPS} hops (a loop in the ssh config?)"
        )));
    }
    Ok(SshTarget { alias, hops })
}

fn chain(
    ctx: &Ctx,
    alias: &str,
    over: &Overrides,
    proxy: Option<Proxy>,
    depth: usize,
) -> Result<Vec<Hop>, TransportError> {
    if depth > MAX_HOPS {
        return Err(TransportError::Other(format!(
            "ProxyJump to `{alias}` nests more than {MAX_HOPS} deep (a loop in the ssh config?)"
        )));
    }
    let s = ctx.cfg.resolve(alias, &ctx.local_user)?;
    warn_unhonoured(&s);
    let (proxy, loc) = match (proxy, s.proxy.clone()) {
        (Some(p), _) => (p, None),
        (None, Some((p, loc))) => (p, Some(loc)),
        (None, None) => (Proxy::None, None),
    };
    let mut hop = build_hop(ctx, alias, &s, over)?;
    match proxy {
        Proxy::None => Ok(vec![hop]),
        Proxy::Command(c) => {
            let loc = loc.expect("a configured ProxyCommand has a location");
            hop.via = Via::Command(expand_command(&c, &hop, &ctx.local_user, &loc)?);
            Ok(vec![hop])
        }
        Proxy::Jump(list) => {
            let jump_over = |j: &JumpHost| Overrides { user: j.user.clone(), port: j.port, ..Overrides::default() };
            let (first, rest) = list.split_first().expect("ProxyJump parses to at least one host");
            let mut hops = chain(ctx, &first.host, &jump_over(first), None, depth + 1)?;
            for j in rest {
                // Later hosts of a list are reached through the one before,
                // whatever their own config says (as `ssh -J a b`).
                let mut h = chain(ctx, &j.host, &jump_over(j), Some(Proxy::None), depth + 1)?;
                let mut h = h.pop().expect("one hop");
                h.via = Via::Jump;
                hops.push(h);
            }
            hop.via = Via::Jump;
            hops.push(hop);
            Ok(hops)
        }
    }
}

fn build_hop(ctx: &Ctx, alias: &str, s: &HostSettings, over: &Overrides) -> Result<Hop, TransportError> {
    let host = s.host_name.as_deref().map(|h| expand_percent_h(h, alias)).unwrap_or_else(|| alias.to_string());
    let port = over.port.or(s.port).unwrap_or(22);
    let user = over.user.clone().or_else(|| s.user.clone()).unwrap_or_else(|| ctx.local_user.clone());
    if user.is_empty() {
        return Err(TransportError::Other(format!(
            "no SSH user for `{alias}`: set `user` in the clusters file or User in the ssh config"
        )));
    }
    let mut hop = Hop {
        alias: alias.to_string(),
        host,
        port,
        user,
        identity_files: Vec::new(),
        explicit_identity: false,
        identities_only: s.identities_only.unwrap_or(false),
        known_hosts: Vec::new(),
        host_key_alias: s.host_key_alias.clone(),
        keepalive: Keepalive {
            interval: s.server_alive_interval.unwrap_or(DEFAULT_KEEPALIVE.interval),
            count_max: s.server_alive_count_max.unwrap_or(DEFAULT_KEEPALIVE.count_max),
        },
        connect_timeout: Duration::from_secs(u64::from(s.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT).max(1))),
        via: Via::Direct,
    };
    let home = home_dir().unwrap_or_default();
    let ids = identity_files(ctx, s, over, &hop)?;
    hop.explicit_identity = !ids.is_empty();
    hop.identity_files = if ids.is_empty() {
        ["id_ed25519", "id_ecdsa", "id_rsa"].iter().map(|n| home.join(".ssh").join(n)).collect()
    } else {
        ids
    };
    hop.known_hosts = match &over.known_hosts {
        Some(k) => vec![k.clone()],
        None => known_hosts_files(ctx, s, &hop, &home)?,
    };
    Ok(hop)
}

/// The identity files named by the clusters file and the ssh config, in that
/// order, tokens expanded; a file named twice is offered once, as OpenSSH does.
fn identity_files(ctx: &Ctx, s: &HostSettings, over: &Overrides, hop: &Hop) -> Result<Vec<PathBuf>, TransportError> {
    let mut ids: Vec<PathBuf> = over.identity_file.iter().cloned().collect();
    for (f, loc) in &s.identity_files {
        let f = PathBuf::from(expand_tokens(f, hop, &ctx.local_user, "IdentityFile", loc, false)?);
        if !ids.contains(&f) {
            ids.push(f);
        }
    }
    Ok(ids)
}

/// The user's then the global known_hosts files: as configured (tokens
/// expanded), or OpenSSH's defaults for either list not configured.
fn known_hosts_files(ctx: &Ctx, s: &HostSettings, hop: &Hop, home: &Path) -> Result<Vec<PathBuf>, TransportError> {
    let configured = |directive: &str, (list, loc): &(Vec<String>, Loc)| -> Result<Vec<PathBuf>, TransportError> {
        list.iter().map(|f| Ok(PathBuf::from(expand_tokens(f, hop, &ctx.local_user, directive, loc, false)?))).collect()
    };
    let mut files = match &s.user_known_hosts {
        Some(user) => configured("UserKnownHostsFile", user)?,
        None => ["known_hosts", "known_hosts2"].iter().map(|n| home.join(".ssh").join(n)).collect(),
    };
    match &s.global_known_hosts {
        Some(global) => files.extend(configured("GlobalKnownHostsFile", global)?),
        None => files.extend(["/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"].iter().map(PathBuf::from)),
    }
    Ok(files)
}

/// ProxyCommand tokens (`%h %p %r %n` and the path ones), each substituted
/// value checked to be a plain word: the command goes to `sh -c`.
fn expand_command(cmd: &str, hop: &Hop, local_user: &str, loc: &Loc) -> Result<String, TransportError> {
    expand_tokens(cmd, hop, local_user, "ProxyCommand", loc, true)
}

/// `~/` and ssh_config's `%` tokens: `%%`, `%d` home, `%h` host, `%i` uid,
/// `%k` host key alias, `%L`/`%l` local host name, `%n` the name asked for,
/// `%p` port, `%r` remote user, `%u` local user.
fn expand_tokens(
    v: &str,
    hop: &Hop,
    local_user: &str,
    directive: &str,
    loc: &Loc,
    for_shell: bool,
) -> Result<String, TransportError> {
    let err = |m: String| {
        TransportError::SshConfig(super::config::ConfigError { loc: loc.clone(), message: format!("{directive}: {m}") })
    };
    let home = home_dir().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
    let mut out = String::new();
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let t = chars.next().ok_or_else(|| err(format!("`{v}` ends with a lone %")))?;
        let value = match t {
            '%' => "%".to_string(),
            'd' => home.clone(),
            'h' => hop.host.clone(),
            'i' => local_uid().to_string(),
            'k' => hop.host_key_alias.clone().unwrap_or_else(|| hop.host.clone()),
            'L' => local_host_name().split('.').next().unwrap_or_default().to_string(),
            'l' => local_host_name(),
            'n' => hop.alias.clone(),
            'p' => hop.port.to_string(),
            'r' => hop.user.clone(),
            'u' => local_user.to_string(),
            other => return Err(err(format!("unknown token %{other} in `{v}`"))),
        };
        if for_shell && t != '%' && !value.chars().all(|c| c.is_ascii_alphanumeric() || "._:@+/=,-".contains(c)) {
            return Err(err(format!(
                "%{t} expands to `{value}`, which is not a plain host, user or port word; refusing to put it in a shell command"
            )));
        }
        out.push_str(&value);
    }
    Ok(match out.strip_prefix("~/") {
        Some(rest) if !for_shell => format!("{}/{rest}", home.trim_end_matches('/')),
        _ => out,
    })
}

fn local_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// `$USER`, else the password database's name for this uid.
fn local_user_name() -> String {
    if let Ok(u) = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")) {
        if !u.is_empty() {
            return u;
        }
    }
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: every pointer is valid for the call; `result` is null or points at `pw`.
    let rc = unsafe { libc::getpwuid_r(local_uid(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc != 0 || result.is_null() || pw.pw_name.is_null() {
        return String::new();
    }
    // SAFETY: on success pw_name points at a NUL-terminated string inside `buf`.
    unsafe { std::ffi::CStr::from_ptr(pw.pw_name) }.to_string_lossy().into_owned()
}

fn local_host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Each unhonoured directive is warned about once per process.
fn warn_unhonoured(s: &HostSettings) {
    for (loc, keyword, why) in &s.unhonoured {
        if first_time(keyword) {
            tracing::warn!("ssh config {loc}: `{keyword}` ignored: {why}");
        }
    }
}

fn first_time(keyword: &str) -> bool {
    static SEEN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    SEEN.lock().unwrap_or_else(|p| p.into_inner()).insert(keyword.to_ascii_lowercase())
}

#[cfg(test)]
#[path = "hops_tests.rs"]
mod tests;
