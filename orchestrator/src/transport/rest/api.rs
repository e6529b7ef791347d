//! The JSON of slurmrestd's API versions: the paths, the submit request each
//! version expects, and one tolerant reader for the job lists of all of them.
//!
//! What changes between the versions this client speaks:
//!
//! | | v0.0.38 (Slurm 22.05) | v0.0.40 (23.11) | v0.0.41 (24.05), v0.0.42 (24.11) |
//! |---|---|---|---|
//! | script | top-level `script` | top-level `script` | `job.script` |
//! | `job.environment` | object `{K: V}` | array `["K=V"]` | array `["K=V"]` |
//! | limits (`time_limit`, `memory_per_node`) | integer | `{set, infinite, number}` | same |
//! | gres | `job.gres` | `job.tres_per_node` (`gres/…`) | same |
//! | `--signal=B:USR1@120` | none: 22.05 refuses `B:` (the chain's worker signals itself) | `kill_warning_signal`, `_delay`, `_flags: [BATCH_JOB]` | same |
//! | `--open-mode=append` | `job.open_mode: "append"` | `job.open_mode: ["APPEND"]` | same |
//! | job ids, task ids, exit codes (answers) | integer | `{set, infinite, number}` | same |
//! | states (answers) | `"RUNNING"` | `["RUNNING", flags…]` | same |
//!
//! slurmrestd ignores `#SBATCH` lines: the job's options travel in `job`
//! ([`super::directives`] reads them from the rendered script).

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::directives::JobSpec;
use crate::slurm::{self, JobId, ParseError, SlurmState, TaskObservation};

/// The API versions this client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ApiVersion {
    V0038,
    V0040,
    V0041,
    V0042,
}

impl ApiVersion {
    pub const ALL: [ApiVersion; 4] = [ApiVersion::V0038, ApiVersion::V0040, ApiVersion::V0041, ApiVersion::V0042];

    pub fn tag(self) -> &'static str {
        match self {
            ApiVersion::V0038 => "v0.0.38",
            ApiVersion::V0040 => "v0.0.40",
            ApiVersion::V0041 => "v0.0.41",
            ApiVersion::V0042 => "v0.0.42",
        }
    }

    pub fn submit_path(self) -> String {
        format!("/slurm/{}/job/submit", self.tag())
    }

    pub fn jobs_path(self) -> String {
        format!("/slurm/{}/jobs", self.tag())
    }

    pub fn db_jobs_path(self) -> String {
        format!("/slurmdb/{}/jobs", self.tag())
    }

    /// One job (or `ARRAY_TASK`); DELETE cancels it.
    pub fn job_path(self, job_id: &str) -> String {
        format!("/slurm/{}/job/{job_id}", self.tag())
    }

    /// The newest version both this client and the server speak, from the
    /// paths of the server's OpenAPI description (`GET /openapi/v3`): it
    /// must offer submit, the job list and the accounting job list.
    pub fn choose<'a>(paths: impl IntoIterator<Item = &'a str> + Clone) -> Option<ApiVersion> {
        Self::ALL.into_iter().rev().find(|v| {
            let want = [v.submit_path(), v.jobs_path(), v.db_jobs_path()];
            want.iter().all(|w| paths.clone().into_iter().any(|p| p == w))
        })
    }

    /// The `POST …/job/submit` body: the script plus the job's options in this version's shape.
    pub fn submit_body(self, script: &str, job: &JobSpec, env: &[(String, String)]) -> Value {
        let mut j = Map::new();
        let mut put = |k: &str, v: Value| {
            j.insert(k.to_string(), v);
        };
        put("name", json!(job.name));
        if let Some(v) = &job.array {
            put("array", json!(v));
        }
        if let Some(v) = &job.comment {
            put("comment", json!(v));
        }
        if let Some(v) = &job.output {
            put("standard_output", json!(v));
        }
        if let Some(v) = &job.chdir {
            put("current_working_directory", json!(v));
        }
        for (k, v) in [
            ("partition", &job.partition),
            ("account", &job.account),
            ("qos", &job.qos),
            ("constraints", &job.constraint),
        ] {
            if let Some(v) = v {
                put(k, json!(v));
            }
        }
        if let Some(n) = job.ntasks {
            put("tasks", json!(n));
        }
        if let Some(n) = job.cpus_per_task {
            put("cpus_per_task", json!(n));
        }
        let legacy = self == ApiVersion::V0038;
        let limit = |n: u64| if legacy { json!(n) } else { json!({"set": true, "infinite": false, "number": n}) };
        if let Some(m) = job.time_minutes {
            put("time_limit", limit(m));
        }
        if let Some(m) = job.mem_mb {
            put("memory_per_node", limit(m));
        }
        if let Some(g) = &job.gres {
            if legacy {
                put("gres", json!(g));
            } else {
                put("tres_per_node", json!(format!("gres/{}", g.trim_start_matches("gres/"))));
            }
        }
        if let Some(r) = job.requeue {
            put("requeue", json!(r));
        }
        if let Some(a) = job.append {
            let mode = if a { "append" } else { "truncate" };
            put("open_mode", if legacy { json!(mode) } else { json!([mode.to_uppercase()]) });
        }
        if let Some(w) = &job.signal {
            if legacy {
                // v0.0.38 (Slurm 22.05) refuses the `B:` form ("Invalid SIGNAL
                // specification"), and without it only job steps are signalled,
                // never the batch shell: a chain's worker (`--signal-before-s`)
                // sends the signal itself instead.
                if !w.batch {
                    put("signal", json!(w.sbatch()));
                }
            } else {
                put("kill_warning_signal", json!(w.name));
                put("kill_warning_delay", json!({"set": true, "infinite": false, "number": w.seconds}));
                if w.batch {
                    put("kill_warning_flags", json!(["BATCH_JOB"]));
                }
            }
        }
        let environment = if legacy {
            Value::Object(env.iter().map(|(k, v)| (k.clone(), json!(v))).collect())
        } else {
            json!(env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>())
        };
        put("environment", environment);
        match self {
            ApiVersion::V0038 | ApiVersion::V0040 => json!({"script": script, "job": Value::Object(j)}),
            ApiVersion::V0041 | ApiVersion::V0042 => {
                j.insert("script".into(), json!(script));
                json!({"job": Value::Object(j)})
            }
        }
    }
}

/// A number as v0.0.38 writes it (`5`), or as v0.0.40+ does (`{"set": true, "infinite": false, "number": 5}`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Num {
    Plain(i64),
    NoVal {
        #[serde(default = "yes")]
        set: bool,
        #[serde(default)]
        infinite: bool,
        #[serde(default)]
        number: i64,
    },
}

fn yes() -> bool {
    true
}

impl Num {
    pub fn get(&self) -> Option<i64> {
        match *self {
            Num::Plain(n) => Some(n),
            Num::NoVal { set: true, infinite: false, number } => Some(number),
            Num::NoVal { .. } => None,
        }
    }
}

fn num(n: &Option<Num>) -> Option<i64> {
    n.as_ref().and_then(Num::get)
}

/// A state as v0.0.38 writes it (`"RUNNING"`) or as v0.0.40+ does (`["RUNNING", "COMPLETING"]`: the base state first).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum States {
    One(String),
    Many(Vec<String>),
}

impl States {
    pub fn state(&self) -> SlurmState {
        match self {
            States::One(s) => SlurmState::parse(s),
            States::Many(v) => SlurmState::parse(v.first().map(String::as_str).unwrap_or("")),
        }
    }
}

/// One entry of an answer's `errors` list.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ApiError {
    /// `error_number`, or `error_code` in some v0.0.38 answers (submit).
    #[serde(default, alias = "error_code")]
    pub error_number: Option<i64>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub source: Option<String>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = [self.source.as_deref(), self.description.as_deref().or(self.error.as_deref())];
        let text: Vec<&str> = what.into_iter().flatten().filter(|s| !s.is_empty()).collect();
        f.write_str(&text.join(": "))?;
        match (&self.error, &self.description) {
            (Some(e), Some(_)) if !e.is_empty() => write!(f, " ({e})"),
            _ => Ok(()),
        }
    }
}

/// The fields every answer shares.
#[derive(Debug, Default, Deserialize)]
pub struct Envelope {
    #[serde(default)]
    pub errors: Vec<ApiError>,
}

#[derive(Debug, Deserialize)]
pub struct SubmitAnswer {
    #[serde(default)]
    pub job_id: Option<Num>,
    #[serde(default)]
    pub errors: Vec<ApiError>,
}

impl SubmitAnswer {
    pub fn job_id(&self) -> Option<String> {
        num(&self.job_id).filter(|&n| n > 0).map(|n| n.to_string())
    }
}

/// A job list as either view answers it: the jobs and the errors.
#[derive(Debug, Deserialize)]
pub struct Jobs<J> {
    #[serde(default = "Vec::new")]
    pub jobs: Vec<J>,
    #[serde(default)]
    pub errors: Vec<ApiError>,
}

/// `GET /slurm/…/jobs`: what slurmctld holds (squeue's view).
pub type LiveJobs = Jobs<LiveJob>;

#[derive(Debug, Deserialize)]
pub struct LiveJob {
    pub job_id: Num,
    #[serde(default)]
    pub array_job_id: Option<Num>,
    #[serde(default)]
    pub array_task_id: Option<Num>,
    /// The tasks not started yet (`2-23%4`), on the array's own record.
    #[serde(default)]
    pub array_task_string: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub user_name: Option<String>,
    pub job_state: States,
    #[serde(default)]
    pub state_reason: Option<String>,
}

/// `GET /slurmdb/…/jobs`: what accounting holds (sacct's view).
pub type DbJobs = Jobs<DbJob>;

#[derive(Debug, Deserialize)]
pub struct DbJob {
    pub job_id: Num,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub array: Option<DbArray>,
    pub state: DbState,
    #[serde(default)]
    pub exit_code: Option<DbExit>,
}

#[derive(Debug, Deserialize)]
pub struct DbArray {
    #[serde(default)]
    pub job_id: Option<Num>,
    #[serde(default)]
    pub task_id: Option<Num>,
    /// The tasks not started yet, on the array's own record.
    #[serde(default)]
    pub task: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct DbState {
    pub current: States,
}

#[derive(Debug, Deserialize)]
pub struct DbExit {
    #[serde(default)]
    pub return_code: Option<Num>,
    #[serde(default)]
    pub signal: Option<DbSignal>,
}

#[derive(Debug, Deserialize)]
pub struct DbSignal {
    /// v0.0.38 `signal_id`, v0.0.40+ `id`.
    #[serde(default, alias = "signal_id")]
    pub id: Option<Num>,
}

/// Task ids of an array record: its own task, or the range not started yet
/// (`range` names the view and job in the error when that does not parse).
fn task_ids(
    task: Option<i64>,
    pending: Option<&str>,
    range: impl FnOnce(String) -> ParseError,
) -> Result<(Vec<u32>, bool), ParseError> {
    Ok(match (task, pending.filter(|s| !s.is_empty())) {
        (Some(t), _) if t >= 0 => (u32::try_from(t).map(|t| vec![t]).unwrap_or_default(), true),
        (_, Some(r)) => (slurm::expand_ranges(r.trim_matches(['[', ']'])).ok_or_else(|| range(r.to_string()))?, false),
        _ => (vec![], false),
    })
}

/// Whether a job is one of ours: one of the names, and the user's (squeue `--me`).
fn ours(names: &[String], user: &str, name: &str, owner: Option<&str>) -> bool {
    names.iter().any(|n| n == name) && owner.is_none_or(|o| o == user)
}

impl LiveJobs {
    /// squeue's view of the named arrays of `user`, one observation per task.
    pub fn observations(&self, names: &[String], user: &str) -> Result<Vec<TaskObservation>, ParseError> {
        let mut out = Vec::new();
        for j in self.jobs.iter().filter(|j| ours(names, user, &j.name, j.user_name.as_deref())) {
            let Some(array) = num(&j.array_job_id).filter(|&a| a > 0) else { continue };
            let range = |range| ParseError::TaskRange { view: "slurmrestd jobs", job: array.to_string(), range };
            let (ids, single) = task_ids(num(&j.array_task_id), j.array_task_string.as_deref(), range)?;
            for task_id in ids {
                out.push(TaskObservation {
                    array_job_id: JobId::from(array.to_string()),
                    task_id,
                    job_id: single.then(|| j.job_id.get().map(|n| JobId::from(n.to_string()))).flatten(),
                    name: j.name.clone(),
                    state: j.job_state.state(),
                    detail: j.state_reason.clone().filter(|r| !r.is_empty() && r != "None"),
                });
            }
        }
        Ok(out)
    }
}

impl DbJobs {
    /// sacct's view of the named arrays of `user`; `detail` is the exit code `N:S`.
    pub fn observations(&self, names: &[String], user: &str) -> Result<Vec<TaskObservation>, ParseError> {
        let mut out = Vec::new();
        for j in self.jobs.iter().filter(|j| ours(names, user, &j.name, j.user.as_deref())) {
            let Some(a) = &j.array else { continue };
            let Some(array) = num(&a.job_id).filter(|&n| n > 0) else { continue };
            let range = |range| ParseError::TaskRange { view: "slurmdbd jobs", job: array.to_string(), range };
            let (ids, single) = task_ids(num(&a.task_id), a.task.as_deref(), range)?;
            let detail = j.exit_code.as_ref().and_then(|e| {
                let rc = num(&e.return_code)?;
                let sig = e.signal.as_ref().and_then(|s| num(&s.id)).unwrap_or(0);
                Some(format!("{rc}:{sig}"))
            });
            for task_id in ids {
                out.push(TaskObservation {
                    array_job_id: JobId::from(array.to_string()),
                    task_id,
                    job_id: single.then(|| j.job_id.get().map(|n| JobId::from(n.to_string()))).flatten(),
                    name: j.name.clone(),
                    state: j.state.current.state(),
                    detail: detail.clone(),
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
#[path = "api_tests.rs"]
mod tests;
