//! The harness every cluster integration test shares: where the test
//! cluster is, its variables and scripts, the async runtime, the worker binary.
// Each test file uses part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

/// The tests of one file run one at a time (they share the one test cluster).
pub static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The test cluster's variables (`scripts/test-cluster.sh up` writes them).
pub struct Env(pub BTreeMap<String, String>);

impl Env {
    pub fn get(&self, k: &str) -> String {
        self.0.get(k).cloned().unwrap_or_else(|| panic!("{k} missing from the test cluster env file"))
    }

    pub fn port(&self, k: &str) -> u16 {
        self.get(k).parse().expect("port")
    }

    /// `test-cluster.sh ARGS…` on this cluster (its dir and ports); its stdout.
    pub fn script(&self, args: &[&str]) -> String {
        let out = Command::new(self.get("SWEEP_TEST_SCRIPT"))
            .args(args)
            .env("SWEEP_TEST_CLUSTER_DIR", self.get("SWEEP_TEST_CLUSTER_DIR"))
            .env("SWEEP_TEST_PORT_BASE", (self.port("SWEEP_TEST_SSH_PORT") - 2).to_string())
            .env_remove("SLURM_JWT")
            .output()
            .expect("test-cluster.sh runs");
        assert!(out.status.success(), "test-cluster.sh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A SLURM command on the cluster machine: the test's own view, not the orchestrator's.
    pub fn slurm(&self, argv: &[&str]) -> String {
        let out = Command::new(argv[0])
            .args(&argv[1..])
            .env("SLURM_CONF", self.get("SLURM_CONF"))
            .output()
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        assert!(out.status.success(), "{argv:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// The running test cluster, or `None` when skipping was asked for.
pub fn cluster() -> Option<Env> {
    cluster_env().map(Env)
}

/// The runtime the async commands run on.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// A command's stdout and stderr, together.
pub fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The worker binary of this build: tests run from `target/<profile>/deps/`,
/// binaries sit in `target/<profile>/`. A fresh clone's `cargo test` has
/// not built it (cargo builds only the tested package's binaries): then it
/// is built here, once, with the cargo that runs the tests.
pub fn worker_binary() -> PathBuf {
    static BUILD: Mutex<()> = Mutex::new(());
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>");
    let w = profile_dir.join("worker");
    let _one = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    if !w.is_file() {
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        eprintln!(
            "building the worker for this test (cargo build -p worker{})",
            if release { " --release" } else { "" }
        );
        let mut build = Command::new(env!("CARGO"));
        build.args(["build", "-p", "worker", "--locked"]).current_dir(env!("CARGO_MANIFEST_DIR"));
        if release {
            build.arg("--release");
        }
        let status = build.status().expect("cargo runs");
        assert!(status.success() && w.is_file(), "cargo build -p worker failed; no worker at {}", w.display());
    }
    w
}

/// The variables `scripts/test-cluster.sh up` wrote to its `env` file, or
/// `None` when the cluster is absent and skipping was asked for explicitly.
pub fn cluster_env() -> Option<BTreeMap<String, String>> {
    let dir = std::env::var("SWEEP_TEST_CLUSTER_DIR").unwrap_or_else(|_| "/tmp/sweep-test-cluster".into());
    let path = Path::new(&dir).join("env");
    let Ok(text) = std::fs::read_to_string(&path) else {
        if std::env::var("SWEEP_SKIP_CLUSTER_TESTS").is_ok_and(|v| v == "1") {
            eprintln!("SKIPPED: no test cluster at {dir} and SWEEP_SKIP_CLUSTER_TESTS=1");
            return None;
        }
        panic!(
            "no test cluster: {} is missing. Start it with `scripts/test-cluster.sh up` \
             (or set SWEEP_SKIP_CLUSTER_TESTS=1 to skip the cluster tests explicitly)",
            path.display()
        );
    };
    Some(
        text.lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// A light job template: each array task copies its manifest line to
/// `task-N.json` (no worker), then sleeps `$SWEEP_TEST_SLEEP` seconds (0 when unset).
pub const RECORD_TEMPLATE: &str = r#"#!/bin/bash
#SBATCH --job-name={{sbatch job_name}}
#SBATCH --comment={{sbatch comment}}
#SBATCH --array={{sbatch array}}
#SBATCH --output={{sbatch log_dir}}/%a.out
#SBATCH --chdir={{sbatch submission_dir}}
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=1
#SBATCH --time=00:05:00
{{#if slurm.partition}}
#SBATCH --partition={{sbatch slurm.partition}}
{{/if}}
set -eu
out={{sh submission_dir}}/task-$SLURM_ARRAY_TASK_ID.json
sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {{sh manifest_jsonl}} > "$out.tmp"
mv "$out.tmp" "$out"
sleep "${SWEEP_TEST_SLEEP:-0}"
"#;
