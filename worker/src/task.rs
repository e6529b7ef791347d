//! One array task of several configs (`worker: {configs_per_task: K}`): on a
//! GPU run in turn in one process, so the kernels the first config compiled
//! and tuned serve the rest. On the CPU backend, which compiles nothing, each
//! config gets a process of its own: its meter is the process's host heap,
//! and what an earlier config leaves allocated there (the backend's buffers)
//! would count in the next one's peak (a tiny DiT after a 44 MB UNet: 7.6 MB
//! in one process, 3.1 MB alone).
//!
//! This process supervises; a child worker (`worker run … --from J`) runs the
//! task's configs from index `J` in turn ([`run_in_turn`]), emptying the
//! device's pool between them (each config's peaks are measured from the bytes
//! in use, never from the pool's high-water mark, which does not reset). The
//! child stops after the first config that does not end `ok`: an `oom` under
//! the CPU limit ends the process from inside the allocator, and a device that
//! ran out of memory or failed is not trusted with the next config. The
//! supervisor then starts a fresh child from the next config without a result.
//!
//! A child killed from outside inside a config (the kernel's OOM killer, say)
//! leaves that config started and without a result, as a worker of a one-config
//! task would (the orchestrator retries it once); the task goes on with the
//! next config, and its log says so. SIGTERM and SIGINT are passed to the
//! child, which records its config `cancelled`; the task's later configs then
//! get no events at all.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

use facts::event::{RunResult, RunStatus};
use facts::RunConfig;

use crate::events::{now, written_since};
use crate::runner::{self, RunError, RunOptions, EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, EXIT_OOM};

/// A child's exit code for "start a fresh process from my next config": one
/// that stores its weights in another type than this process's device was
/// set up with (Burn sets that once per process).
pub const EXIT_RESTART: i32 = 75;

/// The child's part: run `cfgs[from..]` in turn in this process; stop after
/// the first that does not end `ok`, or before one this process cannot set
/// its device up for, or (CPU backend) after each config ([`EXIT_RESTART`]).
/// Returns the exit code of the last run.
pub fn run_in_turn(cfgs: &[RunConfig], from: usize, opts: &RunOptions) -> Result<i32, RunError> {
    for (i, cfg) in cfgs.iter().enumerate().skip(from) {
        let fresh_process = i > from && !opts.backend.is_gpu();
        if fresh_process || !crate::backend::fits_this_process(cfg.precision) {
            return Ok(EXIT_RESTART); // the supervisor starts a fresh process from here
        }
        let outcome = runner::run(cfg, opts)?;
        report(cfg, &outcome.result);
        if outcome.result.status != RunStatus::Ok {
            return Ok(outcome.exit_code());
        }
    }
    Ok(EXIT_OK)
}

/// One line per finished run on stderr (the job's log).
pub fn report(cfg: &RunConfig, result: &RunResult) {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    eprintln!(
        "{}: {:?}, {} params, peak {:.3} GiB{}",
        cfg.name,
        result.status,
        result.params,
        gib(result.peak_bytes),
        result.message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default()
    );
}

/// The supervisor's part: run the task's configs through child workers
/// started as `child(from)`, until every config has been run or the task is
/// cancelled. Returns the task's exit code: 0 when every config ended `ok`,
/// 143 when cancelled, else 1 when any failed, else 3 (some ran out of memory).
pub fn supervise(cfgs: &[RunConfig], state_dir: &Path, child: impl Fn(usize) -> Command) -> anyhow::Result<i32> {
    let cancelled = Arc::new(AtomicBool::new(false));
    let child_pid = Arc::new(AtomicI32::new(0));
    forward_signals(cancelled.clone(), child_pid.clone())?;
    let mut statuses = Vec::with_capacity(cfgs.len());
    let mut from = 0;
    while from < cfgs.len() {
        let spawned_at = now();
        let mut proc = child(from).spawn()?;
        child_pid.store(proc.id() as i32, Ordering::SeqCst);
        let exit = proc.wait()?;
        child_pid.store(0, Ordering::SeqCst);
        let recorded: Vec<RunStatus> = cfgs[from..]
            .iter()
            .map_while(|cfg| written_since(state_dir, cfg, spawned_at).result.map(|r| r.status))
            .collect();
        statuses.extend(&recorded);
        let next = from + recorded.len();
        if next == cfgs.len() {
            break;
        }
        if cancelled.load(Ordering::SeqCst) || exit.code() == Some(EXIT_CANCELLED) {
            return Ok(EXIT_CANCELLED);
        }
        let by_design = exit.code() == Some(EXIT_RESTART) || recorded.last().is_some_and(|s| *s != RunStatus::Ok);
        let started = written_since(state_dir, &cfgs[next], spawned_at).started;
        if by_design && !started {
            // The child stopped before config `next`, as it should: after one
            // that did not end `ok`, or for a device set up differently.
            from = next;
            continue;
        }
        statuses.push(RunStatus::Failed);
        if !started {
            eprintln!("worker: the worker process ended ({exit}) before starting {}; the task stops", cfgs[next].name);
            break;
        }
        eprintln!(
            "worker: the worker process running {} ended ({exit}) without recording a result: killed from outside \
             (the kernel's OOM killer, say); going on with the next config",
            cfgs[next].name
        );
        from = next + 1;
    }
    Ok(task_exit_code(&statuses))
}

/// The exit code of a task whose configs ended so (see [`supervise`]).
pub fn task_exit_code(statuses: &[RunStatus]) -> i32 {
    let any = |s: RunStatus| statuses.contains(&s);
    if any(RunStatus::Cancelled) {
        EXIT_CANCELLED
    } else if any(RunStatus::Failed) {
        EXIT_FAILED
    } else if any(RunStatus::Oom) {
        EXIT_OOM
    } else {
        EXIT_OK
    }
}

/// SIGTERM and SIGINT: note the cancellation and pass the signal to the child
/// under way (SLURM signals the whole job, but `kill` of this process alone
/// must stop the task too).
fn forward_signals(cancelled: Arc<AtomicBool>, child: Arc<AtomicI32>) -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        for sig in signals.forever() {
            cancelled.store(true, Ordering::SeqCst);
            let pid = child.load(Ordering::SeqCst);
            if pid > 0 {
                // SAFETY: kill(2) with a pid this process spawned and has not reaped.
                unsafe { libc::kill(pid, sig) };
            }
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_exits_with_its_worst_outcome() {
        use RunStatus::*;
        assert_eq!(task_exit_code(&[Ok, Ok]), EXIT_OK);
        assert_eq!(task_exit_code(&[Ok, Oom, Ok]), EXIT_OOM);
        assert_eq!(task_exit_code(&[Oom, Failed]), EXIT_FAILED);
        assert_eq!(task_exit_code(&[Failed, Cancelled]), EXIT_CANCELLED);
        assert_eq!(task_exit_code(&[]), EXIT_OK);
    }
}
