//! `install --cluster local --warm`: with the `local` transport there is
//! nothing to upload, and the warm-up job runs through its local runner as
//! its profiling arrays do, filling `<work_dir>/cache/<host>/` (the work dir
//! of `local` without one being `<state>/.local-cluster`: nothing is written
//! beside the state directory). And `install` on a `local-slurm` cluster in a
//! temp dir (an upload through this machine's files, no SLURM command): a
//! worker without the backend asked for, or without a GPU backend where the
//! jobs ask for a GPU, is refused before anything is uploaded. No cluster needed.

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

/// A `local-slurm` cluster `login` in `dir` whose jobs ask for `defaults`:
/// `install` puts the worker at `<dir>/work/bin/worker`, which it returns.
fn login_cluster(dir: &Path, defaults: &str) -> std::path::PathBuf {
    let work = dir.join("work");
    let text = format!(
        "clusters:\n  login:\n    transport: local-slurm\n    work_dir: {}\n    defaults: {defaults}\n",
        work.display()
    );
    std::fs::write(dir.join("clusters.yaml"), text).expect("clusters file");
    work.join("bin/worker")
}

/// `orchestrator install --cluster login --worker WORKER [args]` in `dir`.
fn install(dir: &Path, worker: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .current_dir(dir)
        .args(["install", "--cluster", "login", "--clusters", "clusters.yaml", "--state-dir", "state", "--worker"])
        .arg(worker)
        .args(args)
        .output()
        .expect("orchestrator runs")
}

/// A worker as README's first steps build it (`cargo build -p worker`, the
/// default features: the CPU backend alone), as far as `install` asks one:
/// `--version` and `backends`. (This build's worker has GPU backends too.)
fn cpu_only_worker(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("cpu-worker");
    let script = "#!/bin/sh\ncase \"$1\" in --version) echo 'worker 0.1.0';; backends) echo flex;; *) exit 2;; esac\n";
    std::fs::write(&path, script).expect("worker script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// The backends `worker` says it has (`worker backends`, one a line).
fn backends_of(worker: &Path) -> Vec<String> {
    let out = Command::new(worker).arg("backends").output().expect("the worker runs");
    assert!(out.status.success(), "{} backends: {}", worker.display(), common::text(&out));
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(String::from).collect()
}

/// `install --backend B` of `worker` on a GPU partition: refused before the
/// upload for a backend it lacks (the message names what it has and the
/// build that has it), uploaded for one it has. Judged against the backends
/// the worker itself lists, so it holds however the worker was built.
fn refuses_a_missing_backend_and_takes_one_it_has(worker: &Path) {
    let has = backends_of(worker);
    let dir = tempfile::tempdir().expect("tempdir");
    let installed = login_cluster(dir.path(), "{partition: gpu}");
    match ["cuda", "vulkan", "wgpu", "flex"].into_iter().find(|b| !has.iter().any(|h| h == b)) {
        Some(missing) => {
            let out = install(dir.path(), worker, &["--backend", missing]);
            let said = common::text(&out);
            assert!(!out.status.success(), "{said}");
            let names =
                format!("was built without the `{missing}` backend `install --backend` names (it has: {}", has[0]);
            assert!(said.contains(&names), "{said}");
            assert!(said.contains("nothing was uploaded to `login`"), "{said}");
            assert!(said.contains(&format!("cargo build --release -p worker --features {missing}")), "{said}");
            assert!(!installed.exists(), "a refused worker was uploaded");
        }
        None => eprintln!("{} has every backend ({has:?}): no refusal to check", worker.display()),
    }
    // A backend it has goes up (a GPU one where it has one).
    let gpu = has.iter().find(|b| *b != "flex").unwrap_or(&has[0]);
    let out = install(dir.path(), worker, &["--backend", gpu]);
    assert!(out.status.success(), "{}", common::text(&out));
    assert!(installed.is_file());
}

#[test]
fn install_refuses_a_worker_without_the_backend_it_names_before_uploading() {
    // This build's worker, with whatever backends it was built with
    // (`cargo build --workspace` gives `flex` alone; scripts/test.sh every one).
    refuses_a_missing_backend_and_takes_one_it_has(&common::worker_binary());
    // A worker as `cargo build -p worker` builds it (`flex` alone), as a fresh clone has.
    let dir = tempfile::tempdir().expect("tempdir");
    refuses_a_missing_backend_and_takes_one_it_has(&cpu_only_worker(dir.path()));
}

#[test]
fn install_refuses_a_cpu_only_worker_where_the_jobs_ask_for_a_gpu() {
    let dir = tempfile::tempdir().expect("tempdir");
    let installed = login_cluster(dir.path(), "{partition: gpu, gres: \"gpu:1\"}");
    let cpu = cpu_only_worker(dir.path());
    let out = install(dir.path(), &cpu, &[]);
    let said = common::text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("has no GPU backend (it has: flex) and the jobs ask SLURM for a GPU (`--gres=gpu:1`)"),
        "{said}"
    );
    assert!(said.contains("nothing was uploaded to `login`"), "{said}");
    assert!(said.contains("cargo build --release -p worker --features vulkan"), "{said}");
    assert!(said.contains("`install --backend flex`"), "{said}");
    assert!(!installed.exists(), "a refused worker was uploaded");
    // Named as the backend the jobs are to run, it goes up.
    let out = install(dir.path(), &cpu, &["--backend", "flex"]);
    assert!(out.status.success(), "{}", common::text(&out));
    assert!(installed.is_file());
    // This build's worker goes up without a word where it has a GPU backend,
    // and is refused as the CPU one is where it was built with `flex` alone.
    let worker = common::worker_binary();
    let out = install(dir.path(), &worker, &[]);
    let said = common::text(&out);
    if backends_of(&worker).iter().any(|b| b != "flex") {
        assert!(out.status.success() && said.starts_with("installed "), "{said}");
    } else {
        eprintln!("{} has no GPU backend (`cargo build -p worker --features vulkan` builds one)", worker.display());
        assert!(!out.status.success() && said.contains("has no GPU backend (it has: flex)"), "{said}");
    }
}
