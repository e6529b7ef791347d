//! `install --warm` on the real SLURM test cluster with this build's worker
//! (CPU, flex): the worker is installed, one warm-up job is submitted with the
//! cluster's `defaults:` (through SSH, and through slurmrestd), it ends
//! COMPLETED, the node's kernel cache is under `<work_dir>/cache/<host>/`,
//! and the job's log lists every family ok. No sweep's state records it.
//! Fails when the cluster is absent unless `SWEEP_SKIP_CLUSTER_TESTS=1`.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{cluster, text, worker_binary, Env, Use};

/// The clusters file entry `test` through `transport` (`ssh` or `rest`).
fn clusters_entry(env: &Env, transport: &str, work: &str) -> String {
    let access = match transport {
        "ssh" => env.ssh_fields(),
        _ => format!(
            "    url: {}\n    token_file: {}\n    files: local\n",
            env.get("SWEEP_TEST_REST_URL"),
            env.get("SWEEP_TEST_REST_TOKEN_FILE")
        ),
    };
    format!(
        "clusters:\n  test:\n    transport: {transport}\n    user: {}\n{access}    work_dir: {work}\n    defaults: {{partition: gpu, time: \"00:10:00\", cpus_per_task: 1, gres: \"gpu:1\"}}\n",
        env.get("SWEEP_TEST_SSH_USER")
    )
}

/// SLURM's state of job `id` once it ended (sacct, else squeue), waiting up to `limit`.
fn ended(env: &Env, id: &str, limit: Duration) -> String {
    let t0 = Instant::now();
    loop {
        let sacct = env.slurm(&["sacct", "-j", id, "--noheader", "--parsable2", "--allocations", "--format=State"]);
        let state = sacct.lines().next().unwrap_or("").trim().to_string();
        if !state.is_empty() && !["PENDING", "RUNNING", "COMPLETING", "CONFIGURING"].contains(&state.as_str()) {
            return state;
        }
        assert!(t0.elapsed() < limit, "job {id} has not ended after {limit:?}: {state:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn install_warm_completes_and_fills_the_nodes_cache(transport: &str) {
    let Some(env) = cluster(Use::Shared) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let work = env.remote_work(&format!("warm-{transport}"));
    let clusters = dir.path().join("clusters.yaml");
    std::fs::write(&clusters, clusters_entry(&env, transport, &work)).expect("clusters file");
    let state = dir.path().join("state");
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .args(["install", "--cluster", "test", "--warm", "--backend", "flex", "--worker"])
        .arg(worker_binary())
        .arg("--clusters")
        .arg(&clusters)
        .arg("--state-dir")
        .arg(&state)
        .arg("--templates")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates"))
        .output()
        .expect("install runs");
    let said = text(&out);
    assert!(out.status.success(), "install --warm: {said}");
    eprintln!("{said}");
    assert!(said.contains(&format!("installed {work}/bin/worker")), "{said}");
    let job = said.split("submitted warm-up job ").nth(1).and_then(|r| r.split_whitespace().next()).expect(&said);
    assert!(said.contains("worker warm --backend flex into "), "the backend asked for: {said}");
    let log = said.lines().find_map(|l| l.split_once("configs ok` at the end: ").map(|(_, p)| p.trim())).expect(&said);
    assert!(log.starts_with(&format!("{work}/warm/")) && log.ends_with("/warm.out"), "{log}");

    let state_of = ended(&env, job, Duration::from_secs(300));
    let log_text = std::fs::read_to_string(log).unwrap_or_else(|e| panic!("{log}: {e}"));
    assert_eq!(state_of, "COMPLETED", "{log_text}");
    for family in ["unet", "dit", "hdit", "uvit"] {
        for precision in ["fp32", "bf16-amp"] {
            let ok = format!("warm {family}-{precision}: ok in ");
            assert!(log_text.lines().any(|l| l.starts_with(&ok)), "{ok}… missing:\n{log_text}");
        }
    }
    assert!(log_text.contains("warm: 8 of 8 configs ok"), "{log_text}");
    // The node's cache, where the profiling jobs of that node look (templates/profile.sbatch.hbs).
    let host = Command::new("hostname").arg("-s").output().expect("hostname");
    let node_cache = Path::new(&work).join("cache").join(String::from_utf8_lossy(&host.stdout).trim());
    let versions: Vec<_> = std::fs::read_dir(&node_cache)
        .unwrap_or_else(|e| panic!("{}: {e}\n{log_text}", node_cache.display()))
        .map(|e| e.expect("entry").path())
        .collect();
    assert!(versions.len() == 1 && versions[0].join("stamp.json").is_file(), "{versions:?}");
    assert!(versions[0].join("cubecl").is_dir(), "{versions:?}");
    // No sweep's state knows of it, here or on the cluster.
    let local: Vec<_> = std::fs::read_dir(&state).map(|rd| rd.filter_map(|e| e.ok()).collect()).unwrap_or_default();
    assert!(local.is_empty(), "{local:?}");
    assert!(!Path::new(&work).join("state/warm").exists(), "the warm-up's events are not in the cluster's state");
    let _ = std::fs::remove_dir_all(Path::new(&work).join("bin"));
}

#[test]
fn install_warm_over_ssh_completes_and_fills_the_nodes_cache() {
    install_warm_completes_and_fills_the_nodes_cache("ssh");
}

#[test]
fn install_warm_through_slurmrestd_completes_and_fills_the_nodes_cache() {
    install_warm_completes_and_fills_the_nodes_cache("rest");
}
