//! HTTP to slurmrestd: one blocking reqwest client (rustls), the
//! X-SLURM-USER-NAME / X-SLURM-USER-TOKEN headers on every request, the API
//! version discovered once, and answers turned into [`RestError`]s that name
//! the endpoint and the HTTP status, never the token.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::Value;

use super::api::{ApiError, ApiVersion, Envelope};
use super::auth::TokenSource;
use super::RestError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Delete,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Delete => "DELETE",
        })
    }
}

/// A slurmrestd, as one user.
pub struct Client {
    base: String,
    user: String,
    token: TokenSource,
    /// Extra CA certificates (PEM) to trust for https.
    ca_file: Option<PathBuf>,
    /// Built on first use, on the blocking thread that uses it (reqwest's
    /// blocking client must not be built inside the async runtime).
    http: OnceLock<reqwest::blocking::Client>,
    version: OnceLock<ApiVersion>,
    /// HTTP requests sent (the "commands" of this transport's figures).
    pub(super) requests: AtomicU64,
}

/// slurmrestd's Slurm error numbers that mean "no such job any more" (ESLURM_INVALID_JOB_ID, ESLURM_ALREADY_DONE).
pub const GONE: [i64; 2] = [2017, 2021];

impl Client {
    pub fn new(base: &str, user: &str, token: TokenSource, ca_file: Option<PathBuf>) -> Client {
        Client {
            base: base.trim_end_matches('/').to_string(),
            user: user.to_string(),
            token,
            ca_file,
            http: OnceLock::new(),
            version: OnceLock::new(),
            requests: AtomicU64::new(0),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn http(&self) -> Result<&reqwest::blocking::Client, RestError> {
        if let Some(c) = self.http.get() {
            return Ok(c);
        }
        let mut builder = reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60));
        if let Some(path) = &self.ca_file {
            let bad = |m: String| RestError::Client(format!("ca_file {}: {m}", path.display()));
            let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| bad(describe(&e)))?;
            if certs.is_empty() {
                return Err(bad("no PEM certificate in it".into()));
            }
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        let c = builder.build().map_err(|e| RestError::Client(e.without_url().to_string()))?;
        Ok(self.http.get_or_init(|| c))
    }

    /// The API version, asked once (`GET /openapi/v3`, one request per process).
    pub fn version(&self) -> Result<ApiVersion, RestError> {
        if let Some(v) = self.version.get() {
            return Ok(*v);
        }
        #[derive(serde::Deserialize)]
        struct OpenApi {
            #[serde(default)]
            paths: BTreeMap<String, IgnoredAny>,
        }
        let spec: OpenApi = self.request(Method::Get, "/openapi/v3", &[], None)?;
        let v = ApiVersion::choose(spec.paths.keys().map(String::as_str)).ok_or_else(|| {
            let mut offered: Vec<&str> =
                spec.paths.keys().filter_map(|p| p.strip_prefix("/slurm/")?.split('/').next()).collect();
            offered.dedup();
            RestError::NoVersion { endpoint: format!("{}/openapi/v3", self.base), offered: offered.join(", ") }
        })?;
        tracing::debug!(api = v.tag(), url = %self.base, "slurmrestd API version");
        Ok(*self.version.get_or_init(|| v))
    }

    /// One request; the answer parsed as `T`. A non-2xx status, or an answer
    /// whose `errors` list is not empty, is an error naming the endpoint.
    pub fn request<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<T, RestError> {
        let endpoint = format!("{}{path}", self.base);
        let token = self.token.load()?;
        let value = token
            .header_value()
            .ok_or_else(|| RestError::Client(format!("{}: not a valid header value", self.token)))?;
        let http = self.http()?;
        let mut req = match method {
            Method::Get => http.get(&endpoint),
            Method::Post => http.post(&endpoint),
            Method::Delete => http.delete(&endpoint),
        }
        .header("X-SLURM-USER-NAME", &self.user)
        .header("X-SLURM-USER-TOKEN", value)
        .header(reqwest::header::ACCEPT, "application/json");
        if !query.is_empty() {
            req = req.query(query);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%method, %endpoint, "slurmrestd request");
        let failed = |message: String| RestError::Request { method, endpoint: endpoint.clone(), message };
        let resp = req.send().map_err(|e| failed(describe(&e)))?;
        let status = resp.status();
        let text = resp.text().map_err(|e| failed(describe(&e)))?;
        let errors = serde_json::from_str::<Envelope>(&text).map(|e| e.errors).unwrap_or_default();
        if refused(status.is_success(), &errors) {
            let hint = token
                .check_fresh(crate::fsio::now())
                .err()
                .map(|e| e.to_string())
                .or_else(|| auth_hint(status.as_u16(), &errors).map(|h| format!("{h} (check the {})", self.token)));
            return Err(RestError::Status {
                method,
                endpoint,
                status: status.as_u16(),
                reason: status.canonical_reason().unwrap_or("").to_string(),
                message: message(&errors, &text),
                slurm_errors: errors.iter().filter_map(|e| e.error_number).collect(),
                hint,
            });
        }
        serde_json::from_str(&text).map_err(|e| RestError::Decode { method, endpoint, message: e.to_string() })
    }
}

/// ESLURM_REST_EMPTY_RESULT: slurmdbd found no job of the names, an answer like any other.
const EMPTY_RESULT: i64 = 9003;

/// Whether an answer is a refusal: a non-2xx status, or errors other than "nothing found".
fn refused(success: bool, errors: &[ApiError]) -> bool {
    !success || errors.iter().any(|e| e.error_number != Some(EMPTY_RESULT))
}

/// The reqwest error without its URL (the caller names the endpoint), with its causes.
fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    };
    let mut causes = Vec::new();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        causes.push(s.to_string());
        src = s.source();
    }
    if causes.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}: {}", causes.join(": "))
    }
}

/// What slurmrestd said went wrong: its `errors`, else the start of the body.
fn message(errors: &[ApiError], body: &str) -> String {
    if errors.is_empty() {
        let b = body.trim();
        return b.chars().take(200).collect::<String>();
    }
    errors.iter().map(ApiError::to_string).collect::<Vec<_>>().join("; ")
}

/// Why a refusal likely concerns the token. Slurm 22.05's slurmrestd passes
/// the token through and answers a refused one with a generic error: -1
/// "Unspecified error" (slurmctld's job list, HTTP 500), 5005 "Zero Bytes
/// were transmitted or received" (submit, HTTP 500), 1007 "Protocol
/// authentication error" (slurmdbd, even with HTTP 200); newer ones answer 401/403.
fn auth_hint(status: u16, errors: &[ApiError]) -> Option<&'static str> {
    let all =
        |set: &[i64]| !errors.is_empty() && errors.iter().all(|e| e.error_number.is_some_and(|n| set.contains(&n)));
    match status {
        401 | 403 => Some("the token was refused"),
        _ if all(&[1007]) => Some("SLURM refused the token (wrong, expired, or another user's)"),
        500 if all(&[-1, 1007, 5005]) => {
            Some("slurmrestd gives this generic error when SLURM refuses the token (wrong, expired, or another user's)")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(json: &str) -> Vec<ApiError> {
        serde_json::from_str::<Envelope>(json).expect("parses").errors
    }

    #[test]
    fn nothing_found_is_an_empty_answer_not_a_refusal() {
        // Recorded from slurmrestd 22.05.8: GET /slurmdb/v0.0.38/jobs?job_name=nonexistent-x (HTTP 200).
        let empty = errors(
            r#"{"errors": [{"description": "Nothing found", "error_number": 9003, "error": "Nothing found with query", "source": "slurmdb_jobs_get"}], "jobs": []}"#,
        );
        assert!(!refused(true, &empty));
        assert!(refused(false, &empty), "an error status is a refusal whatever the body");
        // Recorded: the same request with a wrong token (HTTP 200 too).
        let auth = errors(
            r#"{"errors": [{"error_number": 1007, "error": "Protocol authentication error", "source": "slurmdb_jobs_get"}], "jobs": []}"#,
        );
        assert!(refused(true, &auth));
        assert!(auth_hint(200, &auth).is_some_and(|h| h.contains("refused the token")));
    }

    #[test]
    fn generic_errors_of_a_refused_token_get_a_hint_others_do_not() {
        // Recorded: POST /slurm/v0.0.38/job/submit with a wrong token (HTTP 500).
        let submit =
            errors(r#"{"errors": [{"error_code": 5005, "error": "Zero Bytes were transmitted or received"}]}"#);
        assert!(auth_hint(500, &submit).is_some());
        // Recorded: DELETE of a job SLURM does not know (HTTP 500): not about the token.
        let gone = errors(
            r#"{"errors": [{"description": "unable to kill JobId=999999 with signal 9: Invalid job id specified", "error_number": 2017, "error": "Invalid job id specified", "source": "slurm_kill_job"}]}"#,
        );
        assert_eq!(auth_hint(500, &gone), None);
        assert_eq!(message(&gone, ""), "slurm_kill_job: unable to kill JobId=999999 with signal 9: Invalid job id specified (Invalid job id specified)");
    }
}
