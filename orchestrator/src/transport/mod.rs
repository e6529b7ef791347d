//! How the orchestrator reaches a cluster. A [`Transport`] is a
//! [`Scheduler`] (submit, poll, cancel) and a [`FileStore`] (read, write,
//! tail), in five implementations:
//!
//! - `ssh`: SLURM on a remote login node; commands over SSH exec channels, files over SFTP;
//! - `local-slurm`: the SLURM commands of this machine;
//! - `rest`: SLURM's REST API (slurmrestd), files over SFTP or on this machine ([`rest`]);
//! - `local`: no SLURM at all; the rendered scripts run as local processes;
//! - `replay`: no runs; recorded measurements answer each config ([`replay`]).
//!
//! The scheduler drives SLURM (commands through a [`Shell`], or HTTP
//! requests); the files of every SLURM transport are one [`files::Files`]
//! over a [`Shell`] (SFTP or this machine), which `files()` hands out as is.
//! [`SlurmTransport`] turns the job operations into
//! `sbatch`/`squeue`/`sacct`/`scancel`/`scontrol` command lines and runs them
//! through the same shell as its files. `local` and `replay` keep theirs on
//! this machine's disk, one file store for both (`disk.rs`).
//!
//! Every call blocks (ssh2 is a blocking library); async callers run them with
//! `tokio::task::spawn_blocking` (see [`crate::submit`]).

mod disk;
pub mod files;
pub mod local;
pub mod local_slurm;
pub mod replay;
mod replay_job;
pub mod rest;
pub mod ssh;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::cluster::{ClusterConfig, TransportKind};
use crate::slurm::{self, JobId, ParseError, TaskObservation};

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The host key is not known or has changed: never connect.
    #[error("{0}")]
    HostKey(String),
    #[error("SSH authentication to {target} failed: {message}")]
    Auth { target: String, message: String },
    #[error("cannot reach {target}: {message}")]
    Connect { target: String, message: String },
    /// The host name does not resolve: retrying would only wait (issue 14).
    #[error("cannot reach {target}: host name `{host}` does not resolve ({message}); not retried")]
    Resolve { target: String, host: String, message: String },
    /// A malformed ssh config line (file, line, directive).
    #[error(transparent)]
    SshConfig(#[from] ssh::config::ConfigError),
    /// The connection broke while a command that must not be repeated (sbatch)
    /// was in flight: it may or may not have run.
    #[error("connection to {target} dropped during `{command}`; it may have run (`orchestrator resume` settles it)")]
    Uncertain { target: String, command: String },
    /// The host was reached and the command started, then said nothing.
    #[error(
        "{target} was reached, but `{command}` printed nothing within {seconds} s (the SSH command \
         timeout): it is slow or hangs there. Run it there by hand to see why (a worker on a slow shared \
         filesystem starts late), then try again; SWEEP_SSH_COMMAND_SECS sets the timeout"
    )]
    Silent { target: String, command: String, seconds: u64 },
    #[error("`{command}` failed (exit {status}): {stderr}")]
    Command { command: String, status: i32, stderr: String },
    #[error("{target}: {path}: {message}")]
    File { target: String, path: String, message: String },
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// A submission that failed before its request left: SLURM cannot have the job.
    #[error("{0} (nothing reached SLURM)")]
    NotSent(Box<TransportError>),
    /// A request to slurmrestd failed (names the endpoint and the HTTP status, never the token).
    #[error(transparent)]
    Rest(Box<rest::RestError>),
    #[error("{0}")]
    Other(String),
}

impl From<rest::RestError> for TransportError {
    fn from(e: rest::RestError) -> Self {
        TransportError::Rest(Box::new(e))
    }
}

/// What a command printed.
#[derive(Debug, Clone, Default)]
pub struct ExecOutput {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Counts for the closing figures (commands per poll, per submission).
#[derive(Debug, Default)]
pub struct Counters {
    pub commands: AtomicU64,
    pub file_ops: AtomicU64,
    pub connects: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CounterSnapshot {
    pub commands: u64,
    pub file_ops: u64,
    pub connects: u64,
}

impl Counters {
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            commands: self.commands.load(Ordering::Relaxed),
            file_ops: self.file_ops.load(Ordering::Relaxed),
            connects: self.connects.load(Ordering::Relaxed),
        }
    }
    fn command(&self) {
        self.commands.fetch_add(1, Ordering::Relaxed);
    }
    fn file(&self) {
        self.file_ops.fetch_add(1, Ordering::Relaxed);
    }
}

impl std::ops::Add for CounterSnapshot {
    type Output = CounterSnapshot;
    fn add(self, o: CounterSnapshot) -> CounterSnapshot {
        CounterSnapshot {
            commands: self.commands + o.commands,
            file_ops: self.file_ops + o.file_ops,
            connects: self.connects + o.connects,
        }
    }
}

/// Where commands run and files live: SSH (exec + SFTP) or this machine.
pub trait Shell: Send + Sync {
    /// Runs `argv` (each element one word; quoted for the remote shell by the
    /// implementation). `idempotent` commands are retried over a fresh
    /// connection when the old one dropped; others report [`TransportError::Uncertain`].
    fn run(&self, argv: &[String], idempotent: bool) -> Result<ExecOutput, TransportError>;
    /// Writes a file atomically (temp + rename), creating parent directories.
    fn write_file(&self, path: &str, data: &[u8], executable: bool) -> Result<(), TransportError>;
    /// Reads a file; `None` if it does not exist.
    fn read_file(&self, path: &str) -> Result<Option<Vec<u8>>, TransportError>;
    /// The bytes of a file from `offset` on (`None`: no such file), so event
    /// files are read incrementally. The default runs `tail -c` on the
    /// cluster: one command, only the new bytes cross the link.
    fn read_file_from(&self, path: &str, offset: u64) -> Result<Option<Vec<u8>>, TransportError> {
        // The path is `$1` and the offset `$2`, never part of the script text; exit 2 means absent.
        const SCRIPT: &str = r#"[ -e "$1" ] || exit 2; exec tail -c +"$2" -- "$1""#;
        let argv: Vec<String> =
            ["sh", "-c", SCRIPT, "sh", path, &(offset + 1).to_string()].iter().map(|s| s.to_string()).collect();
        let out = self.run(&argv, true)?;
        match out.status {
            0 => Ok(Some(out.stdout.into_bytes())),
            2 => Ok(None),
            status => Err(TransportError::Command {
                command: format!("tail -c +{} {path}", offset + 1),
                status,
                stderr: out.stderr.trim().to_string(),
            }),
        }
    }
    /// Makes a relative path absolute (relative to the login directory).
    fn absolute(&self, path: &str) -> Result<String, TransportError>;
    fn describe(&self) -> String;
    fn counters(&self) -> &Counters;
}

/// One poll of the cluster: every task of the named jobs, and how sure we are.
#[derive(Debug, Clone, Default)]
pub struct Poll {
    pub tasks: BTreeMap<(JobId, u32), TaskObservation>,
    /// The live view (squeue) answered; without it, "absent" proves nothing.
    pub live_ok: bool,
    /// The accounting view (sacct) answered.
    pub history_ok: bool,
    /// Why a view did not answer.
    pub errors: Vec<String>,
    /// Scheduler commands this poll ran.
    pub commands: u32,
}

impl Poll {
    /// Both views answered: a job absent from both was never submitted.
    pub fn complete(&self) -> bool {
        self.live_ok && self.history_ok
    }
}

/// The scheduler side of a cluster: SLURM (its commands or its REST API), or
/// the local runner.
pub trait Scheduler: Send + Sync {
    /// Array task ids must stay below this (`MaxArraySize`).
    fn max_array_size(&self) -> Result<u32, TransportError>;
    /// Submits a job array script; returns the array's job id. Never retried:
    /// an error after the request left may mean it ran (see [`TransportError::Uncertain`]).
    fn submit(&self, script: &str) -> Result<JobId, TransportError>;
    /// Every task of the jobs with these names submitted since `since` (Unix seconds).
    fn poll(&self, names: &[String], since: f64) -> Result<Poll, TransportError>;
    /// Cancels whole arrays (or `ARRAY_TASK` ids).
    fn cancel(&self, job_ids: &[JobId]) -> Result<(), TransportError>;
}

/// The file side of a cluster: where job files, the worker binary and the
/// event streams live ([`files::Files`] over a [`Shell`], or this machine).
pub trait FileStore: Send + Sync {
    /// Absolute path on the cluster of the state root (`<work_dir>/state`).
    fn remote_state_root(&self) -> Result<String, TransportError>;
    /// The worker binary's path on the cluster.
    fn worker_path(&self) -> Result<String, TransportError>;
    fn put_file(&self, path: &str, data: &[u8], executable: bool) -> Result<(), TransportError>;
    fn get_file(&self, path: &str) -> Result<Option<Vec<u8>>, TransportError>;
    /// The bytes of a file from `offset` on; `None` when there is no such file.
    fn read_from(&self, path: &str, offset: u64) -> Result<Option<Vec<u8>>, TransportError>;
    /// Size and SHA-256 (hex) of a file on the cluster, computed there (so
    /// `install` skips an upload of a binary that is already in place);
    /// `None` when there is no such file.
    fn file_digest(&self, path: &str) -> Result<Option<(u64, String)>, TransportError>;
    /// Runs `<worker> <arg>` (`--version`, `backends`) where jobs run from
    /// (the login node, which shares their filesystem): whether the worker a
    /// job script names exists and starts there, and what it says.
    fn probe_worker(&self, path: &str, arg: &str) -> Result<WorkerProbe, TransportError>;
}

/// What `<worker> <arg>` said on the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerProbe {
    /// It ran: its output (`worker 0.1.0`).
    Runs(String),
    /// It did not: why (not found, not executable, its exit status and last stderr line).
    Fails(String),
}

impl WorkerProbe {
    /// From the exit status and output of `<worker> --version`.
    pub fn from_exit(status: i32, stdout: &str, stderr: &str) -> WorkerProbe {
        let last = |s: &str| s.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
        match status {
            0 => WorkerProbe::Runs(stdout.trim().to_string()),
            127 => WorkerProbe::Fails(format!("not found ({})", last(stderr))),
            126 => WorkerProbe::Fails(format!("not executable ({})", last(stderr))),
            s => WorkerProbe::Fails(format!("exit status {s}: {}", last(stderr))),
        }
    }
}

/// A cluster as the orchestrator uses it: a scheduler and its files.
pub trait Transport: Scheduler {
    fn describe(&self) -> String;
    fn files(&self) -> &dyn FileStore;
    fn counters(&self) -> CounterSnapshot;
}

/// Opens the transport a cluster declares. `state_root` is the local state
/// directory (the `local` transport runs jobs right there).
pub fn open(
    name: &str,
    cluster: &ClusterConfig,
    state_root: &std::path::Path,
) -> Result<Arc<dyn Transport>, TransportError> {
    Ok(match cluster.transport {
        TransportKind::Ssh => {
            let shell = ssh::SshShell::new(name, cluster)?;
            Arc::new(SlurmTransport::new(Arc::new(shell), cluster))
        }
        TransportKind::LocalSlurm => {
            Arc::new(SlurmTransport::new(Arc::new(local_slurm::LocalShell::new(cluster)), cluster))
        }
        TransportKind::Rest => Arc::new(rest::RestTransport::open(name, cluster)?),
        TransportKind::Local => Arc::new(local::LocalTransport::new(cluster, state_root)?),
        TransportKind::Replay => Arc::new(replay::ReplayTransport::new(cluster, state_root)?),
    })
}

/// SLURM through a [`Shell`]: the `ssh` and `local-slurm` transports.
pub struct SlurmTransport {
    shell: Arc<dyn Shell>,
    files: files::Files,
    env: Vec<(String, String)>,
}

impl SlurmTransport {
    pub fn new(shell: Arc<dyn Shell>, cluster: &ClusterConfig) -> Self {
        SlurmTransport {
            files: files::Files::new(shell.clone(), cluster),
            shell,
            env: cluster.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        }
    }

    /// `env K=V … cmd`: the cluster's environment for SLURM commands.
    fn argv(&self, mut argv: Vec<String>) -> Vec<String> {
        if self.env.is_empty() {
            return argv;
        }
        let mut v = vec!["env".to_string()];
        v.extend(self.env.iter().map(|(k, val)| format!("{k}={val}")));
        v.append(&mut argv);
        v
    }

    fn checked(&self, argv: Vec<String>, idempotent: bool) -> Result<ExecOutput, TransportError> {
        // The message names the command, never the environment's values (tokens, secrets).
        let shown = argv.join(" ");
        let argv = self.argv(argv);
        let out = self.shell.run(&argv, idempotent)?;
        if out.status != 0 {
            return Err(TransportError::Command {
                command: shown,
                status: out.status,
                stderr: out.stderr.trim().to_string(),
            });
        }
        Ok(out)
    }
}

impl Transport for SlurmTransport {
    fn describe(&self) -> String {
        self.shell.describe()
    }

    fn files(&self) -> &dyn FileStore {
        &self.files
    }

    fn counters(&self) -> CounterSnapshot {
        self.shell.counters().snapshot()
    }
}

impl Scheduler for SlurmTransport {
    fn max_array_size(&self) -> Result<u32, TransportError> {
        let out = self.checked(slurm::scontrol_config_argv(), true)?;
        Ok(slurm::parse_max_array_size(&out.stdout))
    }

    fn submit(&self, script: &str) -> Result<JobId, TransportError> {
        let out = self.checked(slurm::sbatch_argv(script), false)?;
        Ok(slurm::parse_sbatch(&out.stdout)?)
    }

    fn poll(&self, names: &[String], since: f64) -> Result<Poll, TransportError> {
        let mut poll = Poll::default();
        if names.is_empty() {
            poll.live_ok = true;
            poll.history_ok = true;
            return Ok(poll);
        }
        let live = self.checked(slurm::squeue_argv(names), true).and_then(|o| Ok(slurm::parse_squeue(&o.stdout)?));
        // A day of margin: sacct reads the time in the cluster's local zone.
        let start = crate::fsio::utc_timestamp(since - 86_400.0);
        let hist =
            self.checked(slurm::sacct_argv(names, &start), true).and_then(|o| Ok(slurm::parse_sacct(&o.stdout)?));
        combine(live, hist, ("squeue", "sacct"))
    }

    fn cancel(&self, job_ids: &[JobId]) -> Result<(), TransportError> {
        if job_ids.is_empty() {
            return Ok(());
        }
        self.checked(slurm::scancel_argv(job_ids), true).map(|_| ())
    }
}

/// One poll from the live view (squeue, or slurmctld's job list) and the
/// accounting view (sacct, or slurmdbd's), each of which may have failed;
/// `views` names them in the errors. An error only when neither answered.
pub(crate) fn combine(
    live: Result<Vec<TaskObservation>, TransportError>,
    hist: Result<Vec<TaskObservation>, TransportError>,
    views: (&str, &str),
) -> Result<Poll, TransportError> {
    let mut poll = Poll { commands: 2, ..Poll::default() };
    let live = live.unwrap_or_else(|e| {
        poll.errors.push(format!("{}: {e}", views.0));
        vec![]
    });
    poll.live_ok = poll.errors.is_empty();
    let hist = hist.unwrap_or_else(|e| {
        poll.errors.push(format!("{}: {e}", views.1));
        vec![]
    });
    poll.history_ok = poll.errors.len() == usize::from(!poll.live_ok);
    if !poll.live_ok && !poll.history_ok {
        return Err(TransportError::Other(poll.errors.join("; ")));
    }
    poll.tasks = slurm::merge(live, hist);
    Ok(poll)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_commands_error_names_the_command_not_the_environment() {
        // A real process that fails (`sbatch` of a missing script; `env` exits 127 without SLURM).
        let mut cfg = ClusterConfig::local();
        cfg.transport = TransportKind::LocalSlurm;
        cfg.env.insert("SWEEP_SECRET_TOKEN".into(), "hunter2-secret".into());
        let t = SlurmTransport::new(Arc::new(local_slurm::LocalShell::new(&cfg)), &cfg);
        let e = t.submit("/nonexistent/job.sbatch").expect_err("fails");
        let msg = e.to_string();
        assert!(msg.contains("sbatch"), "{msg}");
        assert!(!msg.contains("hunter2-secret") && !msg.contains("SWEEP_SECRET_TOKEN"), "{msg}");
    }
}
