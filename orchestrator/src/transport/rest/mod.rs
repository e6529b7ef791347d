//! The `rest` transport: SLURM through slurmrestd (the control plane), files
//! over SFTP or this machine's filesystem (the data plane, [`Files`]).
//!
//! The same guarantees as over SSH: the intent is recorded before the submit
//! request leaves, and a request whose answer is lost leaves the submission
//! unresolved until a poll by its unique job name settles it
//! ([`crate::submit::protocol`]). A poll is two requests whatever the sweep's
//! size: the job list of slurmctld (squeue's view) and the accounting job list
//! filtered by name (sacct's). The token is read from its file or variable for
//! each request and sent only as a header.

pub mod api;
pub mod auth;
mod client;
pub mod directives;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::files::Files;
use super::{local_slurm, ssh, CounterSnapshot, FileStore, Poll, Scheduler, Transport, TransportError};
use crate::cluster::{ClusterConfig, FilesKind};
use crate::slurm::JobId;
use api::{DbJobs, LiveJobs, SubmitAnswer};
use auth::{TokenError, TokenSource};
use client::{Client, Method};
use directives::{DirectiveError, JobSpec};

pub use client::Method as HttpMethod;

/// A REST request that failed. Every message names the endpoint; none holds the token.
#[derive(Debug, thiserror::Error)]
pub enum RestError {
    #[error("{method} {endpoint}: HTTP {status} {reason}: {message}{}", hint.as_ref().map(|h| format!("; {h}")).unwrap_or_default())]
    Status {
        method: Method,
        endpoint: String,
        status: u16,
        reason: String,
        message: String,
        /// Slurm's error numbers from the answer's `errors`.
        slurm_errors: Vec<i64>,
        /// Why the token is the likely cause, when it is.
        hint: Option<String>,
    },
    /// No answer (connection refused, timeout, TLS): for a submit, it may have been created.
    #[error("{method} {endpoint}: {message}")]
    Request { method: Method, endpoint: String, message: String },
    #[error("{method} {endpoint}: unexpected answer: {message}")]
    Decode { method: Method, endpoint: String, message: String },
    #[error("{endpoint}: no REST API version this orchestrator speaks (server offers: {offered}; supported: v0.0.38, v0.0.40, v0.0.41, v0.0.42)")]
    NoVersion { endpoint: String, offered: String },
    #[error("POST {endpoint}: the answer holds no job id")]
    NoJobId { endpoint: String },
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error(transparent)]
    Script(DirectiveError),
    #[error("HTTP client: {0}")]
    Client(String),
}

/// The PATH a job gets when the cluster's `env` does not set one (slurmrestd
/// passes no environment of its own; sbatch would pass the caller's).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub struct RestTransport {
    client: Client,
    files: Files,
    user: String,
    /// The job's environment: `PATH`, then the cluster's `env`.
    env: Vec<(String, String)>,
    max_array_size: u32,
    files_kind: FilesKind,
}

impl RestTransport {
    pub fn open(name: &str, cluster: &ClusterConfig) -> Result<Self, TransportError> {
        let invalid = |m: &str| TransportError::Other(format!("cluster `{name}`: {m}"));
        let url = cluster.url.as_deref().ok_or_else(|| invalid("transport `rest` needs `url`"))?;
        let user = cluster.user.clone().ok_or_else(|| invalid("transport `rest` needs `user`"))?;
        let token =
            TokenSource::of(cluster).ok_or_else(|| invalid("transport `rest` needs `token_file` or `token_env`"))?;
        token.warn_if_exposed();
        let files_kind =
            cluster.files.ok_or_else(|| invalid("transport `rest` needs `files: local` or `files: sftp`"))?;
        let shell: Arc<dyn super::Shell> = match files_kind {
            FilesKind::Local => Arc::new(local_slurm::LocalShell::new(cluster)),
            FilesKind::Sftp => Arc::new(ssh::SshShell::new(name, cluster)?),
        };
        let mut env = vec![("PATH".to_string(), DEFAULT_PATH.to_string())];
        env.retain(|(k, _)| !cluster.env.contains_key(k));
        env.extend(cluster.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        Ok(RestTransport {
            client: Client::new(url, &user, token, cluster.ca_file.as_deref().map(auth::expand_home)),
            files: Files::new(shell, cluster),
            user,
            env,
            max_array_size: cluster.max_array_size.unwrap_or(1001),
            files_kind,
        })
    }

    /// Jobs slurmctld holds (squeue's view).
    fn live(&self, names: &[String]) -> Result<Vec<crate::slurm::TaskObservation>, TransportError> {
        let v = self.client.version()?;
        let jobs: LiveJobs = self.client.request(Method::Get, &v.jobs_path(), &[], None)?;
        Ok(jobs.observations(names, &self.user)?)
    }

    /// Jobs accounting holds (sacct's view), by name, since `start`.
    fn history(&self, names: &[String], start: &str) -> Result<Vec<crate::slurm::TaskObservation>, TransportError> {
        let v = self.client.version()?;
        let query = [("job_name", names.join(",")), ("start_time", start.to_string())];
        let jobs: DbJobs = self.client.request(Method::Get, &v.db_jobs_path(), &query, None)?;
        Ok(jobs.observations(names, &self.user)?)
    }
}

impl Transport for RestTransport {
    fn describe(&self) -> String {
        let files = match self.files_kind {
            FilesKind::Local => "files on this machine".to_string(),
            FilesKind::Sftp => format!("files over SFTP ({})", self.files.shell().describe()),
        };
        format!("slurmrestd at {} as {}, {files}", self.client.base(), self.user)
    }

    fn files(&self) -> &dyn FileStore {
        &self.files
    }

    fn counters(&self) -> CounterSnapshot {
        let http = CounterSnapshot { commands: self.client.requests.load(Ordering::Relaxed), ..Default::default() };
        http + self.files.shell().counters().snapshot()
    }
}

impl Scheduler for RestTransport {
    fn max_array_size(&self) -> Result<u32, TransportError> {
        Ok(self.max_array_size)
    }

    /// The script at `script` (uploaded before the intent was recorded) goes
    /// in the request's body; its `#SBATCH` lines become the job's options.
    /// Only the POST can create a job: whatever fails before it is
    /// [`TransportError::NotSent`], so the intent is released at once.
    fn submit(&self, script: &str) -> Result<JobId, TransportError> {
        let not_sent = |e: TransportError| TransportError::NotSent(Box::new(e));
        let bytes = self.files.get_file(script).map_err(not_sent)?.ok_or_else(|| {
            not_sent(TransportError::File {
                target: self.describe(),
                path: script.into(),
                message: "no such file (the job script is uploaded before submitting)".into(),
            })
        })?;
        let text =
            String::from_utf8(bytes).map_err(|_| not_sent(TransportError::Other(format!("{script}: not UTF-8"))))?;
        let spec = JobSpec::from_script(script, &text).map_err(|e| not_sent(RestError::from(e).into()))?;
        let v = self.client.version().map_err(|e| not_sent(e.into()))?;
        let body = v.submit_body(&text, &spec, &self.env);
        let path = v.submit_path();
        let answer: SubmitAnswer = self.client.request(Method::Post, &path, &[], Some(&body))?;
        let id =
            answer.job_id().ok_or_else(|| RestError::NoJobId { endpoint: format!("{}{path}", self.client.base()) })?;
        Ok(JobId::from(id))
    }

    fn poll(&self, names: &[String], since: f64) -> Result<Poll, TransportError> {
        if names.is_empty() {
            return Ok(Poll { live_ok: true, history_ok: true, ..Poll::default() });
        }
        let live = self.live(names);
        // A day of margin, as for sacct.
        let hist = self.history(names, &crate::fsio::utc_timestamp(since - 86_400.0));
        super::combine(live, hist, ("jobs", "accounting jobs"))
    }

    /// One DELETE per array; an array SLURM no longer knows (or already
    /// finished) counts as cancelled, as for scancel.
    fn cancel(&self, job_ids: &[JobId]) -> Result<(), TransportError> {
        let v = self.client.version()?;
        for id in job_ids {
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit() || b == b'_') {
                return Err(TransportError::Other(format!("not a job id: {id:?}")));
            }
            match self.client.request::<serde_json::Value>(Method::Delete, &v.job_path(id), &[], None) {
                Ok(_) => {}
                Err(RestError::Status { slurm_errors, .. })
                    if !slurm_errors.is_empty() && slurm_errors.iter().all(|n| client::GONE.contains(n)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}
