//! `worker watch --chain-max N …`: one segment of a chained run
//! ([`facts::chain`]). Before the command starts, the worker finds which
//! segment this is (the chain's `start` lines already in the run's events)
//! and adds the resume argument once the checkpoint exists. When the command
//! has exited, [`decide`] says how the chain goes on; for a segment that
//! stopped for the time limit the worker writes the segment's end first and
//! then asks SLURM to requeue its own job ([`requeue`]): the next segment is
//! the same job id, which SLURM never runs twice at once.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use facts::chain::ChainPosition;
use facts::event::Event;

/// What `worker watch` is told of the chain (from the experiment's `chain:`).
#[derive(Debug, Clone)]
pub struct ChainOptions {
    pub max_segments: u32,
    /// The checkpoint the command saves, relative to the run directory.
    pub checkpoint: PathBuf,
    /// Added to the command once the checkpoint exists.
    pub resume_arg: OsString,
    /// Present once the run is complete (relative to the run directory).
    pub marker: Option<PathBuf>,
    /// The signal SLURM sends before the limit (`libc::SIGUSR1`).
    pub signal: i32,
    /// Seconds before the limit the signal is due: where SLURM has not sent
    /// it by then, the worker sends it itself (`None`: SLURM's alone).
    pub warn_before_s: Option<u64>,
}

/// A chain's files, resolved in its run directory.
#[derive(Debug, Clone)]
pub struct ChainRun {
    pub opts: ChainOptions,
    pub run_dir: PathBuf,
    pub position: ChainPosition,
}

impl ChainRun {
    /// This segment of the chain whose events are at `events` (in the run directory).
    pub fn at(opts: ChainOptions, events: &Path) -> ChainRun {
        let run_dir = events.parent().map(Path::to_path_buf).unwrap_or_default();
        let before = segments_started(events);
        let position = ChainPosition { segment: before + 1, max_segments: opts.max_segments };
        ChainRun { opts, run_dir, position }
    }

    pub fn checkpoint(&self) -> PathBuf {
        self.run_dir.join(&self.opts.checkpoint)
    }

    /// A checkpoint to resume from: there and not empty (a save cut short
    /// leaves an empty file; the group's launchers test `-f` and `-s`).
    pub fn has_checkpoint(&self) -> bool {
        std::fs::metadata(self.checkpoint()).is_ok_and(|m| m.is_file() && m.len() > 0)
    }

    pub fn complete(&self) -> bool {
        self.opts.marker.as_ref().is_some_and(|m| self.run_dir.join(m).exists())
    }

    /// The command as this segment runs it: with the resume argument once a
    /// checkpoint exists (a first segment, or a chain that never saved, starts fresh).
    pub fn command(&self, command: &[OsString]) -> Vec<OsString> {
        let mut c = command.to_vec();
        if self.has_checkpoint() {
            c.push(self.opts.resume_arg.clone());
        }
        c
    }
}

/// Segments of the chain already started: the `start` lines with a chain
/// position in the run's events (every attempt's, since the run directory is
/// the config's), whatever became of them.
pub fn segments_started(events: &Path) -> u32 {
    let Ok(bytes) = std::fs::read(events) else { return 0 };
    let lines = facts::jsonl::read::<Event>(&bytes);
    let started = lines.all().filter(|l| matches!(&l.value, Ok(Event::Start { env, .. }) if env.chain.is_some()));
    u32::try_from(started.count()).unwrap_or(u32::MAX)
}

/// How the chain goes on once the command exited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// The marker is there: the run is complete (`ok`).
    Complete,
    /// Stopped for the time limit with its checkpoint saved: requeue.
    Requeue,
    /// Stopped for the time limit at `max_segments` (`failed`: the checkpoint stays).
    Capped,
    /// Stopped for the time limit without the checkpoint (`failed`).
    NoCheckpoint,
    /// Anything else: the command's own exit decides, as for one run.
    Exit,
}

/// The chain's next step after a command that `exited_0` with the signals
/// `forwarded` to it.
pub fn decide(run: &ChainRun, exited_0: bool, forwarded: &[i32]) -> Next {
    if run.complete() {
        return Next::Complete;
    }
    // SIGTERM is SLURM's `scancel` (or the limit itself): never requeue after it.
    if !(exited_0 && forwarded.contains(&run.opts.signal)) || forwarded.contains(&libc::SIGTERM) {
        return Next::Exit;
    }
    if !run.has_checkpoint() {
        Next::NoCheckpoint
    } else if run.position.segment >= run.opts.max_segments {
        Next::Capped
    } else {
        Next::Requeue
    }
}

/// How long until this job's own signal is due: the time SLURM gives the job
/// (`squeue -o %L`) less `before_s`; `None` outside SLURM or without a limit.
pub fn warn_after(before_s: u64) -> Option<std::time::Duration> {
    // By array and task: `squeue -j <the array's own id>` lists every task.
    let job = requeue_target(|k| std::env::var(k).ok())?;
    let out = Command::new("squeue").args(["-h", "-j", &job, "-o", "%L"]).output().ok()?;
    let left = time_left(String::from_utf8_lossy(&out.stdout).trim())?;
    Some(std::time::Duration::from_secs(left.saturating_sub(before_s)))
}

/// squeue's time left (`D-HH:MM:SS`, `HH:MM:SS`, `MM:SS`) in seconds;
/// `None` for `UNLIMITED`, `NOT_SET` or anything else.
pub fn time_left(text: &str) -> Option<u64> {
    let (days, clock) = match text.split_once('-') {
        Some((d, c)) => (d.parse::<u64>().ok()?, c),
        None => (0, text),
    };
    let parts: Vec<u64> = clock.split(':').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let secs = match parts.as_slice() {
        [m, s] => m * 60 + s,
        [h, m, s] => h * 3600 + m * 60 + s,
        _ => return None,
    };
    Some(days * 86_400 + secs)
}

/// This job as SLURM's commands must name it (to requeue it, to ask its
/// time left): an array task as `ARRAY_TASK` (`672_2`), else the job id. An array's last task runs under the array's own id, and
/// `scontrol requeue 672` would requeue every task of array 672, a task
/// that ended or was cancelled among them.
pub fn requeue_target(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    match (var("SLURM_ARRAY_JOB_ID"), var("SLURM_ARRAY_TASK_ID")) {
        (Some(array), Some(task)) => Some(format!("{array}_{task}")),
        _ => var("SLURM_JOB_ID"),
    }
}

/// Asks SLURM to requeue this job ([`requeue_target`]). On success SLURM
/// ends this run of the job at once and starts it again later; the error
/// is what to tell `resume`.
pub fn requeue() -> Result<(), String> {
    let job = requeue_target(|k| std::env::var(k).ok())
        .ok_or_else(|| "not a SLURM job (no SLURM_JOB_ID): nothing to requeue".to_string())?;
    let out = Command::new("scontrol")
        .args(["requeue", &job])
        .output()
        .map_err(|e| format!("`scontrol requeue {job}` did not run: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr).trim().to_string();
    Err(format!("`scontrol requeue {job}` failed ({}): {said}", out.status))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> ChainOptions {
        ChainOptions {
            max_segments: 3,
            checkpoint: "ckpt.pt".into(),
            resume_arg: "resume_from=ckpt.pt".into(),
            marker: Some(".done".into()),
            signal: libc::SIGUSR1,
            warn_before_s: None,
        }
    }

    fn start_line(chain: bool) -> String {
        let chain = if chain { ",\"chain\":{\"segment\":1,\"max_segments\":3}" } else { "" };
        format!(
            "{{\"event\":\"start\",\"t\":1.0,\"config\":\"n\",\"config_hash\":\"0\",\"env\":{{\"host\":\"h\",\
             \"device\":\"cpu\",\"backend\":\"command\",\"dtype\":\"f32\",\"grad_ckpt\":false{chain}}}}}\n"
        )
    }

    #[test]
    fn the_segment_counts_the_chains_starts_and_resumes_only_from_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("events.jsonl");
        let run = ChainRun::at(opts(), &events);
        assert_eq!(run.position.segment, 1, "no events: the first segment");
        assert_eq!(run.command(&["train".into()]), ["train"], "no checkpoint: fresh");
        std::fs::create_dir_all(dir.path()).unwrap();
        std::fs::write(dir.path().join("ckpt.pt"), b"").unwrap();
        assert_eq!(run.command(&["train".into()]), ["train"], "an empty checkpoint is none");
        std::fs::write(&events, format!("{}{}{}", start_line(true), start_line(false), start_line(true))).unwrap();
        std::fs::write(dir.path().join("ckpt.pt"), b"x").unwrap();
        let run = ChainRun::at(opts(), &events);
        assert_eq!(run.position.segment, 3, "two chain starts before (a non-chain start is no segment)");
        assert_eq!(run.command(&["train".into()]), ["train", "resume_from=ckpt.pt"]);
    }

    #[test]
    fn squeues_time_left_reads_in_seconds() {
        assert_eq!(time_left("0:45"), Some(45));
        assert_eq!(time_left("11:59:30"), Some(43_170));
        assert_eq!(time_left("4-23:59:59"), Some(4 * 86_400 + 86_399));
        assert_eq!(time_left("UNLIMITED"), None);
        assert_eq!(time_left("NOT_SET"), None);
        assert_eq!(time_left(""), None);
    }

    #[test]
    fn an_array_task_is_requeued_by_its_array_and_task_never_by_the_arrays_id_alone() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        // The last task of array 700 runs as job 700: `requeue 700` would requeue the whole array.
        let task = env(&[("SLURM_JOB_ID", "700"), ("SLURM_ARRAY_JOB_ID", "700"), ("SLURM_ARRAY_TASK_ID", "2")]);
        assert_eq!(requeue_target(task).as_deref(), Some("700_2"));
        assert_eq!(requeue_target(env(&[("SLURM_JOB_ID", "42")])).as_deref(), Some("42"));
        assert_eq!(requeue_target(env(&[])), None);
    }

    #[test]
    fn the_marker_ends_the_chain_a_saved_signalled_stop_requeues_up_to_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("events.jsonl");
        let usr1 = [libc::SIGUSR1];
        let run = ChainRun::at(opts(), &events);
        assert_eq!(decide(&run, true, &usr1), Next::NoCheckpoint);
        assert_eq!(decide(&run, true, &[]), Next::Exit, "exit 0 unsignalled: the command's own end");
        std::fs::write(dir.path().join("ckpt.pt"), b"x").unwrap();
        assert_eq!(decide(&run, true, &usr1), Next::Requeue);
        assert_eq!(decide(&run, false, &usr1), Next::Exit, "a failure after the signal is the exit's");
        assert_eq!(decide(&run, true, &[libc::SIGTERM]), Next::Exit, "SIGTERM is no chain signal");
        assert_eq!(decide(&run, true, &[libc::SIGUSR1, libc::SIGTERM]), Next::Exit, "cancelled while saving");
        let last = ChainRun { position: ChainPosition { segment: 3, max_segments: 3 }, ..run.clone() };
        assert_eq!(decide(&last, true, &usr1), Next::Capped);
        std::fs::write(dir.path().join(".done"), b"").unwrap();
        assert_eq!(decide(&run, true, &usr1), Next::Complete);
        assert_eq!(decide(&run, false, &[]), Next::Complete, "the marker wins over the exit");
    }
}
