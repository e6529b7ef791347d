//! The `local` transport: no SLURM. A submitted script runs here as a job
//! array of local processes, at most `max_parallel` at a time, with the
//! environment SLURM would give it (`SLURM_JOB_ID`, `SLURM_ARRAY_JOB_ID`,
//! `SLURM_ARRAY_TASK_ID`, …), so the very scripts rendered for a cluster run
//! unchanged on a laptop.
//!
//! Each job gets `<state>/.local-jobs/<id>/` with `job.json`, the script, and
//! one state file per task (`RUNNING <jobid>` / `ENDED <jobid> <exit>`), written
//! by a small detached runner (bash + `xargs -P`) that outlives the
//! orchestrator, as a SLURM job outlives `sbatch`. Polls read those files;
//! `cancel` signals the runner's process group.
//!
//! A submission is all or nothing, as `sbatch` makes one, wherever the
//! orchestrator is interrupted: the runner starts first but runs no task
//! until `job.json` (with `runner.pid`) is on disk. It waits on a pipe from
//! the orchestrator, which writes `go` once the job is recorded; when the
//! pipe closes without it (the orchestrator died), the runner runs the job
//! only if `job.json` made it to disk, and otherwise leaves without a trace
//! that a poll would read.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::disk::OnDisk;
use super::{CounterSnapshot, Counters, FileStore, Poll, Scheduler, Transport, TransportError, WorkerProbe};
use crate::cluster::ClusterConfig;
use crate::slurm::{expand_ranges, JobId, SlurmState, TaskObservation};

const RUNNER: &str = r#"#!/bin/bash
# Local job-array runner written by the orchestrator's `local` transport.
set -u
cd "$JOBDIR" || exit 1
# No task before the job is recorded: `go`, or the orchestrator gone (EOF) with job.json on disk.
read -r _ || true
[ -e job.json ] || exit 0
exec </dev/null
run_task() {
    local i=$1 jid=$((ARRAY_ID + 1 + $1)) out rc
    printf 'RUNNING %s\n' "$jid" >"tasks/$i.tmp" && mv "tasks/$i.tmp" "tasks/$i"
    out=${OUTPUT_PATTERN//%A/$ARRAY_ID}; out=${out//%a/$i}; out=${out//%j/$jid}
    mkdir -p "$(dirname "$out")"
    (
        cd "$CHDIR" || exit 1
        export SLURM_JOB_ID=$jid SLURM_ARRAY_JOB_ID=$ARRAY_ID SLURM_ARRAY_TASK_ID=$i \
            SLURM_JOB_NAME=$JOB_NAME SLURM_ARRAY_TASK_COUNT=$NTASKS SLURM_ARRAY_TASK_MIN=0 \
            SLURM_ARRAY_TASK_MAX=$((NTASKS - 1)) SLURM_SUBMIT_DIR=$CHDIR SLURM_CLUSTER_NAME=local \
            SLURM_JOB_NUM_NODES=1 SLURM_NTASKS=1
        exec bash "$JOBDIR/job.sbatch"
    ) >"$out" 2>&1 </dev/null
    rc=$?
    printf 'ENDED %s %s\n' "$jid" "$rc" >"tasks/$i.tmp" && mv "tasks/$i.tmp" "tasks/$i"
}
export -f run_task
mkdir -p tasks
printf '%s\n' $TASK_IDS | xargs -P "$PARALLEL" -I{} bash -c 'run_task "$1"' _ {}
touch finished
"#;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct LocalJob {
    id: u64,
    name: String,
    comment: String,
    tasks: Vec<u32>,
    parallel: u32,
    submitted: f64,
}

pub struct LocalTransport {
    jobs_dir: PathBuf,
    state_root: PathBuf,
    worker: Option<String>,
    max_parallel: u32,
    counters: Counters,
}

fn ferr(path: &Path, e: impl std::fmt::Display) -> TransportError {
    TransportError::File { target: "local".into(), path: path.display().to_string(), message: e.to_string() }
}

/// The `#SBATCH` options the runner honours.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Directives {
    pub(super) array: Option<String>,
    pub(super) job_name: Option<String>,
    pub(super) comment: Option<String>,
    pub(super) output: Option<String>,
    pub(super) chdir: Option<String>,
}

pub(super) fn directives(script: &str) -> Directives {
    let mut d = Directives::default();
    for line in script.lines() {
        let Some(rest) = line.strip_prefix("#SBATCH") else { continue };
        let rest = rest.trim();
        let (k, v) = match rest.split_once('=') {
            Some((k, v)) => (k.trim(), v.trim().trim_matches(|c| c == '\'' || c == '"').to_string()),
            None => continue,
        };
        match k {
            "--array" | "-a" => d.array = Some(v),
            "--job-name" | "-J" => d.job_name = Some(v),
            "--comment" => d.comment = Some(v),
            "--output" | "-o" => d.output = Some(v),
            "--chdir" | "-D" => d.chdir = Some(v),
            _ => {}
        }
    }
    d
}

/// Reserves `n` consecutive job ids under a lock (several orchestrators on
/// different experiments share the counter). The counter is replaced
/// atomically, so it is never torn; one that does not parse is an error
/// (starting again at 1000 would reuse job ids).
pub(super) fn reserve_ids(jobs_dir: &Path, n: u64) -> Result<u64, TransportError> {
    use fs2::FileExt;
    std::fs::create_dir_all(jobs_dir).map_err(|e| ferr(jobs_dir, e))?;
    let lock_path = jobs_dir.join("next_id.lock");
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|e| ferr(&lock_path, e))?;
    lock.lock_exclusive().map_err(|e| ferr(&lock_path, e))?;
    let p = jobs_dir.join("next_id");
    let first: u64 = match std::fs::read_to_string(&p) {
        Ok(s) => s.trim().parse().map_err(|_| {
            TransportError::Other(format!(
                "{}: `{}` is not a job id counter; job ids would be reused (set it above the \
                 highest job under {}, or remove it if that folder is empty)",
                p.display(),
                s.trim(),
                jobs_dir.display()
            ))
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 1000,
        Err(e) => return Err(ferr(&p, e)),
    };
    crate::fsio::write_atomic(&p, (first + n).to_string().as_bytes())
        .map_err(|e| TransportError::Other(e.to_string()))?;
    Ok(first)
}

fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence and permission.
    pid > 0 && unsafe { libc::kill(pid, 0) } == 0
}

impl LocalTransport {
    pub fn new(cluster: &ClusterConfig, state_root: &Path) -> Result<Self, TransportError> {
        let state_root = std::path::absolute(state_root).map_err(|e| ferr(state_root, e))?;
        let state_root = match &cluster.work_dir {
            Some(w) => std::path::absolute(Path::new(w)).map_err(|e| ferr(Path::new(w), e))?.join("state"),
            None => state_root,
        };
        let cpus = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(2);
        Ok(LocalTransport {
            jobs_dir: state_root.join(".local-jobs"),
            state_root,
            worker: cluster.worker.clone(),
            max_parallel: cluster.max_parallel.unwrap_or((cpus / 2).max(1)),
            counters: Counters::default(),
        })
    }

    fn job(&self, dir: &Path) -> Option<LocalJob> {
        crate::fsio::read_json::<LocalJob>(&dir.join("job.json")).ok().flatten()
    }

    fn task_state(&self, dir: &Path, job: &LocalJob, task: u32) -> (SlurmState, Option<String>, Option<String>) {
        let runner_alive = std::fs::read_to_string(dir.join("runner.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .is_some_and(alive);
        let finished = dir.join("finished").exists();
        let cancelled = dir.join("cancelled").exists();
        let line = std::fs::read_to_string(dir.join("tasks").join(task.to_string())).unwrap_or_default();
        let f: Vec<&str> = line.split_whitespace().collect();
        let stopped = !runner_alive || finished;
        match f.as_slice() {
            ["ENDED", jid, rc] => {
                let rc: i32 = rc.parse().unwrap_or(-1);
                let st = match rc {
                    0 => SlurmState::Completed,
                    _ if cancelled => SlurmState::Cancelled,
                    _ => SlurmState::Failed,
                };
                (st, Some(jid.to_string()), Some(format!("{rc}:0")))
            }
            ["RUNNING", jid] if !stopped => (SlurmState::Running, Some(jid.to_string()), None),
            ["RUNNING", jid] => (
                if cancelled { SlurmState::Cancelled } else { SlurmState::NodeFail },
                Some(jid.to_string()),
                Some("runner stopped".into()),
            ),
            _ if stopped && cancelled => (SlurmState::Cancelled, None, None),
            // The runner died (machine rebooted, killed): like a node failure.
            _ if stopped => (SlurmState::NodeFail, None, Some("runner stopped".into())),
            _ => (SlurmState::Pending, None, Some(format!("at most {} at once", job.parallel))),
        }
    }

    fn job_dirs(&self) -> Vec<PathBuf> {
        let Ok(rd) = std::fs::read_dir(&self.jobs_dir) else { return vec![] };
        rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.join("job.json").exists()).collect()
    }
}

impl Transport for LocalTransport {
    fn describe(&self) -> String {
        format!("local processes (at most {} at once)", self.max_parallel)
    }

    fn files(&self) -> &dyn FileStore {
        self
    }

    fn counters(&self) -> CounterSnapshot {
        self.counters.snapshot()
    }
}

impl OnDisk for LocalTransport {
    const NAME: &'static str = "local";

    fn root(&self) -> &Path {
        &self.state_root
    }

    fn file_counters(&self) -> &Counters {
        &self.counters
    }

    fn worker(&self) -> Result<String, TransportError> {
        if let Some(w) = &self.worker {
            return Ok(w.clone());
        }
        // The worker built beside this binary (target/<profile>/worker), else PATH.
        let beside = beside_exe();
        Ok(if beside.is_file() { beside.to_string_lossy().into_owned() } else { "worker".into() })
    }

    fn probe(&self, path: &str, arg: &str) -> Result<WorkerProbe, TransportError> {
        match std::process::Command::new(path).arg(arg).output() {
            Ok(out) => Ok(WorkerProbe::from_exit(
                out.status.code().unwrap_or(-1),
                &String::from_utf8_lossy(&out.stdout),
                &String::from_utf8_lossy(&out.stderr),
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(WorkerProbe::Fails(if path.contains('/') {
                format!("no such file: {path}")
            } else {
                format!("`{path}` is neither beside the orchestrator ({}) nor on PATH", beside_exe().display())
            })),
            Err(e) => Ok(WorkerProbe::Fails(e.to_string())),
        }
    }
}

/// The memory a run on this machine has, in GiB: its RAM (`MemTotal`), or
/// its cgroup's `memory.max` where lower; `None` where neither can be read
/// (not Linux).
pub fn machine_memory_gib() -> Option<f64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim().trim_end_matches("kB").trim();
    let total = kib.parse::<f64>().ok()? * 1024.0;
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok().and_then(|s| s.trim().parse::<f64>().ok());
    Some(cgroup.map_or(total, |c| c.min(total)) / (1u64 << 30) as f64)
}

/// Where the local cluster looks for the worker first: beside this binary.
fn beside_exe() -> std::path::PathBuf {
    std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join("worker"))).unwrap_or_else(|| "worker".into())
}

impl Scheduler for LocalTransport {
    fn max_array_size(&self) -> Result<u32, TransportError> {
        Ok(100_000)
    }

    fn submit(&self, script_path: &str) -> Result<JobId, TransportError> {
        self.counters.command();
        let script = std::fs::read_to_string(script_path).map_err(|e| ferr(Path::new(script_path), e))?;
        let d = directives(&script);
        let (tasks, throttle) = match &d.array {
            Some(a) => {
                let throttle = a.split_once('%').and_then(|(_, k)| k.parse::<u32>().ok());
                (expand_ranges(a).ok_or_else(|| TransportError::Other(format!("bad --array `{a}`")))?, throttle)
            }
            None => (vec![0], None),
        };
        let max_task = tasks.iter().copied().max().unwrap_or(0) as u64;
        let id = reserve_ids(&self.jobs_dir, max_task + 2)?;
        let dir = self.jobs_dir.join(id.to_string());
        std::fs::create_dir_all(dir.join("tasks")).map_err(|e| ferr(&dir, e))?;
        let parallel = throttle.map_or(self.max_parallel, |k| k.min(self.max_parallel)).max(1);
        let job = LocalJob {
            id,
            name: d.job_name.clone().unwrap_or_else(|| "job".into()),
            comment: d.comment.clone().unwrap_or_default(),
            tasks: tasks.clone(),
            parallel,
            submitted: crate::fsio::now(),
        };
        std::fs::copy(script_path, dir.join("job.sbatch")).map_err(|e| ferr(&dir, e))?;
        std::fs::write(dir.join("runner.sh"), RUNNER).map_err(|e| ferr(&dir, e))?;
        let chdir = d.chdir.clone().unwrap_or_else(|| dir.to_string_lossy().into_owned());
        let output = d.output.clone().unwrap_or_else(|| format!("{}/%a.out", dir.display()));
        let ids: Vec<String> = tasks.iter().map(u32::to_string).collect();
        let mut cmd = Command::new("bash");
        cmd.arg(dir.join("runner.sh"))
            .env("JOBDIR", &dir)
            .env("ARRAY_ID", id.to_string())
            .env("OUTPUT_PATTERN", output)
            .env("CHDIR", chdir)
            .env("JOB_NAME", &job.name)
            .env("NTASKS", tasks.len().to_string())
            .env("TASK_IDS", ids.join(" "))
            .env("PARALLEL", parallel.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Its own session: the orchestrator exiting (or Ctrl-C) does not stop the
        // jobs, and `cancel` signals the whole group.
        use std::os::unix::process::CommandExt;
        // SAFETY: setsid is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child =
            cmd.spawn().map_err(|e| TransportError::Other(format!("cannot start the local runner: {e}")))?;
        let go = child.stdin.take();
        // Reap it when it ends, so a long-lived orchestrator keeps no zombie
        // (a zombie would still answer kill(pid, 0)).
        let pid = child.id();
        std::thread::spawn(move || child.wait());
        crate::util::failpoint::hit("local:runner-started");
        crate::fsio::write_atomic(&dir.join("runner.pid"), pid.to_string().as_bytes()).map_err(|e| ferr(&dir, e))?;
        // From here the job exists (the runner runs it), whatever becomes of this process.
        crate::fsio::write_json(&dir.join("job.json"), &job).map_err(|e| ferr(&dir, e))?;
        crate::util::failpoint::hit("local:job-recorded");
        if let Some(mut go) = go {
            use std::io::Write;
            // A runner that died meanwhile cannot be told: a poll finds it stopped (a node failure).
            let _ = go.write_all(b"go\n");
        }
        Ok(JobId::from(id.to_string()))
    }

    fn poll(&self, names: &[String], _since: f64) -> Result<Poll, TransportError> {
        self.counters.command();
        let mut tasks = BTreeMap::new();
        for dir in self.job_dirs() {
            let Some(job) = self.job(&dir) else { continue };
            if !names.contains(&job.name) {
                continue;
            }
            for &t in &job.tasks {
                let (state, job_id, detail) = self.task_state(&dir, &job, t);
                tasks.insert(
                    (JobId::from(job.id.to_string()), t),
                    TaskObservation {
                        array_job_id: JobId::from(job.id.to_string()),
                        task_id: t,
                        job_id: job_id.map(JobId::from),
                        name: job.name.clone(),
                        state,
                        detail,
                    },
                );
            }
        }
        Ok(Poll { tasks, live_ok: true, history_ok: true, errors: vec![], commands: 1 })
    }

    fn cancel(&self, job_ids: &[JobId]) -> Result<(), TransportError> {
        self.counters.command();
        for id in job_ids {
            let array = id.split('_').next().unwrap_or(id);
            let dir = self.jobs_dir.join(array);
            if !dir.join("job.json").exists() {
                continue;
            }
            std::fs::write(dir.join("cancelled"), b"").map_err(|e| ferr(&dir, e))?;
            if let Some(pid) =
                std::fs::read_to_string(dir.join("runner.pid")).ok().and_then(|s| s.trim().parse::<i32>().ok())
            {
                if alive(pid) {
                    // SAFETY: signalling the runner's own process group (it called setsid).
                    unsafe {
                        libc::kill(-pid, libc::SIGTERM);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn wait_all_ended(t: &LocalTransport, name: &str, n: usize) -> BTreeMap<(JobId, u32), TaskObservation> {
        let start = Instant::now();
        loop {
            let p = t.poll(&[name.to_string()], 0.0).expect("poll");
            if p.tasks.len() == n && p.tasks.values().all(|o| o.state.is_ended()) {
                return p.tasks;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "tasks did not end: {:?}", p.tasks);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[test]
    fn runs_an_array_with_slurm_variables_and_a_concurrency_limit() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut c = ClusterConfig::local();
        c.max_parallel = Some(2);
        let t = LocalTransport::new(&c, d.path()).expect("transport");
        let out = d.path().join("out");
        let script = d.path().join("job.sbatch");
        std::fs::write(
            &script,
            format!(
                "#!/bin/bash\n#SBATCH --job-name=t1\n#SBATCH --array=0-5%3\n#SBATCH --output={}/%a.log\n\
                 echo \"$SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID $SLURM_JOB_ID\"\n\
                 date +%s.%N >> {}/starts; sleep 0.3; date +%s.%N >> {}/ends\n\
                 [ \"$SLURM_ARRAY_TASK_ID\" != 4 ]\n",
                out.display(),
                d.path().display(),
                d.path().display()
            ),
        )
        .expect("script");
        let id = t.submit(&script.to_string_lossy()).expect("submit");
        let tasks = wait_all_ended(&t, "t1", 6);
        for i in 0..6u32 {
            let o = &tasks[&(id.clone(), i)];
            let want = if i == 4 { SlurmState::Failed } else { SlurmState::Completed };
            assert_eq!(o.state, want, "task {i}");
            let log = std::fs::read_to_string(out.join(format!("{i}.log"))).expect("log");
            let f: Vec<&str> = log.split_whitespace().collect();
            assert_eq!(f[0], id);
            assert_eq!(f[1], i.to_string());
            assert_eq!(f[2], o.job_id.clone().expect("task job id"));
        }
        // Never more than 2 (max_parallel) at once: check the start/end timeline.
        let read = |n: &str| -> Vec<f64> {
            std::fs::read_to_string(d.path().join(n)).expect(n).lines().filter_map(|l| l.parse().ok()).collect()
        };
        let (starts, ends) = (read("starts"), read("ends"));
        for &s in &starts {
            let running = starts.iter().filter(|&&x| x <= s).count() - ends.iter().filter(|&&e| e <= s).count();
            assert!(running <= 2, "{running} tasks running at once");
        }
    }

    #[test]
    fn cancel_stops_running_and_pending_tasks() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut c = ClusterConfig::local();
        c.max_parallel = Some(1);
        let t = LocalTransport::new(&c, d.path()).expect("transport");
        let script = d.path().join("job.sbatch");
        std::fs::write(&script, "#!/bin/bash\n#SBATCH --job-name=t2\n#SBATCH --array=0-2\nsleep 30\n").expect("script");
        let id = t.submit(&script.to_string_lossy()).expect("submit");
        let start = Instant::now();
        while t.poll(&["t2".into()], 0.0).expect("poll").tasks[&(id.clone(), 0)].state != SlurmState::Running {
            assert!(start.elapsed() < Duration::from_secs(10), "never started");
            std::thread::sleep(Duration::from_millis(50));
        }
        t.cancel(std::slice::from_ref(&id)).expect("cancel");
        let tasks = wait_all_ended(&t, "t2", 3);
        assert!(tasks.values().all(|o| o.state == SlurmState::Cancelled), "{tasks:?}");
    }

    #[test]
    fn directives_are_read() {
        let d =
            directives("#!/bin/bash\n#SBATCH --array=0-3%2\n#SBATCH --job-name='a b'\n#SBATCH --output=/x/%a.out\n");
        assert_eq!(d.array.as_deref(), Some("0-3%2"));
        assert_eq!(d.job_name.as_deref(), Some("a b"));
        assert_eq!(d.output.as_deref(), Some("/x/%a.out"));
    }

    #[test]
    fn job_ids_count_on_and_a_corrupt_counter_is_an_error_not_a_reset() {
        let d = tempfile::tempdir().expect("tempdir");
        let t = LocalTransport::new(&ClusterConfig::local(), d.path()).expect("transport");
        assert_eq!(reserve_ids(&t.jobs_dir, 3).expect("first"), 1000);
        assert_eq!(reserve_ids(&t.jobs_dir, 1).expect("next"), 1003);
        std::fs::write(t.jobs_dir.join("next_id"), "10x4").expect("corrupt it");
        let e = reserve_ids(&t.jobs_dir, 1).expect_err("corrupt");
        assert!(e.to_string().contains("`10x4` is not a job id counter"), "{e}");
    }
}
