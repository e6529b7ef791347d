//! `submit --active` on the real SLURM test cluster with the real worker
//! (CPU, flex, under a memory limit so the larger configs run out of memory):
//! the orchestrator is SIGKILLed between rounds (its first round submitted,
//! still running) and run again; it waits for that round, goes on, and stops
//! at its run budget. No config is ever submitted twice, the rounds are in the
//! journal, and the answer lists measured and predicted configs apart.
//! Fails when the cluster is absent unless `SWEEP_SKIP_CLUSTER_TESTS=1`.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{cluster, worker_binary, Use};

const EXPERIMENT: &str = "name: ca-active\ndescription: active sweep end to end\ncluster: test\n\
gpu: A100-SXM4-80GB\nprecision: fp32\nruntime: burn-flex\nbatch: 1\n\
input: {channels: 1, spatial: [8, 8, 8]}\noutput_channels: 1\narray_parallelism: 2\n\
worker: {backend: flex, memory_limit: 32MiB}\n\
model: {family: dit, hidden: 64, heads: 4, depth: 2, patch: 4}\n\
sweep:\n  configs:\n\
\x20   - {name: dit_p4_8}\n\
\x20   - {name: dit_p2_8, model: {family: dit, hidden: 64, heads: 4, depth: 2, patch: 2}}\n\
\x20   - {name: dit_p4_16, input.spatial: [16, 16, 16]}\n\
\x20   - {name: unet_8, model: {family: unet, channels: [32, 64], attention_levels: [false, false], num_res_blocks: 1, num_head_channels: 32}}\n\
\x20   - {name: unet_16, input.spatial: [16, 16, 16], model: {family: unet, channels: [32, 64], attention_levels: [false, true], num_res_blocks: 1, num_head_channels: 32}}\n\
\x20   - {name: unet_16_plain, input.spatial: [16, 16, 16], model: {family: unet, channels: [32, 64], attention_levels: [false, false], num_res_blocks: 1, num_head_channels: 32}}\n";

/// Every submission's config hashes, by submission id.
fn submissions(state: &Path) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(state.join("submissions")) else { return out };
    for e in rd.filter_map(|e| e.ok()) {
        let Ok(bytes) = std::fs::read(e.path().join("submission.json")) else { continue };
        let v: serde_json::Value = serde_json::from_slice(&bytes).expect("submission.json");
        let tasks = v["tasks"].as_array().expect("tasks").iter().map(|t| t.as_str().expect("hash").to_string());
        out.insert(e.file_name().to_string_lossy().into_owned(), tasks.collect());
    }
    out
}

#[test]
fn cluster_active_sweep_killed_between_rounds_resumes_without_a_duplicate() {
    let Some(env) = cluster(Use::Shared) else { return };
    let dir = std::env::temp_dir().join(format!("sweep-cluster-active-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("test dir");
    let remote_work = env.remote_work("ca");
    let clusters = env.ssh_clusters_file(&dir, &remote_work, common::JOB_DEFAULTS);
    let file = dir.join("ca-active.yaml");
    std::fs::write(&file, EXPERIMENT).expect("experiment file");
    let run = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_orchestrator"));
        c.args(args).arg("--clusters").arg(&clusters).arg("--state-dir").arg(dir.join("state"));
        c.arg("--templates").arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../templates"));
        c
    };
    let worker = worker_binary().to_string_lossy().into_owned();
    let out = run(&["install", "--cluster", "test", "--worker", &worker]).output().expect("install");
    assert!(out.status.success(), "install: {}", String::from_utf8_lossy(&out.stderr));
    let f = file.to_string_lossy().into_owned();
    let active = ["submit", &f, "--active", "--target-error", "1%", "--max-runs", "4", "--round-size", "2"];
    let state = dir.join("state/ca-active");
    let journal = state.join("journal.jsonl");

    // First run: killed once its first round is submitted (SLURM has the array).
    let mut child = run(&active).arg("--poll-interval").arg("0.5").stdout(Stdio::null()).spawn().expect("spawn");
    let t0 = Instant::now();
    loop {
        let j = std::fs::read_to_string(&journal).unwrap_or_default();
        if j.contains("\"op\":\"active_round\"") && j.contains("\"state\":\"submitted\"") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no round submitted:\n{j}");
        assert!(child.try_wait().expect("wait").is_none(), "the loop ended before it was killed");
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().expect("SIGKILL the orchestrator");
    child.wait().expect("reaped");
    let first = submissions(&state);
    assert_eq!(first.len(), 1, "one round, one array: {first:?}");

    // Run again: it waits for the killed run's round, then goes on to the budget.
    let out = run(&active).arg("--poll-interval").arg("0.5").output().expect("submit --active again");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    let subs = submissions(&state);
    let mut seen = BTreeMap::new();
    for (id, hashes) in &subs {
        for h in hashes {
            assert!(seen.insert(h.clone(), id.clone()).is_none(), "{h} submitted twice: {subs:?}");
        }
    }
    assert_eq!(seen.len(), 4, "the budget: 4 runs in all: {subs:?}");
    assert!(first.keys().all(|k| subs.contains_key(k)), "the first round kept");
    let j = std::fs::read_to_string(&journal).expect("journal");
    let rounds: Vec<u64> = j
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["op"] == "active_round")
        .map(|v| v["round"].as_u64().expect("round"))
        .collect();
    // Rounds numbered on from the killed run's (how many the budget takes
    // depends on the calibration's bands: 2 or 3 today).
    let expected: Vec<u64> = (1..=rounds.len() as u64).collect();
    assert!(rounds.len() >= 2 && rounds == expected, "{j}");
    // The budget (4 runs) and the answers may end it in the same round: either stop is true.
    let stop = format!("stopped after {} rounds: ", rounds.len());
    assert!(text.contains(&stop), "{text}");
    let (measured, predicted) = text.split_once("predicted (not run):").expect("predicted rows apart");
    assert_eq!(measured.lines().filter(|l| l.starts_with("  ")).count(), 4, "{text}");
    assert!(measured.contains(" oom"), "the memory limit makes a measured config run out of memory:\n{text}");
    let predicted: Vec<&str> = predicted.lines().filter(|l| l.starts_with("  ")).collect();
    assert_eq!(predicted.len(), 2, "{text}");
    // Saved: the settled predictions only (a 1% target leaves bands open; a
    // config predicted above the memory limit is settled whatever its band).
    let saved = predicted.iter().filter(|l| !l.contains("(not settled)")).count();
    let runs = if saved == 1 { "run" } else { "runs" };
    assert!(text.contains("6 configs: 4 measured, 2 predicted without a run"), "{text}");
    assert!(text.contains(&format!("; {saved} {runs} saved")), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The job script of a cluster whose worker cannot write its events (an
/// unwritable state directory): the real worker starts and fails on every
/// config, as it would on a misconfigured shared filesystem.
fn broken_template(dir: &Path) -> PathBuf {
    let real =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../templates/profile.sbatch.hbs"))
            .expect("the profile template");
    let broken = real.replace("--state-dir {{sh state_dir}}", "--state-dir /proc/sweep-unwritable/state");
    assert_ne!(broken, real, "the template names the worker's state dir");
    let templates = dir.join("templates");
    std::fs::create_dir_all(&templates).expect("templates dir");
    std::fs::write(templates.join("unwritable.sbatch.hbs"), broken).expect("template");
    templates
}

#[test]
fn cluster_active_sweep_whose_first_round_fails_stops_with_the_cause_and_saves_nothing() {
    let Some(env) = cluster(Use::Shared) else { return };
    let dir = std::env::temp_dir().join(format!("sweep-cluster-active-fail-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("test dir");
    let remote_work = env.remote_work("caf");
    let clusters = env.ssh_clusters_file(&dir, &remote_work, common::JOB_DEFAULTS);
    let templates = broken_template(&dir);
    let file = dir.join("ca-fail.yaml");
    // No memory limit: no config is predicted out of memory (which would settle it without a run).
    let experiment = EXPERIMENT
        .replace("name: ca-active", "name: ca-fail")
        .replace("array_parallelism: 2\n", "array_parallelism: 2\ntemplate: unwritable\n")
        .replace("worker: {backend: flex, memory_limit: 32MiB}", "worker: {backend: flex}");
    assert!(experiment.contains("template: unwritable") && !experiment.contains("memory_limit"), "{experiment}");
    std::fs::write(&file, experiment).expect("experiment file");
    let run = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_orchestrator"));
        c.args(args).arg("--clusters").arg(&clusters).arg("--state-dir").arg(dir.join("state"));
        c.arg("--templates").arg(&templates).arg("--result-grace").arg("1");
        c.output().expect("orchestrator runs")
    };
    let worker = worker_binary().to_string_lossy().into_owned();
    let out = run(&["install", "--cluster", "test", "--worker", &worker]);
    assert!(out.status.success(), "install: {}", String::from_utf8_lossy(&out.stderr));
    let f = file.to_string_lossy().into_owned();
    let out = run(&["submit", &f, "--active", "--round-size", "2", "--poll-interval", "0.5"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    // One round of two runs, both failed: the loop stops there, with the cause.
    let subs = submissions(&dir.join("state/ca-fail"));
    assert_eq!(subs.values().map(Vec::len).sum::<usize>(), 2, "one round of two, no more asked: {subs:?}");
    assert!(text.contains("round 1: 0 measured, 2 could not be measured"), "{text}");
    assert!(text.contains("stopped after 1 round: every run of the last round failed"), "{text}");
    assert!(text.contains("2 configs could not be measured:\n"), "{text}");
    // The worker's own error (its log's last line: it could not write its
    // events under the unwritable state dir), not the job's exit code alone.
    assert!(text.contains("No such file or directory (os error 2)"), "the worker's own error is the cause:\n{text}");
    // Nothing settled by the failure, nothing saved.
    assert!(!text.contains("Settled") && !text.contains("settled by its prediction"), "{text}");
    assert!(text.contains("6 configs: 0 measured, 4 predicted without a run"), "{text}");
    assert!(text.contains("2 could not be measured; 0 runs saved"), "{text}");
    let jobs = env.jobs_per_config(&dir.join("state"), "ca-fail");
    assert_eq!(jobs.values().sum::<usize>(), 2, "SLURM ran two tasks in all: {jobs:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
