//! SLURM's vocabulary: job states, how the orchestrator acts on each, the
//! command lines it runs, and parsers for what `squeue`, `sacct`, `sbatch` and
//! `scontrol` print.
//!
//! Everything here is pure text in, data out, so the unit tests run on output
//! recorded from a real cluster (SLURM 22.05) without one.

use serde::{Deserialize, Serialize};

use crate::collect::WorkerOutcome;
use std::collections::BTreeMap;
use std::fmt;

/// Every state SLURM reports for a job (squeue `%T`, sacct `State`).
///
/// The thirteen the orchestrator acts on are named; the transient or rare rest
/// (`COMPLETING`, `CONFIGURING`, `STAGE_OUT`, `SIGNALING`, `RESIZING`,
/// `REQUEUE_HOLD`, `REQUEUE_FED`, `RESV_DEL_HOLD`, `SPECIAL_EXIT`, `STOPPED`,
/// `REVOKED`) are kept verbatim and mapped by [`SlurmState::activity`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SlurmState {
    Pending,
    Running,
    Requeued,
    Suspended,
    Preempted,
    Completed,
    Failed,
    Timeout,
    OutOfMemory,
    NodeFail,
    Cancelled,
    BootFail,
    Deadline,
    Other(String),
}

/// Where a job is in its life, which is what decides what `resume` may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activity {
    /// Waiting for resources (pending, requeued, held).
    Queued,
    /// Holding resources (running, suspended, completing).
    Running,
    /// Finished, one way or another.
    Ended,
}

impl SlurmState {
    pub fn name(&self) -> &str {
        match self {
            SlurmState::Pending => "PENDING",
            SlurmState::Running => "RUNNING",
            SlurmState::Requeued => "REQUEUED",
            SlurmState::Suspended => "SUSPENDED",
            SlurmState::Preempted => "PREEMPTED",
            SlurmState::Completed => "COMPLETED",
            SlurmState::Failed => "FAILED",
            SlurmState::Timeout => "TIMEOUT",
            SlurmState::OutOfMemory => "OUT_OF_MEMORY",
            SlurmState::NodeFail => "NODE_FAIL",
            SlurmState::Cancelled => "CANCELLED",
            SlurmState::BootFail => "BOOT_FAIL",
            SlurmState::Deadline => "DEADLINE",
            SlurmState::Other(s) => s,
        }
    }

    /// Parses a long name (`CANCELLED by 1000`, `RUNNING`) or a squeue short code
    /// (`PD`, `CA`). Never fails: an unknown state is kept as `Other`.
    pub fn parse(text: &str) -> SlurmState {
        // sacct appends who cancelled ("CANCELLED by 0") and `+` for a requeued job.
        let word = text.split_whitespace().next().unwrap_or("").trim_end_matches('+');
        match word.to_ascii_uppercase().as_str() {
            "PENDING" | "PD" => SlurmState::Pending,
            "RUNNING" | "R" => SlurmState::Running,
            "REQUEUED" | "RQ" => SlurmState::Requeued,
            "SUSPENDED" | "S" => SlurmState::Suspended,
            "PREEMPTED" | "PR" => SlurmState::Preempted,
            "COMPLETED" | "CD" => SlurmState::Completed,
            "FAILED" | "F" => SlurmState::Failed,
            "TIMEOUT" | "TO" => SlurmState::Timeout,
            "OUT_OF_MEMORY" | "OUT_OF_ME" | "OOM" => SlurmState::OutOfMemory,
            "NODE_FAIL" | "NF" => SlurmState::NodeFail,
            "CANCELLED" | "CA" => SlurmState::Cancelled,
            "BOOT_FAIL" | "BF" => SlurmState::BootFail,
            "DEADLINE" | "DL" => SlurmState::Deadline,
            "CG" => SlurmState::Other("COMPLETING".into()),
            "CF" => SlurmState::Other("CONFIGURING".into()),
            "SE" => SlurmState::Other("SPECIAL_EXIT".into()),
            "SO" => SlurmState::Other("STAGE_OUT".into()),
            "ST" => SlurmState::Other("STOPPED".into()),
            "SI" => SlurmState::Other("SIGNALING".into()),
            "RH" => SlurmState::Other("REQUEUE_HOLD".into()),
            "RF" => SlurmState::Other("REQUEUE_FED".into()),
            "RD" => SlurmState::Other("RESV_DEL_HOLD".into()),
            "RS" => SlurmState::Other("RESIZING".into()),
            "RV" => SlurmState::Other("REVOKED".into()),
            other => SlurmState::Other(other.to_string()),
        }
    }

    pub fn activity(&self) -> Activity {
        match self {
            SlurmState::Pending | SlurmState::Requeued => Activity::Queued,
            SlurmState::Running | SlurmState::Suspended => Activity::Running,
            SlurmState::Preempted
            | SlurmState::Completed
            | SlurmState::Failed
            | SlurmState::Timeout
            | SlurmState::OutOfMemory
            | SlurmState::NodeFail
            | SlurmState::Cancelled
            | SlurmState::BootFail
            | SlurmState::Deadline => Activity::Ended,
            SlurmState::Other(s) => match s.as_str() {
                // Still holding the node, or about to.
                "COMPLETING" | "CONFIGURING" | "STAGE_OUT" | "SIGNALING" | "RESIZING" | "STOPPED" => Activity::Running,
                // Held in the queue (a requeue that waits for release).
                "REQUEUE_HOLD" | "REQUEUE_FED" | "RESV_DEL_HOLD" | "SPECIAL_EXIT" => Activity::Queued,
                // REVOKED (federation) and anything newer: the job is not ours to wait for.
                _ => Activity::Ended,
            },
        }
    }

    pub fn is_ended(&self) -> bool {
        self.activity() == Activity::Ended
    }
}

impl fmt::Display for SlurmState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for SlurmState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for SlurmState {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(SlurmState::parse(&s))
    }
}

/// Which ended jobs `resume` submits again. A config that completed, ran out of
/// memory in the worker's own measurement, or is still queued/running is
/// never resubmitted, whatever the policy. [`RetryPolicy::refusal`] is the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// TIMEOUT: retried by default, since the usual fix is a longer `slurm.time`
    /// in the experiment file, which a resubmission picks up.
    pub timeout: bool,
    /// CANCELLED (by `scancel`, `orchestrator cancel`, or an admin): retried by
    /// default, since `resume` after a cancel means "carry on".
    pub cancelled: bool,
    /// A real error: the worker recorded `failed`, or the job script FAILED
    /// before the worker started (missing binary, unreadable manifest). Not by
    /// default; such a crash recurs.
    pub failed: bool,
    /// The worker was killed from outside before it could write a result
    /// (SIGKILL, the host's OOM killer: FAILED or OUT_OF_MEMORY without a
    /// `result` line). Retried by default: nothing was measured, and the
    /// cause is usually the node, not the config.
    #[serde(default = "yes")]
    pub killed: bool,
    /// Attempts per config, the first included.
    pub max_attempts: u32,
}

fn yes() -> bool {
    true
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { timeout: true, cancelled: true, failed: false, killed: true, max_attempts: 3 }
    }
}

impl RetryPolicy {
    /// Whether a job that ended in `state` may run again, by SLURM's state
    /// alone. NODE_FAIL, PREEMPTED and BOOT_FAIL are the cluster's fault:
    /// always retryable. OUT_OF_MEMORY (host RAM, cgroup) and DEADLINE would
    /// recur: never.
    pub fn retryable(&self, state: &SlurmState) -> bool {
        match state {
            SlurmState::NodeFail | SlurmState::Preempted | SlurmState::BootFail => true,
            SlurmState::Timeout => self.timeout,
            SlurmState::Cancelled => self.cancelled,
            SlurmState::Failed => self.failed,
            SlurmState::Completed | SlurmState::OutOfMemory | SlurmState::Deadline => false,
            SlurmState::Other(_) => false,
            SlurmState::Pending | SlurmState::Running | SlurmState::Requeued | SlurmState::Suspended => false,
        }
    }

    /// Why an attempt that ended in `state` must not run again, or `None` when
    /// it may. The one place SLURM's state and the worker's result meet; the
    /// worker's result wins because it knows what happened inside the job:
    ///
    /// | worker says | SLURM state | resubmitted |
    /// |---|---|---|
    /// | `ok` | any | never (completed) |
    /// | `oom` | any (FAILED: exit 3) | never (measured OOM) |
    /// | `failed` | any | with `--retry-failed` |
    /// | `cancelled` | TIMEOUT / other | per `timeout` / `cancelled` |
    /// | started, no result | FAILED, OUT_OF_MEMORY | yes, unless `--no-retry-killed` (killed) |
    /// | not started | OUT_OF_MEMORY | yes, unless `--no-retry-killed` (killed) |
    /// | no result | any other | by the state ([`Self::retryable`]) |
    pub fn refusal(&self, state: &SlurmState, worker: WorkerOutcome) -> Option<String> {
        use spec::event::RunStatus;
        let killed = matches!(
            (worker, state),
            (WorkerOutcome::NoResult, SlurmState::Failed | SlurmState::OutOfMemory)
                | (WorkerOutcome::NotStarted, SlurmState::OutOfMemory)
        );
        match worker {
            WorkerOutcome::Result(RunStatus::Ok) => Some("completed".into()),
            WorkerOutcome::Result(RunStatus::Oom) => Some("measured oom".into()),
            WorkerOutcome::Result(RunStatus::Failed) => {
                (!self.failed).then(|| format!("worker failed, job {state} (use --retry-failed)"))
            }
            WorkerOutcome::Result(RunStatus::Cancelled) => {
                let (allowed, flag) = match state {
                    SlurmState::Timeout => (self.timeout, "--no-retry-timeout"),
                    _ => (self.cancelled, "--no-retry-cancelled"),
                };
                (!allowed).then(|| format!("worker cancelled, job {state} ({flag})"))
            }
            _ if killed => (!self.killed).then(|| format!("worker killed, job {state} (--no-retry-killed)")),
            _ if self.retryable(state) => None,
            WorkerOutcome::NotStarted if *state == SlurmState::Failed => {
                Some(format!("ended {state} before the worker started (use --retry-failed)"))
            }
            _ => Some(format!("ended {state}")),
        }
    }
}

/// A SLURM job id: an array's (`34`), an array task's own (`37`), or one
/// task of an array (`34_2`, for `scancel`). Kept as SLURM prints it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(String);

impl JobId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for JobId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<&str> for JobId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<JobId> for &str {
    fn eq(&self, other: &JobId) -> bool {
        *self == other.0
    }
}

impl From<&str> for JobId {
    fn from(s: &str) -> JobId {
        JobId(s.to_string())
    }
}

impl From<String> for JobId {
    fn from(s: String) -> JobId {
        JobId(s)
    }
}

/// One array task as `squeue` or `sacct` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskObservation {
    /// The array's job id (`%F`, the part of `JobID` before `_`).
    pub array_job_id: JobId,
    pub task_id: u32,
    /// The task's own job id (`%A` / `JobIDRaw`), once SLURM has given it one.
    pub job_id: Option<JobId>,
    pub name: String,
    pub state: SlurmState,
    /// Why it is pending (squeue), or the exit code `N:S` (sacct).
    pub detail: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ParseError {
    #[error("unexpected {command} output line {line}: `{text}` ({why})")]
    Line { command: &'static str, line: usize, text: String, why: &'static str },
    #[error("sbatch printed no job id: `{0}`")]
    Sbatch(String),
    /// A pending array's task range that does not parse: an error, never "no tasks"
    /// (which a poll would read as the tasks having left the queue).
    #[error("{view}: job {job}: pending task range `{range}` does not parse")]
    TaskRange { view: &'static str, job: String, range: String },
}

/// The `squeue` format the parser expects: one line per array task (`--array`).
pub const SQUEUE_FORMAT: &str = "%i|%A|%F|%K|%j|%T|%r";
/// The `sacct` fields the parser expects, with `--parsable2`.
pub const SACCT_FORMAT: &str = "JobID,JobIDRaw,JobName,State,ExitCode";

/// `squeue` for every task of the named jobs of this user: one command whatever
/// the sweep's size. `--states=all` keeps jobs that ended less than MinJobAge
/// ago (default 300 s) in the answer: slurmctld itself vouches for a job that
/// `sacct` may not have yet (slurmdbd records asynchronously), so a job that
/// finished within seconds of `sbatch` is never mistaken for one never submitted.
pub fn squeue_argv(names: &[String]) -> Vec<String> {
    vec![
        "squeue".into(),
        "--noheader".into(),
        "--array".into(),
        "--me".into(),
        "--states=all".into(),
        format!("--name={}", names.join(",")),
        format!("--format={SQUEUE_FORMAT}"),
    ]
}

/// `sacct` for the named jobs since `start` (`YYYY-MM-DDTHH:MM:SS`), allocations only.
pub fn sacct_argv(names: &[String], start: &str) -> Vec<String> {
    vec![
        "sacct".into(),
        "--noheader".into(),
        "--parsable2".into(),
        "--allocations".into(),
        format!("--starttime={start}"),
        "--endtime=now".into(),
        format!("--name={}", names.join(",")),
        format!("--format={SACCT_FORMAT}"),
    ]
}

pub fn sbatch_argv(script: &str) -> Vec<String> {
    vec!["sbatch".into(), "--parsable".into(), script.into()]
}

pub fn scancel_argv(job_ids: &[JobId]) -> Vec<String> {
    let mut v = vec!["scancel".to_string()];
    v.extend(job_ids.iter().map(|j| j.to_string()));
    v
}

pub fn scontrol_config_argv() -> Vec<String> {
    vec!["scontrol".into(), "show".into(), "config".into()]
}

/// `sbatch --parsable` prints `123` or `123;cluster`.
pub fn parse_sbatch(stdout: &str) -> Result<JobId, ParseError> {
    let line = stdout.lines().map(str::trim).rfind(|l| !l.is_empty()).unwrap_or("");
    let id = line.split(';').next().unwrap_or("");
    if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) {
        Ok(JobId::from(id))
    } else {
        Err(ParseError::Sbatch(stdout.trim().to_string()))
    }
}

/// `MaxArraySize` from `scontrol show config` (task ids must stay below it);
/// SLURM's default 1001 when the line is missing.
pub fn parse_max_array_size(stdout: &str) -> u32 {
    stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == "MaxArraySize")
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(1001)
}

/// Parses `squeue --array --format=SQUEUE_FORMAT` output.
pub fn parse_squeue(stdout: &str) -> Result<Vec<TaskObservation>, ParseError> {
    let mut out = Vec::new();
    for (i, raw) in stdout.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let err = |why| ParseError::Line { command: "squeue", line: i + 1, text: line.to_string(), why };
        let f: Vec<&str> = line.split('|').collect();
        if f.len() != 7 {
            return Err(err("expected 7 `|`-separated fields"));
        }
        let task_id = f[3].parse::<u32>().map_err(|_| err("array task id is not a number"))?;
        out.push(TaskObservation {
            array_job_id: JobId::from(f[2]),
            task_id,
            job_id: Some(JobId::from(f[1])),
            name: f[4].to_string(),
            state: SlurmState::parse(f[5]),
            detail: match f[6] {
                "" | "None" => None,
                r => Some(r.to_string()),
            },
        });
    }
    Ok(out)
}

/// Parses `sacct --parsable2 --format=SACCT_FORMAT` output. A pending array's
/// unstarted tasks come as one line (`12_[4-9%2]`) and are expanded.
pub fn parse_sacct(stdout: &str) -> Result<Vec<TaskObservation>, ParseError> {
    let mut out = Vec::new();
    for (i, raw) in stdout.lines().enumerate() {
        let line = raw.trim_end_matches(['\r', '\n']);
        if line.trim().is_empty() {
            continue;
        }
        let err = |why| ParseError::Line { command: "sacct", line: i + 1, text: line.to_string(), why };
        let f: Vec<&str> = line.split('|').collect();
        if f.len() != 5 {
            return Err(err("expected 5 `|`-separated fields"));
        }
        let Some((array, tasks)) = f[0].split_once('_') else {
            // A plain job (not an array): none of ours, skip.
            continue;
        };
        // Steps (`12_3.batch`) only appear without --allocations; skip them anyway.
        if tasks.contains('.') {
            continue;
        }
        let ids = if let Some(list) = tasks.strip_prefix('[') {
            let list = list.trim_end_matches(']');
            expand_ranges(list).ok_or_else(|| err("bad array task range"))?
        } else {
            vec![tasks.parse::<u32>().map_err(|_| err("array task id is not a number"))?]
        };
        let single = ids.len() == 1 && !tasks.starts_with('[');
        for task_id in ids {
            out.push(TaskObservation {
                array_job_id: JobId::from(array),
                task_id,
                job_id: if single { Some(JobId::from(f[1])) } else { None },
                name: f[2].to_string(),
                state: SlurmState::parse(f[3]),
                detail: Some(f[4].to_string()).filter(|s| !s.is_empty()),
            });
        }
    }
    Ok(out)
}

/// `4-9%2` / `1,3,5-7` → ids (the `%K` throttle dropped).
pub fn expand_ranges(list: &str) -> Option<Vec<u32>> {
    let list = list.split('%').next()?;
    let mut ids = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let part = part.split(':').next()?; // `0-15:4` step syntax: steps never used here
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?);
                if b < a || b - a > 1_000_000 {
                    return None;
                }
                ids.extend(a..=b);
            }
            None => ids.push(part.parse().ok()?),
        }
    }
    Some(ids)
}

/// Merges one poll: squeue is live and wins for tasks it lists; sacct fills in
/// the ones that left the controller. Keyed by (array job id, task id).
pub fn merge(squeue: Vec<TaskObservation>, sacct: Vec<TaskObservation>) -> BTreeMap<(JobId, u32), TaskObservation> {
    let mut map = BTreeMap::new();
    for o in sacct {
        let key = (o.array_job_id.clone(), o.task_id);
        match map.get(&key) {
            // A task's own row beats its array's "[range] PENDING" row.
            Some(TaskObservation { job_id: Some(_), .. }) if o.job_id.is_none() => {}
            _ => {
                map.insert(key, o);
            }
        }
    }
    for o in squeue {
        map.insert((o.array_job_id.clone(), o.task_id), o);
    }
    map
}

/// The `--array` value for `n` tasks (0-based), throttled to `parallel`.
pub fn array_spec(n: usize, parallel: Option<u32>) -> String {
    let base = if n <= 1 { "0".to_string() } else { format!("0-{}", n - 1) };
    match parallel {
        Some(k) if k > 0 && (k as usize) < n => format!("{base}%{k}"),
        _ => base,
    }
}

/// Splits `n` configs into arrays of at most `max_array_size` tasks (ids below it).
pub fn chunks(n: usize, max_array_size: u32) -> Vec<std::ops::Range<usize>> {
    let size = (max_array_size.max(1)) as usize;
    (0..n).step_by(size).map(|s| s..(s + size).min(n)).collect()
}

/// Keeps only characters SLURM and the shell treat literally, so names made
/// from user input can go into `--job-name`, paths and `--name=` filters unquoted.
pub fn slug(s: &str, max: usize) -> String {
    let mut out: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '.' { c } else { '-' }).take(max).collect();
    if out.is_empty() {
        out.push('x');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Recorded on the test cluster (SLURM 22.05.8): an array of 5 with %2.
    const SQUEUE: &str = "\
1_2|1|1|2|sw-a b|PENDING|JobArrayTaskLimit
1_3|1|1|3|sw-a b|PENDING|JobArrayTaskLimit
1_4|1|1|4|sw-a b|PENDING|JobArrayTaskLimit
1_0|2|1|0|sw-a b|RUNNING|None
1_1|3|1|1|sw-a b|RUNNING|None
";
    const SACCT: &str = "\
1_0|2|sw-a b|COMPLETED|0:0
1_1|3|sw-a b|CANCELLED by 0|0:15
1_[2-4%2]|1|sw-a b|PENDING|0:0
7_3|12|sw-x|NODE_FAIL|0:0
7_4|13|sw-x|TIMEOUT|0:1
7_5|14|sw-x|OUT_OF_MEMORY|0:125
";

    #[test]
    fn squeue_lines_become_tasks() {
        let t = parse_squeue(SQUEUE).expect("parses");
        assert_eq!(t.len(), 5);
        assert_eq!(t[0].array_job_id, "1");
        assert_eq!(t[0].task_id, 2);
        assert_eq!(t[0].state, SlurmState::Pending);
        assert_eq!(t[0].detail.as_deref(), Some("JobArrayTaskLimit"));
        assert_eq!(t[3].job_id.as_deref(), Some("2"));
        assert_eq!(t[3].state, SlurmState::Running);
        assert_eq!(t[3].detail, None);
    }

    #[test]
    fn sacct_expands_pending_ranges_and_strips_cancel_author() {
        let t = parse_sacct(SACCT).expect("parses");
        let ids: Vec<_> = t.iter().map(|o| (o.array_job_id.as_str(), o.task_id)).collect();
        assert_eq!(ids, [("1", 0), ("1", 1), ("1", 2), ("1", 3), ("1", 4), ("7", 3), ("7", 4), ("7", 5)]);
        assert_eq!(t[1].state, SlurmState::Cancelled);
        assert_eq!(t[2].job_id, None);
        assert_eq!(t[5].state, SlurmState::NodeFail);
        assert_eq!(t[7].state, SlurmState::OutOfMemory);
    }

    #[test]
    fn merge_prefers_live_squeue_rows() {
        let m = merge(parse_squeue(SQUEUE).expect("squeue"), parse_sacct(SACCT).expect("sacct"));
        assert_eq!(m[&("1".into(), 1)].state, SlurmState::Running, "squeue is live");
        assert_eq!(m[&("1".into(), 0)].state, SlurmState::Running);
        assert_eq!(m[&("7".into(), 4)].state, SlurmState::Timeout, "only sacct knows it");
        assert_eq!(m.len(), 8);
    }

    #[test]
    fn bad_lines_are_errors_not_guesses() {
        assert!(parse_squeue("1_2|1|1|x|n|PENDING|None").is_err());
        assert!(parse_squeue("garbage").is_err());
        assert!(parse_sacct("1_[2-x]|1|n|PENDING|0:0").is_err());
    }

    #[test]
    fn every_slurm_state_maps() {
        use Activity::*;
        let cases = [
            ("PENDING", Queued),
            ("RUNNING", Running),
            ("REQUEUED", Queued),
            ("SUSPENDED", Running),
            ("PREEMPTED", Ended),
            ("COMPLETED", Ended),
            ("FAILED", Ended),
            ("TIMEOUT", Ended),
            ("OUT_OF_MEMORY", Ended),
            ("NODE_FAIL", Ended),
            ("CANCELLED", Ended),
            ("BOOT_FAIL", Ended),
            ("DEADLINE", Ended),
            ("COMPLETING", Running),
            ("REQUEUE_HOLD", Queued),
            ("PD", Queued),
            ("CG", Running),
        ];
        for (s, a) in cases {
            let st = SlurmState::parse(s);
            assert_eq!(st.activity(), a, "{s}");
        }
        // Named states round-trip through their names.
        for s in [
            "PENDING",
            "RUNNING",
            "REQUEUED",
            "SUSPENDED",
            "PREEMPTED",
            "COMPLETED",
            "FAILED",
            "TIMEOUT",
            "OUT_OF_MEMORY",
            "NODE_FAIL",
            "CANCELLED",
            "BOOT_FAIL",
            "DEADLINE",
        ] {
            let st = SlurmState::parse(s);
            assert!(!matches!(st, SlurmState::Other(_)), "{s} is a named state");
            assert_eq!(st.name(), s);
        }
    }

    #[test]
    fn retry_policy_follows_the_issue() {
        let p = RetryPolicy::default();
        for s in ["NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "TIMEOUT", "CANCELLED"] {
            assert!(p.retryable(&SlurmState::parse(s)), "{s} retryable");
        }
        for s in ["COMPLETED", "OUT_OF_MEMORY", "DEADLINE", "FAILED", "PENDING", "RUNNING", "REQUEUED", "SUSPENDED"] {
            assert!(!p.retryable(&SlurmState::parse(s)), "{s} not retryable");
        }
        let strict = RetryPolicy { timeout: false, ..p };
        assert!(!strict.retryable(&SlurmState::Timeout));
    }

    #[test]
    fn the_worker_result_decides_over_the_slurm_state() {
        use spec::event::RunStatus;
        use WorkerOutcome::*;
        let p = RetryPolicy::default();
        let failed = SlurmState::Failed;
        // A measured OOM is a result: never again, although SLURM says FAILED (exit 3).
        assert_eq!(p.refusal(&failed, Result(RunStatus::Oom)).as_deref(), Some("measured oom"));
        assert!(p.refusal(&SlurmState::NodeFail, Result(RunStatus::Oom)).is_some());
        assert!(p.refusal(&SlurmState::Completed, Result(RunStatus::Ok)).is_some());
        // Killed from outside (SIGKILL, host OOM killer): nothing measured, retried.
        assert_eq!(p.refusal(&failed, NoResult), None);
        assert_eq!(p.refusal(&SlurmState::OutOfMemory, NoResult), None);
        assert_eq!(p.refusal(&SlurmState::OutOfMemory, NotStarted), None);
        assert_eq!(p.refusal(&SlurmState::NodeFail, NoResult), None);
        assert_eq!(p.refusal(&SlurmState::NodeFail, NotStarted), None);
        let no_killed = RetryPolicy { killed: false, ..p };
        assert!(no_killed.refusal(&failed, NoResult).unwrap().contains("--no-retry-killed"));
        assert_eq!(no_killed.refusal(&SlurmState::NodeFail, NoResult), None, "node failures always");
        // A real error stays down unless asked.
        assert!(p.refusal(&failed, Result(RunStatus::Failed)).unwrap().contains("--retry-failed"));
        assert!(p.refusal(&failed, NotStarted).unwrap().contains("before the worker started"));
        let retry_failed = RetryPolicy { failed: true, ..p };
        assert_eq!(retry_failed.refusal(&failed, Result(RunStatus::Failed)), None);
        assert_eq!(retry_failed.refusal(&failed, NotStarted), None);
        // Cancelled by the worker's SIGTERM handler: the time limit or a cancel.
        assert_eq!(p.refusal(&SlurmState::Timeout, Result(RunStatus::Cancelled)), None);
        assert_eq!(p.refusal(&SlurmState::Cancelled, Result(RunStatus::Cancelled)), None);
        let strict = RetryPolicy { timeout: false, cancelled: false, ..p };
        assert!(strict.refusal(&SlurmState::Timeout, Result(RunStatus::Cancelled)).is_some());
        assert!(strict.refusal(&SlurmState::Cancelled, NoResult).is_some());
        assert!(p.refusal(&SlurmState::Deadline, NoResult).is_some());
    }

    #[test]
    fn sbatch_and_scontrol_outputs() {
        assert_eq!(parse_sbatch("1234\n"), Ok("1234".into()));
        assert_eq!(parse_sbatch("1234;idun\n"), Ok("1234".into()));
        assert!(parse_sbatch("sbatch: error: invalid partition").is_err());
        let cfg = "Configuration data as of 2026-01-01\nMaxArraySize            = 100\nMaxJobCount = 10000\n";
        assert_eq!(parse_max_array_size(cfg), 100);
        assert_eq!(parse_max_array_size("nothing"), 1001);
    }

    #[test]
    fn arrays_are_split_below_max_array_size() {
        assert_eq!(chunks(120, 100), vec![0..100, 100..120]);
        assert_eq!(chunks(20, 1001), vec![0..20]);
        assert_eq!(array_spec(20, Some(4)), "0-19%4");
        assert_eq!(array_spec(20, None), "0-19");
        assert_eq!(array_spec(1, Some(4)), "0");
        assert_eq!(array_spec(3, Some(8)), "0-2");
    }

    #[test]
    fn slugs_are_inert() {
        assert_eq!(slug("exp9", 20), "exp9");
        assert_eq!(slug("$(touch /tmp/x)'\n", 40), "--touch--tmp-x---");
        assert_eq!(slug("", 5), "x");
    }
}
