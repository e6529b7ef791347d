//! Chained training runs on the real test cluster (issue 51): the chain demo
//! (`experiments/chain-demo.yaml`: the worker's scripted trainer as each
//! config's command, a one-minute limit, at least 3 segments a config) over
//! the local SLURM commands, SSH and slurmrestd, under the faults of the
//! profiling sweeps:
//!
//! - `submit` interrupted (SIGINT once its intent is on disk) or killed at a
//!   failpoint, then `resume`;
//! - a segment killed by SIGKILL mid-step (every process of its job),
//!   continued by `resume` from its checkpoint;
//! - `slurmctld` restarted mid-chain;
//! - `resume` killed at every failpoint of the submission protocol while it
//!   continues a chain, then `resume` again;
//! - `cancel` of a running chain; a requeue that SLURM refuses.
//!
//! Every case ends with each config completed once (or stopped where
//! `cancel` says), no job submitted twice, and a config's runs never
//! overlapping ([`common::chain_world::verify`]).

mod common;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use common::chain_world::{all_completed, chain_world, segment, verify, ChainWorld, Over};
use common::{cluster, Env, Use};
use orchestrator::util::failpoint::SUBMIT_PROTOCOL;

/// Long enough for the demo's slowest chain (about 7 segments of 15-30 s
/// with 11 s between them) with the faults' delays.
const CHAIN_LIMIT: Duration = Duration::from_secs(540);

/// The name of the one config a sweep with `steps=N` makes (every config
/// of the demo becomes the same one).
fn only_config(w: &ChainWorld) -> String {
    let rows = w.status();
    assert_eq!(rows.len(), 1, "{rows:#?}");
    rows[0]["name"].as_str().expect("a name").to_string()
}

/// Waits until config `name` of `w` runs a segment at or after `at_least`.
fn wait_running_segment(w: &ChainWorld, name: &str, at_least: u64) {
    w.wait(&format!("{name} running segment {at_least}"), CHAIN_LIMIT, |rows| {
        rows.iter().any(|r| {
            r["name"] == name && {
                let (seg, running) = segment(r);
                running && seg >= at_least
            }
        })
    });
}

/// The SLURM states a job does not come back from by itself.
const ENDED: [&str; 6] = ["FAILED", "CANCELLED", "COMPLETED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"];

/// Kills every process of each config of `names`' jobs (the worker and the
/// trainer: those whose environment has its SLURM_JOB_ID) with SIGKILL,
/// mid-step, as the kernel or a node's death would, each as soon as it runs
/// a segment with a checkpoint saved; waits until SLURM has every such job
/// ended. All at once: a chain killed after another's job has ended may have
/// completed meanwhile on a loaded machine.
fn kill_segments(w: &ChainWorld, names: &[&str]) {
    let deadline = Instant::now() + CHAIN_LIMIT;
    let mut left: Vec<&str> = names.to_vec();
    while !left.is_empty() {
        let rows = w.status();
        let ended_unkilled: Vec<&&str> =
            left.iter().filter(|n| rows.iter().any(|r| r["name"] == **n && r["result"] == "ok")).collect();
        assert!(ended_unkilled.is_empty(), "{}: {ended_unkilled:?} completed before a kill: {rows:#?}", w.name);
        assert!(Instant::now() < deadline, "{}: {left:?} never ran a segment to kill: {rows:#?}", w.name);
        left.retain(|name| {
            let running = rows.iter().any(|r| r["name"] == *name && segment(r).1);
            // A segment may end (and its job wait to be requeued) between the look and the kill: then again.
            !(running && has_checkpoint(w, name) && kill_processes_of(&w.job_of(name)) > 0)
        });
        std::thread::sleep(Duration::from_millis(500));
    }
    w.wait(&format!("the killed jobs of {names:?} ended"), Duration::from_secs(120), |rows| {
        names.iter().all(|n| rows.iter().any(|r| r["name"] == *n && ENDED.iter().any(|s| r["state"] == *s)))
    });
    // Past the result grace (3 s) the runs of this file are given: `resume` judges them killed.
    std::thread::sleep(Duration::from_secs(4));
}

/// SIGKILL to every process whose environment has `SLURM_JOB_ID=job`
/// (not slurmstepd, which holds no job environment); how many.
fn kill_processes_of(job: &str) -> usize {
    let mark = format!("SLURM_JOB_ID={job}\0");
    let mut killed = 0;
    for e in std::fs::read_dir("/proc").expect("/proc").filter_map(|e| e.ok()) {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(environ) = std::fs::read(e.path().join("environ")) else { continue };
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if String::from_utf8_lossy(&environ).contains(&mark) && !comm.starts_with("slurmstepd") {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed += 1;
        }
    }
    killed
}

/// Whether config `name` has saved a checkpoint.
fn has_checkpoint(w: &ChainWorld, name: &str) -> bool {
    let records = w.records();
    records
        .values()
        .find(|r| r.name() == name)
        .is_some_and(|r| w.run_dir(r.hash().as_str()).join("checkpoint.txt").exists())
}

/// `submit` as the world asks it: interrupted by SIGINT once its intent is
/// on disk (local SLURM), killed at a failpoint (SSH), or plain (REST); then
/// `resume`, which must leave every config submitted once.
fn submit_with_a_fault(w: &ChainWorld, over: Over) {
    match over {
        Over::LocalSlurm => {
            let mut child = w.cmd("submit").arg(&w.file).spawn().expect("submit starts");
            let subs = w.state.join(&w.name).join("submissions");
            let deadline = Instant::now() + Duration::from_secs(30);
            while std::fs::read_dir(&subs).map(|d| d.count()).unwrap_or(0) == 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            let _ = child.wait();
        }
        Over::Ssh => {
            let out = w.cmd("submit").arg(&w.file).env("ORCHESTRATOR_FAILPOINT", "sbatch:answered").output();
            let out = out.expect("submit runs");
            assert_eq!(out.status.signal(), Some(9), "submit not killed at its failpoint: {}", common::text(&out));
        }
        Over::Rest => {
            w.run("submit", &[]);
        }
    }
    w.run("resume", &[]);
}

/// One world's whole case: a faulty submit, a killed segment resumed, the
/// rest run to the end; `Err` says what went wrong.
fn demo_under_faults(env: &Env, over: Over, name: &str) -> Result<(), String> {
    let w = chain_world(env, over, name);
    submit_with_a_fault(&w, over);
    wait_running_segment(&w, "steps100", 2);
    kill_segments(&w, &["steps100"]);
    let said = w.run("resume", &[]);
    if !said.contains("submitted 1 config") {
        return Err(format!("resume did not continue the killed chain once: {said}"));
    }
    w.wait("completed", CHAIN_LIMIT, all_completed);
    let jobs: BTreeMap<String, usize> = [("steps100".to_string(), 2)].into();
    verify(env, &w, &jobs, 3)
}

#[test]
fn cluster_the_chain_demo_completes_every_config_once_through_every_fault_on_each_transport() {
    let Some(env) = cluster(Use::Alone) else { return };
    let cases = [(Over::LocalSlurm, "chain-local"), (Over::Ssh, "chain-ssh"), (Over::Rest, "chain-rest")];
    let outcomes: Vec<Result<(), String>> = std::thread::scope(|s| {
        let env = &env;
        let runs: Vec<_> =
            cases.iter().map(|&(over, name)| s.spawn(move || demo_under_faults(env, over, name))).collect();
        // The controller restarted while every chain is mid-way.
        std::thread::sleep(Duration::from_secs(75));
        env.script(&["restart-slurmctld"]);
        runs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("panicked".into()))).collect()
    });
    let failed: Vec<String> =
        cases.iter().zip(&outcomes).filter_map(|((o, _), r)| r.as_ref().err().map(|e| format!("{o:?}: {e}"))).collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

/// Chains whose segments died, continued by a `resume` killed at failpoint
/// `fp`, then by a plain `resume`: two jobs each, completed once. Three
/// short configs (30, 35, 40 steps), so the protocol's between-records
/// failpoints fall between two of them.
fn continued_after_a_crash_at(env: &Env, fp: &str, name: &str) -> Result<(), String> {
    let w = chain_world(env, Over::Ssh, name);
    let text = std::fs::read_to_string(&w.file).map_err(|e| e.to_string())?;
    let short = text
        .replace("steps: 100}", "steps: 30}")
        .replace("steps: 110}", "steps: 35}")
        .replace("steps: 120}", "steps: 40}");
    std::fs::write(&w.file, short).map_err(|e| e.to_string())?;
    w.run("submit", &[]);
    let names = ["steps100", "steps110", "steps120"];
    kill_segments(&w, &names);
    let out = w.cmd("resume").arg(&w.file).args(["--result-grace", "3"]).env("ORCHESTRATOR_FAILPOINT", fp).output();
    let out = out.map_err(|e| e.to_string())?;
    if out.status.signal() != Some(9) {
        return Err(format!("resume not killed at {fp}: {}", common::text(&out)));
    }
    w.run("resume", &[]);
    w.wait("completed", CHAIN_LIMIT, all_completed);
    verify(env, &w, &names.iter().map(|n| (n.to_string(), 2)).collect(), 2)
}

#[test]
fn cluster_a_resume_killed_at_every_failpoint_continues_a_chain_once_from_its_checkpoint() {
    let Some(env) = cluster(Use::Shared) else { return };
    let outcomes: Vec<Result<(), String>> = std::thread::scope(|s| {
        let runs: Vec<_> = SUBMIT_PROTOCOL
            .iter()
            .enumerate()
            .map(|(i, fp)| {
                let env = &env;
                s.spawn(move || continued_after_a_crash_at(env, fp, &format!("chain-fp{i}")))
            })
            .collect();
        runs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("panicked".into()))).collect()
    });
    let failed: Vec<String> = SUBMIT_PROTOCOL
        .iter()
        .zip(&outcomes)
        .filter_map(|(fp, r)| r.as_ref().err().map(|e| format!("failpoint {fp}: {e}")))
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

#[test]
fn cluster_cancel_stops_a_chain_where_it_says_and_resume_leaves_it_stopped() {
    let Some(env) = cluster(Use::Shared) else { return };
    let w = chain_world(&env, Over::LocalSlurm, "chain-cancel");
    w.run("submit", &["steps=200"]);
    let name = only_config(&w);
    wait_running_segment(&w, &name, 2);
    let said = w.run("cancel", &[]);
    assert!(said.contains(&format!("stopped {name} at segment ")), "{said}");
    let rows = w.wait("cancelled", Duration::from_secs(60), |rows| rows.iter().all(|r| r["state"] == "CANCELLED"));
    let (seg, _) = segment(&rows[0]);
    assert!(said.contains(&format!("at segment {seg} of ≤12")), "cancel said {said:?}, status has segment {seg}");
    let again = w.run("resume", &["steps=200"]);
    assert!(again.contains("cancelled by `cancel`"), "{again}");
    std::thread::sleep(Duration::from_secs(20)); // a requeue racing the cancel would show by now
    let rows = w.status();
    assert_eq!(rows[0]["state"], "CANCELLED", "{rows:#?}");
    let per = env.jobs_per_config(&w.state, &w.name);
    assert_eq!(per.values().copied().collect::<Vec<_>>(), [1], "one job, never requeued after the cancel");
    let r = w.records().into_values().next().expect("a record");
    let marker = w.run_dir(r.hash().as_str()).join(".training_complete");
    assert!(!marker.exists(), "a stopped chain did not complete");
}

#[test]
fn cluster_a_requeue_slurm_refuses_is_continued_by_each_resume_from_its_checkpoint() {
    let Some(env) = cluster(Use::Shared) else { return };
    let w = chain_world(&env, Over::LocalSlurm, "chain-refused");
    // An `scontrol` first on the job's PATH that refuses every requeue.
    let bin = std::path::PathBuf::from(&w.remote_work).join("refusing-bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    std::fs::write(
        bin.join("scontrol"),
        "#!/bin/sh\necho 'scontrol: error: Requeue refused by the test' >&2\nexit 1\n",
    )
    .expect("scontrol");
    std::process::Command::new("chmod").arg("+x").arg(bin.join("scontrol")).status().expect("chmod");
    let text = std::fs::read_to_string(&w.file).expect("file");
    let text = text.replacen(
        "\ncommand:\n",
        &format!("\ncommand:\n  env: {{PATH: \"{}:/usr/bin:/bin\"}}\n", bin.display()),
        1,
    );
    std::fs::write(&w.file, text).expect("file");
    w.run("submit", &["steps=30"]);
    let name = only_config(&w);
    let deadline = Instant::now() + CHAIN_LIMIT;
    let mut resumes = 0;
    loop {
        let rows = w.status();
        if all_completed(&rows) {
            break;
        }
        assert!(Instant::now() < deadline, "not completed: {rows:#?}");
        if rows[0]["state"] == "COMPLETED" && rows[0]["chain"]["between"] == true {
            let said = w.run("resume", &["steps=30"]);
            assert!(said.contains("submitted 1 config"), "{said}");
            resumes += 1;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    assert!(resumes >= 1, "no segment was left for resume");
    let attempts = w.records().into_values().next().expect("a record").attempts().len();
    assert_eq!(attempts, resumes + 1, "one attempt a resume, none twice");
    verify(&env, &w, &[(name, resumes + 1)].into(), 2).unwrap();
}
