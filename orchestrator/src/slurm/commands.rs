//! The SLURM command lines the orchestrator runs, and parsers for what
//! `squeue`, `sacct`, `sbatch` and `scontrol` print.

use std::collections::BTreeMap;

use super::{JobId, SlurmState, TaskObservation};

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

/// Splits `n` array tasks into arrays of at most `max_array_size` tasks (ids below it).
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
