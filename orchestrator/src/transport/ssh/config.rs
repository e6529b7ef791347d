//! ssh_config(5) as OpenSSH reads it, for the hosts the orchestrator connects to.
//!
//! Hand-written because the crates.io parsers do not fit: `ssh2-config` 0.9
//! has no `Match` and keeps `ProxyCommand`, `UserKnownHostsFile`,
//! `IdentitiesOnly` and `ServerAliveCountMax` only as unparsed strings;
//! `ssh_config` 0.1 has neither `Include` nor `Match`.
//!
//! A file (with its `Include`s) is parsed once, then evaluated per host name
//! the way `ssh -G` does: a block applies when its `Host` patterns or `Match`
//! criteria hold, the first value of each directive wins (`IdentityFile`
//! accumulates), `Include` inside a block applies only when the block does.
//! Directives the orchestrator does not act on are returned in
//! [`HostSettings::unhonoured`] so the caller can warn about each once.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A malformed line, named by file and line.
#[derive(Debug, thiserror::Error)]
#[error("ssh config {loc}: {message}")]
pub struct ConfigError {
    pub loc: Loc,
    pub message: String,
}

/// Where a directive was written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Loc {
    pub file: Arc<Path>,
    pub line: usize,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            0 => write!(f, "{}", self.file.display()),
            n => write!(f, "{}:{n}", self.file.display()),
        }
    }
}

/// How the connection to a host is carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proxy {
    /// `ProxyJump none` / `ProxyCommand none`: a direct TCP connection.
    None,
    /// Through these SSH hosts, in order (`ProxyJump a,b`).
    Jump(Vec<JumpHost>),
    /// A command whose stdin/stdout carry the connection (tokens not yet expanded).
    Command(String),
}

/// One `[user@]host[:port]` (or `ssh://[user@]host[:port]`) of a `ProxyJump`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JumpHost {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
}

/// What the configuration says about one host (tokens not yet expanded).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostSettings {
    pub host_name: Option<String>,
    pub port: Option<u16>,
    pub user: Option<String>,
    pub identity_files: Vec<(String, Loc)>,
    pub identities_only: Option<bool>,
    pub user_known_hosts: Option<(Vec<String>, Loc)>,
    pub global_known_hosts: Option<(Vec<String>, Loc)>,
    pub host_key_alias: Option<String>,
    pub proxy: Option<(Proxy, Loc)>,
    pub server_alive_interval: Option<u32>,
    pub server_alive_count_max: Option<u32>,
    pub connect_timeout: Option<u32>,
    /// Directives (or `Match` criteria) that applied but are not acted on:
    /// where, the keyword as written, and why.
    pub unhonoured: Vec<(Loc, String, &'static str)>,
}

#[derive(Debug, Clone)]
enum Item {
    Host(Vec<String>),
    Match(Vec<Criterion>),
    Include(Vec<ConfigFile>),
    Directive { keyword: String, args: Vec<String>, rest: String },
}

#[derive(Debug, Clone)]
struct Criterion {
    negated: bool,
    kind: CriterionKind,
}

#[derive(Debug, Clone)]
enum CriterionKind {
    All,
    Host(String),
    OriginalHost(String),
    User(String),
    LocalUser(String),
    /// `exec`, `canonical`, `final`, `localnetwork`, `tagged`, …: never holds.
    Unsupported(String),
}

/// A parsed configuration file with its includes.
#[derive(Debug, Clone, Default)]
pub struct ConfigFile {
    entries: Vec<(Loc, Item)>,
}

/// OpenSSH's limit on nested `Include`s.
const MAX_DEPTH: usize = 16;

impl ConfigFile {
    /// Reads and parses `path`; relative `Include` paths are taken from `ssh_dir`
    /// (`~/.ssh`, as OpenSSH does for user configuration files).
    pub fn load(path: &Path, ssh_dir: &Path) -> Result<Self, ConfigError> {
        Self::load_depth(path, ssh_dir, 0)
    }

    fn load_depth(path: &Path, ssh_dir: &Path, depth: usize) -> Result<Self, ConfigError> {
        let file: Arc<Path> = Arc::from(path);
        let text = std::fs::read(path).map_err(|e| ConfigError {
            loc: Loc { file: file.clone(), line: 0 },
            message: format!("cannot read: {e}"),
        })?;
        let text = String::from_utf8(text).map_err(|e| ConfigError {
            loc: Loc { file: file.clone(), line: 0 },
            message: format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to()),
        })?;
        Self::parse_depth(&text, file, ssh_dir, depth)
    }

    /// Parses configuration text (`file` names it in messages).
    pub fn parse(text: &str, file: &Path, ssh_dir: &Path) -> Result<Self, ConfigError> {
        Self::parse_depth(text, Arc::from(file), ssh_dir, 0)
    }

    fn parse_depth(text: &str, file: Arc<Path>, ssh_dir: &Path, depth: usize) -> Result<Self, ConfigError> {
        let mut entries = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let loc = Loc { file: file.clone(), line: i + 1 };
            let err = |m: String| ConfigError { loc: loc.clone(), message: m };
            let line = raw.trim_matches(|c: char| c.is_whitespace() || c == '\x0c');
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let end = line.find(|c: char| c.is_whitespace() || c == '=').unwrap_or(line.len());
            let keyword = &line[..end];
            // The value: after whitespace and at most one `=`.
            let mut rest = line[end..].trim_start();
            if let Some(r) = rest.strip_prefix('=') {
                rest = r.trim_start();
            }
            let args = split_args(rest).map_err(|m| err(format!("{keyword}: {m}")))?;
            let item = match keyword.to_ascii_lowercase().as_str() {
                "host" => {
                    if args.is_empty() {
                        return Err(err("Host: missing pattern".into()));
                    }
                    Item::Host(args)
                }
                "match" => Item::Match(parse_match(&args).map_err(|m| err(format!("Match: {m}")))?),
                "include" => {
                    if depth + 1 > MAX_DEPTH {
                        return Err(err(format!("Include: nested more than {MAX_DEPTH} deep (an include loop?)")));
                    }
                    if args.is_empty() {
                        return Err(err("Include: missing file name".into()));
                    }
                    let mut files = Vec::new();
                    for a in &args {
                        for p in include_paths(a, ssh_dir).map_err(|m| err(format!("Include {a}: {m}")))? {
                            files.push(Self::load_depth(&p, ssh_dir, depth + 1)?);
                        }
                    }
                    Item::Include(files)
                }
                _ => Item::Directive { keyword: keyword.to_string(), args, rest: rest.to_string() },
            };
            entries.push((loc, item));
        }
        Ok(ConfigFile { entries })
    }

    /// The settings for `alias` (the name given to ssh), as `ssh -G alias` would
    /// evaluate them. `local_user` is the user running the orchestrator.
    pub fn resolve(&self, alias: &str, local_user: &str) -> Result<HostSettings, ConfigError> {
        let mut ev = Eval { alias, local_user, s: HostSettings::default() };
        let mut active = true; // options before the first Host/Match apply to all
        self.eval(&mut ev, &mut active, false)?;
        Ok(ev.s)
    }

    fn eval(&self, ev: &mut Eval<'_>, active: &mut bool, never: bool) -> Result<(), ConfigError> {
        for (loc, item) in &self.entries {
            match item {
                Item::Host(patterns) => {
                    *active = !never && host_matches(patterns, ev.alias);
                }
                Item::Match(criteria) => {
                    *active = !never && ev.matches(criteria, loc);
                }
                Item::Include(files) => {
                    let outer = *active;
                    for f in files {
                        // An included file starts active (if its block is) and its
                        // own Host/Match lines do not leak out.
                        let mut a = outer;
                        f.eval(ev, &mut a, never || !outer)?;
                    }
                    *active = outer;
                }
                Item::Directive { keyword, args, rest } if *active => ev.apply(loc, keyword, args, rest)?,
                Item::Directive { .. } => {}
            }
        }
        Ok(())
    }
}

struct Eval<'a> {
    alias: &'a str,
    local_user: &'a str,
    s: HostSettings,
}

impl Eval<'_> {
    fn matches(&mut self, criteria: &[Criterion], loc: &Loc) -> bool {
        let mut all = true;
        for c in criteria {
            let held = match &c.kind {
                CriterionKind::All => true,
                CriterionKind::Host(list) => {
                    // Against HostName once one is set (OpenSSH: "after substitution").
                    let h = self.s.host_name.as_deref().map(|h| expand_percent_h(h, self.alias));
                    pattern_list_matches(list, h.as_deref().unwrap_or(self.alias))
                }
                CriterionKind::OriginalHost(list) => pattern_list_matches(list, self.alias),
                CriterionKind::User(list) => {
                    pattern_list_matches(list, self.s.user.as_deref().unwrap_or(self.local_user))
                }
                CriterionKind::LocalUser(list) => pattern_list_matches(list, self.local_user),
                CriterionKind::Unsupported(k) => {
                    self.s.unhonoured.push((
                        loc.clone(),
                        format!("Match {k}"),
                        "this criterion is not evaluated, so the Match block is skipped",
                    ));
                    return false;
                }
            };
            all &= held != c.negated;
        }
        all
    }

    fn apply(&mut self, loc: &Loc, keyword: &str, args: &[String], rest: &str) -> Result<(), ConfigError> {
        let err = |m: String| ConfigError { loc: loc.clone(), message: format!("{keyword}: {m}") };
        let first = || args.first().cloned().ok_or_else(|| err("missing value".into()));
        let kw = keyword.to_ascii_lowercase();
        let s = &mut self.s;
        match kw.as_str() {
            "hostname" | "user" | "port" | "hostkeyalias" => self.apply_endpoint(&kw, first()?, &err)?,
            "identityfile" => s.identity_files.push((first()?, loc.clone())),
            "identitiesonly" => {
                let v = yes_no(&first()?).ok_or_else(|| err("expected yes or no".into()))?;
                s.identities_only.get_or_insert(v);
            }
            "userknownhostsfile" if s.user_known_hosts.is_none() => {
                s.user_known_hosts = Some((known_hosts_list(args, &err)?, loc.clone()))
            }
            "globalknownhostsfile" if s.global_known_hosts.is_none() => {
                s.global_known_hosts = Some((known_hosts_list(args, &err)?, loc.clone()))
            }
            "userknownhostsfile" | "globalknownhostsfile" => {}
            "proxyjump" | "proxycommand" => self.apply_proxy(&kw, loc, args.first(), rest, &err)?,
            "serveraliveinterval" | "serveralivecountmax" | "connecttimeout" => {
                self.apply_timing(&kw, &first()?, &err)?
            }
            // What the orchestrator does anyway: it never prompts, and always
            // checks host keys against known_hosts.
            "batchmode" => {}
            "stricthostkeychecking" if args.first().is_some_and(|v| v.eq_ignore_ascii_case("yes")) => {}
            "stricthostkeychecking" => s.unhonoured.push((
                loc.clone(),
                keyword.to_string(),
                "host keys are always checked against known_hosts; an unknown or changed key is refused",
            )),
            _ => s.unhonoured.push((loc.clone(), keyword.to_string(), "not acted on by the orchestrator's SSH client")),
        }
        Ok(())
    }

    /// `HostName`, `User`, `Port`, `HostKeyAlias` (`kw` lowercased): the first value wins.
    fn apply_endpoint(&mut self, kw: &str, v: String, err: &dyn Fn(String) -> ConfigError) -> Result<(), ConfigError> {
        let s = &mut self.s;
        match kw {
            "hostname" => {
                s.host_name.get_or_insert(v);
            }
            "user" => {
                s.user.get_or_insert(v);
            }
            "port" => {
                let p = v
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| err(format!("`{v}` is not a port number")))?;
                s.port.get_or_insert(p);
            }
            _ => {
                s.host_key_alias.get_or_insert(v);
            }
        }
        Ok(())
    }

    /// `ProxyJump` and `ProxyCommand` compete: whichever comes first wins.
    fn apply_proxy(
        &mut self,
        kw: &str,
        loc: &Loc,
        first: Option<&String>,
        rest: &str,
        err: &dyn Fn(String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        let value = if kw == "proxyjump" {
            first.ok_or_else(|| err("missing value".into()))?.as_str()
        } else if rest.is_empty() {
            return Err(err("missing command".into()));
        } else {
            rest
        };
        if self.s.proxy.is_some() {
            return Ok(());
        }
        let p = if value.eq_ignore_ascii_case("none") {
            Proxy::None
        } else if kw == "proxyjump" {
            Proxy::Jump(parse_jumps(value).map_err(err)?)
        } else {
            Proxy::Command(value.to_string())
        };
        self.s.proxy = Some((p, loc.clone()));
        Ok(())
    }

    /// `ServerAliveInterval`, `ServerAliveCountMax`, `ConnectTimeout`: the first value wins.
    fn apply_timing(&mut self, kw: &str, v: &str, err: &dyn Fn(String) -> ConfigError) -> Result<(), ConfigError> {
        let time = || seconds(v).ok_or_else(|| err("expected a time (seconds, or e.g. 1m)".into()));
        let s = &mut self.s;
        match kw {
            "serveraliveinterval" => {
                s.server_alive_interval.get_or_insert(time()?);
            }
            "serveralivecountmax" => {
                let n = v.parse::<u32>().map_err(|_| err(format!("`{v}` is not a count")))?;
                s.server_alive_count_max.get_or_insert(n);
            }
            _ => {
                s.connect_timeout.get_or_insert(time()?);
            }
        }
        Ok(())
    }
}

fn known_hosts_list(args: &[String], err: &dyn Fn(String) -> ConfigError) -> Result<Vec<String>, ConfigError> {
    if args.is_empty() {
        return Err(err("missing file name".into()));
    }
    if args.len() == 1 && args[0].eq_ignore_ascii_case("none") {
        return Ok(Vec::new());
    }
    Ok(args.to_vec())
}

fn yes_no(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "yes" | "true" => Some(true),
        "no" | "false" => Some(false),
        _ => None,
    }
}

/// ssh_config time format: `30`, `30s`, `5m`, `1h30m`.
fn seconds(v: &str) -> Option<u32> {
    let mut total: u64 = 0;
    let mut num = String::new();
    for c in v.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let mult = match c.to_ascii_lowercase() {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            'w' => 604800,
            _ => return None,
        };
        total += num.parse::<u64>().ok()? * mult;
        num.clear();
    }
    if !num.is_empty() {
        total += num.parse::<u64>().ok()?;
    } else if v.is_empty() {
        return None;
    }
    u32::try_from(total).ok()
}

/// `[user@]host[:port]` or `ssh://[user@]host[:port]`, comma-separated.
fn parse_jumps(v: &str) -> Result<Vec<JumpHost>, String> {
    v.split(',')
        .map(|spec| {
            let bad = || format!("`{spec}` is not [user@]host[:port]");
            let s = spec.strip_prefix("ssh://").unwrap_or(spec).trim_end_matches('/');
            let (user, hostport) = match s.rsplit_once('@') {
                Some((u, h)) if !u.is_empty() => (Some(u.to_string()), h),
                Some(_) => return Err(bad()),
                None => (None, s),
            };
            let (host, port) = if let Some(inner) = hostport.strip_prefix('[') {
                // [v6]:port
                let (h, after) = inner.split_once(']').ok_or_else(bad)?;
                let port = match after.strip_prefix(':') {
                    Some(p) => Some(p),
                    None if after.is_empty() => None,
                    None => return Err(bad()),
                };
                (h, port)
            } else {
                match hostport.split_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (hostport, None),
                }
            };
            if host.is_empty() || host.chars().any(|c| c.is_whitespace()) {
                return Err(bad());
            }
            let port = match port {
                Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(bad)?),
                None => None,
            };
            Ok(JumpHost { user, host: host.to_string(), port })
        })
        .collect()
}

fn parse_match(args: &[String]) -> Result<Vec<Criterion>, String> {
    if args.is_empty() {
        return Err("missing criteria".into());
    }
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (negated, k) = match a.strip_prefix('!') {
            Some(k) => (true, k.to_ascii_lowercase()),
            None => (false, a.to_ascii_lowercase()),
        };
        let kind = match k.as_str() {
            "all" => CriterionKind::All,
            "canonical" | "final" => CriterionKind::Unsupported(k.clone()),
            _ => {
                let v = it.next().ok_or_else(|| format!("`{k}` needs an argument"))?.clone();
                match k.as_str() {
                    "host" => CriterionKind::Host(v),
                    "originalhost" => CriterionKind::OriginalHost(v),
                    "user" => CriterionKind::User(v),
                    "localuser" => CriterionKind::LocalUser(v),
                    _ => CriterionKind::Unsupported(k.clone()),
                }
            }
        };
        out.push(Criterion { negated, kind });
    }
    Ok(out)
}

/// Words of a value: whitespace-separated, `"…"` or `'…'` quoted, `\` escaping
/// a quote, a backslash or a space; an unquoted word starting with `#` ends the line.
fn split_args(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let Some(&c0) = chars.peek() else { break };
        if c0 == '#' {
            break;
        }
        let mut word = String::new();
        let mut quote: Option<char> = None;
        while let Some(c) = chars.next() {
            match (c, quote) {
                ('\\', _) if chars.peek().is_some_and(|n| matches!(n, '"' | '\'' | '\\' | ' ')) => {
                    word.push(chars.next().expect("peeked"));
                }
                (q, None) if q == '"' || q == '\'' => quote = Some(q),
                (q, Some(open)) if q == open => quote = None,
                (w, None) if w.is_whitespace() => break,
                (c, _) => word.push(c),
            }
        }
        if quote.is_some() {
            return Err("unterminated quote".into());
        }
        out.push(word);
    }
    Ok(out)
}

/// Files an `Include` argument names: `~` expanded, relative to `ssh_dir`, glob patterns.
fn include_paths(arg: &str, ssh_dir: &Path) -> Result<Vec<PathBuf>, String> {
    let path = match arg.strip_prefix("~/") {
        Some(rest) => super::home_dir().ok_or("no HOME to expand `~`")?.join(rest),
        None if Path::new(arg).is_absolute() => PathBuf::from(arg),
        None => ssh_dir.join(arg),
    };
    let pattern = path.to_string_lossy().into_owned();
    let mut files: Vec<PathBuf> =
        glob::glob(&pattern).map_err(|e| e.to_string())?.filter_map(Result::ok).filter(|p| p.is_file()).collect();
    files.sort();
    Ok(files)
}

/// `%h` (the name given) and `%%` in a HostName.
pub fn expand_percent_h(v: &str, alias: &str) -> String {
    v.replace("%%", "\u{0}").replace("%h", alias).replace('\u{0}', "%")
}

/// A `Host` line: any positive pattern matches and no negated one does.
fn host_matches(patterns: &[String], name: &str) -> bool {
    let mut matched = false;
    for p in patterns {
        if let Some(neg) = p.strip_prefix('!') {
            if glob_match(neg, name) {
                return false;
            }
        } else if glob_match(p, name) {
            matched = true;
        }
    }
    matched
}

/// A `Match` pattern-list: comma-separated, `!` negates.
fn pattern_list_matches(list: &str, name: &str) -> bool {
    let patterns: Vec<String> = list.split(',').map(str::to_string).collect();
    host_matches(&patterns, name)
}

/// `*` and `?` wildcards, case-insensitive, as ssh_config patterns.
pub fn glob_match(p: &str, s: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (p.chars().collect(), s.chars().collect());
    // Iterative wildcard match with backtracking to the last `*`.
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < s.len() {
        if i < p.len() && (p[i] == '?' || p[i].eq_ignore_ascii_case(&s[j])) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
