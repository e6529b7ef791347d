//! A crash at every step of the submit protocol, on the real test cluster
//! over SSH (issue 33): `submit` dies by SIGKILL at each named failpoint in
//! turn (`ORCHESTRATOR_FAILPOINT`, debug builds only), `resume` runs, and
//! every config must end with exactly one SLURM job that completed: none
//! lost, none submitted twice. The jobs use the light record template of
//! `common::ssh_world` (about a second each): what is tested is the
//! protocol, not the worker.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use orchestrator::util::failpoint::SUBMIT_PROTOCOL;

use common::ssh_world::{jobs_per_config, watch, world};
use common::{cluster, Use};

/// Configs per sweep: three, so a change has a record between two others.
const CONFIGS: usize = 3;

#[test]
fn cluster_a_crash_at_every_failpoint_then_resume_loses_nothing_and_duplicates_nothing() {
    let Some(env) = cluster(Use::Shared) else { return };
    // Every failpoint at once, each its own sweep and state directory.
    let outcomes: Vec<(&str, Result<(), String>)> = std::thread::scope(|s| {
        let runs: Vec<_> = SUBMIT_PROTOCOL
            .iter()
            .enumerate()
            .map(|(i, fp)| {
                let env = &env;
                (*fp, s.spawn(move || crash_and_resume(env, &format!("ct-fp{i}"), fp)))
            })
            .collect();
        runs.into_iter().map(|(fp, h)| (fp, h.join().unwrap_or_else(|_| Err("panicked".into())))).collect()
    });
    for (fp, outcome) in &outcomes {
        eprintln!(
            "failpoint {fp:<28} {}",
            outcome.as_ref().map_or_else(|e| e.clone(), |_| "0 lost, 0 duplicates".into())
        );
    }
    let failed: Vec<_> = outcomes.iter().filter(|(_, o)| o.is_err()).collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

/// `submit` killed at `fp`, then `resume`; Err says what went wrong.
fn crash_and_resume(env: &common::Env, exp: &str, fp: &str) -> Result<(), String> {
    let w = world(env, exp, CONFIGS, CONFIGS as u32, 0.0);
    let out = w.binary("submit", &w.exp_file).env("ORCHESTRATOR_FAILPOINT", fp).output().map_err(|e| e.to_string())?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.signal() != Some(9) || !stderr.contains(&format!("failpoint {fp}: dying by SIGKILL")) {
        return Err(format!("submit was not killed at the failpoint: {:?}\n{stderr}", out.status));
    }
    let out = w.binary("resume", &w.exp_file).output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("resume failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let r = watch(&w, exp, Duration::from_secs(120));
    if r.count("COMPLETED") != CONFIGS {
        return Err(format!("lost configs:\n{}", r.table()));
    }
    let per = jobs_per_config(env, &w, exp);
    if per.len() != CONFIGS || per.values().any(|&n| n != 1) {
        return Err(format!("jobs per config {per:?}:\n{}", r.table()));
    }
    Ok(())
}
