//! A crash or an interrupt at any step of the submit protocol, on the real
//! test cluster over SSH and over slurmrestd (issues 33, 41): `submit` dies
//! by SIGKILL at each named failpoint in turn (`ORCHESTRATOR_FAILPOINT`,
//! debug builds only), or is sent SIGINT or SIGTERM at a few moments (a
//! share of its time, the moment its intent is on disk and a little after:
//! `sbatch` in flight); `resume` runs, and every config must end with
//! exactly one SLURM job that completed: none lost, none submitted twice.
//! The jobs use the light record template of `common::ssh_world` (about a
//! second each): what is tested is the protocol, not the worker. (The same
//! on the built-in clusters, with more moments: `interrupts.rs`.)

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use orchestrator::util::failpoint::SUBMIT_PROTOCOL;

use common::ssh_world::{jobs_per_config, watch, world_over, Over, World};
use common::{cluster, Use};

/// Configs per sweep: three, so a change has a record between two others.
const CONFIGS: usize = 3;

#[test]
fn cluster_a_crash_at_every_failpoint_then_resume_loses_nothing_and_duplicates_nothing() {
    let Some(env) = cluster(Use::Shared) else { return };
    let cases: Vec<(Over, &str)> =
        [Over::Ssh, Over::Rest].into_iter().flat_map(|o| SUBMIT_PROTOCOL.iter().map(move |fp| (o, *fp))).collect();
    // Every case at once, each its own sweep and state directory.
    let outcomes: Vec<Result<(), String>> = std::thread::scope(|s| {
        let runs: Vec<_> = cases
            .iter()
            .enumerate()
            .map(|(i, &(over, fp))| {
                let env = &env;
                s.spawn(move || crash_and_resume(env, over, &format!("ct-fp{i}"), fp))
            })
            .collect();
        runs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("panicked".into()))).collect()
    });
    report(cases.iter().map(|(o, fp)| format!("{o:?} failpoint {fp}")), &outcomes);
}

/// Each outcome, then a failure for any that went wrong.
fn report<T: std::fmt::Debug>(names: impl Iterator<Item = String>, outcomes: &[Result<T, String>]) {
    let mut failed = vec![];
    for (name, o) in names.zip(outcomes) {
        eprintln!("{name:<40} {}", o.as_ref().map_or_else(|e| e.clone(), |t| format!("0 lost, 0 duplicates {t:?}")));
        if let Err(e) = o {
            failed.push(format!("{name}: {e}"));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// `submit` killed at `fp`, then `resume`; Err says what went wrong.
fn crash_and_resume(env: &common::Env, over: Over, exp: &str, fp: &str) -> Result<(), String> {
    let w = world_over(over, env, exp, CONFIGS, CONFIGS as u32, 0.0);
    let out = w.binary("submit", &w.exp_file).env("ORCHESTRATOR_FAILPOINT", fp).output().map_err(|e| e.to_string())?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.signal() != Some(9) || !stderr.contains(&format!("failpoint {fp}: dying by SIGKILL")) {
        return Err(format!("submit was not killed at the failpoint: {:?}\n{stderr}", out.status));
    }
    resume_and_count(env, &w, exp, CONFIGS)
}

/// `resume`, then every config completed once, every submission settled.
fn resume_and_count(env: &common::Env, w: &World, exp: &str, n: usize) -> Result<(), String> {
    let out = w.binary("resume", &w.exp_file).output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("resume failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let r = watch(w, exp, Duration::from_secs(120));
    if r.count("COMPLETED") != n {
        return Err(format!("lost configs:\n{}", r.table()));
    }
    let open: Vec<String> = common::submissions(&w.opts.state_root, exp)
        .into_iter()
        .filter(|s| s.state().is_open())
        .map(|s| s.id)
        .collect();
    if !open.is_empty() {
        return Err(format!("submissions left unsettled: {open:?}"));
    }
    let per = jobs_per_config(env, w, exp);
    if per.len() != n || per.values().any(|&k| k != 1) {
        return Err(format!("jobs per config {per:?}:\n{}", r.table()));
    }
    Ok(())
}

/// When a signal is sent: a share of an uninterrupted submit's seconds after
/// its start, or milliseconds after its intent is on disk (`sbatch` next).
#[derive(Debug, Clone, Copy)]
enum At {
    Share(f64),
    Intent(u64),
}

#[test]
fn cluster_sigint_or_sigterm_during_submit_then_resume_loses_nothing_and_duplicates_nothing() {
    let Some(env) = cluster(Use::Shared) else { return };
    const N: usize = 6;
    let moments = [(At::Share(0.5), libc::SIGINT), (At::Intent(0), libc::SIGTERM), (At::Intent(40), libc::SIGINT)];
    let cases: Vec<(Over, At, i32)> =
        [Over::Ssh, Over::Rest].into_iter().flat_map(|o| moments.iter().map(move |&(at, sig)| (o, at, sig))).collect();
    // An uninterrupted submit's time on each, for the shares.
    let whole: Vec<(Over, f64)> = [Over::Ssh, Over::Rest]
        .into_iter()
        .map(|over| {
            let w = world_over(over, &env, &format!("ct-whole-{over:?}").to_lowercase(), N, N as u32, 0.0);
            let t0 = Instant::now();
            let out = w.binary("submit", &w.exp_file).output().expect("submit runs");
            assert!(out.status.success(), "{}", common::text(&out));
            (over, t0.elapsed().as_secs_f64())
        })
        .collect();
    let outcomes: Vec<Result<Landed, String>> = std::thread::scope(|s| {
        let runs: Vec<_> = cases
            .iter()
            .enumerate()
            .map(|(i, &(over, at, sig))| {
                let env = &env;
                let whole = whole.iter().find(|(o, _)| *o == over).map_or(1.0, |(_, t)| *t);
                s.spawn(move || interrupt_and_resume(env, over, &format!("ct-sig{i}"), at, sig, whole))
            })
            .collect();
        runs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("panicked".into()))).collect()
    });
    let name = |sig: i32| if sig == libc::SIGINT { "SIGINT" } else { "SIGTERM" };
    report(cases.iter().map(|(o, at, sig)| format!("{o:?} {} at {at:?}", name(*sig))), &outcomes);
    // A signal right at the intent (`sbatch` next) lands on each kind; 40 ms
    // later a fast cluster may already have answered (then the signal finds
    // `submit` ended: still 0 lost, 0 duplicates, as `report` checked).
    for (case, outcome) in cases.iter().zip(&outcomes) {
        let must_land = matches!(case.1, At::Intent(0));
        assert!(!must_land || matches!(outcome, Ok(Landed::Interrupted)), "{case:?}: {outcome:?}");
    }
}

/// Whether the signal ended `submit`, or came after it had ended.
#[derive(Debug, PartialEq, Eq)]
enum Landed {
    Interrupted,
    AfterTheEnd,
}

/// `submit` of `N` configs sent `signal` at `at`, then `resume`.
fn interrupt_and_resume(
    env: &common::Env,
    over: Over,
    exp: &str,
    at: At,
    signal: i32,
    whole: f64,
) -> Result<Landed, String> {
    const N: usize = 6;
    let w = world_over(over, env, exp, N, N as u32, 0.0);
    let mut child = w
        .binary("submit", &w.exp_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let (wait, after) = match at {
        At::Share(s) => (Duration::from_secs_f64(whole * s), 0),
        At::Intent(ms) => (Duration::ZERO, ms),
    };
    let subs = w.opts.state_root.join(exp).join("submissions");
    let intent = || {
        std::fs::read_dir(&subs)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .any(|e| e.path().join("submission.json").exists())
    };
    let mut exited = None;
    while exited.is_none() && (t0.elapsed() < wait || (matches!(at, At::Intent(_)) && !intent())) {
        exited = child.try_wait().map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_millis(1));
    }
    if exited.is_none() {
        std::thread::sleep(Duration::from_millis(after));
        // SAFETY: a plain kill(2) of our own child, not yet reaped.
        unsafe { libc::kill(child.id() as i32, signal) };
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    if status.signal() != Some(signal) && !status.success() {
        return Err(format!("submit failed: {status:?}"));
    }
    resume_and_count(env, &w, exp, N)?;
    Ok(if status.signal() == Some(signal) { Landed::Interrupted } else { Landed::AfterTheEnd })
}
