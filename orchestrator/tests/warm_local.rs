//! `install --cluster local --warm`: with the `local` transport there is
//! nothing to upload, and the warm-up job runs through its local runner as
//! its profiling arrays do, filling `<work_dir>/cache/<host>/` (the work dir
//! of `local` without one being `<state>/.local-cluster`: nothing is written
//! beside the state directory). No cluster needed.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn install_warm_on_the_local_transport_runs_the_warm_up_job_here() {
    let worker = common::worker_binary(); // the worker beside the orchestrator, which `local` runs
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .current_dir(dir.path())
        .args(["install", "--cluster", "local", "--warm", "--backend", "flex", "--state-dir"])
        .arg(dir.path().join("state"))
        .output()
        .expect("orchestrator runs");
    let said = common::text(&out);
    assert!(out.status.success(), "{said} ({})", worker.display());
    assert!(said.starts_with("nothing to install on local"), "{said}");
    assert!(said.contains("worker warm --backend flex into "), "{said}");
    assert!(!said.contains("sacct"), "no sacct for the local runner: {said}");
    let log = said.lines().find_map(|l| l.split_once("configs ok` at the end: ").map(|(_, p)| p.trim())).expect(&said);
    let log = Path::new(log);
    let work = dir.path().join("state/.local-cluster");
    assert!(log.starts_with(work.join("warm")), "{}", log.display());
    let t0 = Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains("warm: ") {
            break text;
        }
        assert!(t0.elapsed() < Duration::from_secs(300), "the warm-up has not ended:\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(text.contains("warm: 8 of 8 configs ok"), "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("warm ") && l.contains(": ok in ")).count(), 8, "{text}");
    let host = Command::new("hostname").arg("-s").output().expect("hostname");
    let cache = work.join("cache").join(String::from_utf8_lossy(&host.stdout).trim());
    let stamps: Vec<_> = std::fs::read_dir(&cache).expect("the node's cache").map(|e| e.unwrap().path()).collect();
    assert!(stamps.len() == 1 && stamps[0].join("stamp.json").is_file(), "{stamps:?}");
    // The local runner marks the job finished (before the temp dir goes).
    let job = said.split("submitted warm-up job ").nth(1).and_then(|r| r.split_whitespace().next()).expect(&said);
    let finished = dir.path().join("state/.local-jobs").join(job).join("finished");
    while !finished.exists() {
        assert!(t0.elapsed() < Duration::from_secs(300), "{} never appeared", finished.display());
        std::thread::sleep(Duration::from_millis(100));
    }
    // Nothing in the directory it ran from but the state directory.
    let here: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(here, ["state"], "files left beside the state directory");
}
