//! The JWT slurmrestd authenticates with: where it comes from (a file or an
//! environment variable), and a wrapper that keeps it out of every `Debug`,
//! `Display`, log line and error message.

use std::fmt;
use std::path::PathBuf;

use base64::Engine;

use crate::cluster::ClusterConfig;

/// Where the token is read from: named in messages instead of the token itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    File(PathBuf),
    Env(String),
}

impl fmt::Display for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::File(p) => write!(f, "token file {}", p.display()),
            TokenSource::Env(v) => write!(f, "environment variable {v}"),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("{source_}: cannot read: {message}")]
    Unreadable { source_: TokenSource, message: String },
    #[error("{0}: empty (put the output of `scontrol token` there)")]
    Empty(TokenSource),
    #[error("{0}: not a JWT (expected three base64url parts separated by dots)")]
    Malformed(TokenSource),
    #[error("{source_}: the token expired at {expired} UTC; get a new one with `scontrol token lifespan=SECONDS`")]
    Expired { source_: TokenSource, expired: String },
}

/// A JWT. Its text leaves this type only as an HTTP header value.
#[derive(Clone)]
pub struct Token {
    text: String,
    /// The `exp` claim (Unix seconds), when the token carries one.
    expires: Option<i64>,
    source: TokenSource,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token(from {}, redacted)", self.source)
    }
}

impl TokenSource {
    /// The source a `rest` cluster declares (`token_file` wins; `check` allows only one).
    pub fn of(cluster: &ClusterConfig) -> Option<TokenSource> {
        match (&cluster.token_file, &cluster.token_env) {
            (Some(p), _) => Some(TokenSource::File(expand_home(p))),
            (None, Some(v)) => Some(TokenSource::Env(v.clone())),
            (None, None) => None,
        }
    }

    /// Reads the token now (a file rewritten by a cron job is picked up by the next command).
    pub fn load(&self) -> Result<Token, TokenError> {
        let raw = match self {
            TokenSource::File(p) => std::fs::read_to_string(p)
                .map_err(|e| TokenError::Unreadable { source_: self.clone(), message: e.to_string() })?,
            TokenSource::Env(v) => std::env::var(v)
                .map_err(|e| TokenError::Unreadable { source_: self.clone(), message: e.to_string() })?,
        };
        Token::parse(self.clone(), &raw)
    }
}

impl TokenSource {
    /// Warns (once, when the transport opens) about a token file others may read.
    pub fn warn_if_exposed(&self) {
        use std::os::unix::fs::PermissionsExt;
        if let TokenSource::File(p) = self {
            if let Ok(m) = std::fs::metadata(p) {
                let mode = m.permissions().mode() & 0o777;
                if mode & 0o077 != 0 {
                    tracing::warn!("{self} is readable by others (mode {mode:o}); `chmod 600` it");
                }
            }
        }
    }
}

/// `~/…` under `$HOME` (clusters files name files as people write them).
pub(super) fn expand_home(p: &std::path::Path) -> PathBuf {
    match (p.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => p.to_path_buf(),
    }
}

impl Token {
    /// The token from `scontrol token` output (`SLURM_JWT=…`) or the bare token.
    pub fn parse(source: TokenSource, raw: &str) -> Result<Token, TokenError> {
        let line =
            raw.lines().map(str::trim).find(|l| !l.is_empty()).ok_or_else(|| TokenError::Empty(source.clone()))?;
        let text = line.strip_prefix("SLURM_JWT=").unwrap_or(line).trim();
        let parts: Vec<&str> = text.split('.').collect();
        let b64url = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if parts.len() != 3 || !parts[..2].iter().all(|p| b64url(p)) || !(parts[2].is_empty() || b64url(parts[2])) {
            return Err(TokenError::Malformed(source));
        }
        let expires = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(parts[1].trim_end_matches('='))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v.get("exp").and_then(serde_json::Value::as_i64));
        Ok(Token { text: text.to_string(), expires, source })
    }

    /// An error when the token's own `exp` claim is past at `now` (Unix seconds).
    pub fn check_fresh(&self, now: f64) -> Result<(), TokenError> {
        match self.expires {
            Some(exp) if (exp as f64) <= now => Err(TokenError::Expired {
                source_: self.source.clone(),
                expired: crate::fsio::utc_timestamp(exp as f64).replace('T', " "),
            }),
            _ => Ok(()),
        }
    }

    pub fn source(&self) -> &TokenSource {
        &self.source
    }

    /// The header value, marked sensitive so the HTTP stack never prints it.
    pub(super) fn header_value(&self) -> Option<reqwest::header::HeaderValue> {
        let mut v = reqwest::header::HeaderValue::from_str(&self.text).ok()?;
        v.set_sensitive(true);
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // In the shape `scontrol token username=root lifespan=60` prints (HS256 header; payload
    // {"exp":1795324107,"iat":1795324047,"sun":"root"}), with a made-up signature.
    const RECORDED: &str = "SLURM_JWT=eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJleHAiOjE3OTUzMjQxMDcsImlhdCI6MTc5NTMyNDA0Nywic3VuIjoicm9vdCJ9.c2lnbmF0dXJl\n";

    fn src() -> TokenSource {
        TokenSource::File("/x/token".into())
    }

    #[test]
    fn scontrol_output_and_bare_tokens_parse() {
        let t = Token::parse(src(), RECORDED).expect("parses");
        assert_eq!(t.expires, Some(1_795_324_107));
        let bare = RECORDED.trim().trim_start_matches("SLURM_JWT=");
        assert_eq!(Token::parse(src(), bare).expect("bare").text, bare);
    }

    #[test]
    fn the_token_never_shows_in_debug_or_errors() {
        let t = Token::parse(src(), RECORDED).expect("parses");
        let secret = "c2lnbmF0dXJl";
        assert!(!format!("{t:?}").contains(secret));
        let e = t.check_fresh(2e9).expect_err("expired");
        let msg = e.to_string();
        assert!(msg.contains("/x/token") && msg.contains("expired at 2026-11-22 05:08:27"), "{msg}");
        assert!(!msg.contains(secret) && !msg.contains("eyJ"), "{msg}");
        assert!(t.check_fresh(1_795_324_000.0).is_ok());
    }

    #[test]
    fn empty_or_malformed_tokens_are_refused_without_echoing_them() {
        assert_eq!(Token::parse(src(), "\n\n").err(), Some(TokenError::Empty(src())));
        let e = Token::parse(src(), "hunter2 not a jwt").expect_err("malformed");
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}
