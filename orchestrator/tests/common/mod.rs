//! The harness every cluster integration test shares: where the test
//! cluster is, its variables and scripts, the async runtime, the worker binary.
// Each test file uses part of it.
#![allow(dead_code)]

pub mod chain_world;
pub mod ssh_world;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

/// The tests of one file run one at a time (they share the node and fixtures).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The job defaults of a test that runs the worker: the `gpu` partition, ten
/// minutes, one CPU.
pub const JOB_DEFAULTS: &str = r#"{partition: gpu, time: "00:10:00", cpus_per_task: 1}"#;

/// How a test uses the one test cluster, which the cluster test binaries
/// share: `scripts/test.sh` runs them side by side.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Leaves every daemon as it found it: tests of other binaries run meanwhile.
    Shared,
    /// Stops, pauses or restarts a daemon (slurmctld, sshd, slurmrestd, the
    /// bastion): no other binary's test runs meanwhile.
    Alone,
}

/// The test cluster's variables (`scripts/test-cluster.sh up` writes them),
/// and the cluster held for the test that asked (see [`cluster`]) while they live.
pub struct Env {
    vars: BTreeMap<String, String>,
    _held: (std::sync::MutexGuard<'static, ()>, std::fs::File),
}

impl Env {
    pub fn get(&self, k: &str) -> String {
        self.vars.get(k).cloned().unwrap_or_else(|| panic!("{k} missing from the test cluster env file"))
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

    /// A fresh remote work dir for `test` under the cluster's work root,
    /// `<test>-<pid>` (runs of the tests do not meet); those of earlier runs,
    /// their process gone, are removed first.
    pub fn remote_work(&self, test: &str) -> String {
        let root = self.get("SWEEP_TEST_WORK_DIR");
        for e in std::fs::read_dir(&root).into_iter().flatten().filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.strip_prefix(&format!("{test}-")).and_then(|p| p.parse::<i32>().ok()) else {
                continue;
            };
            // SAFETY: signal 0 only checks whether the process exists.
            if pid != std::process::id() as i32 && unsafe { libc::kill(pid, 0) } != 0 {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        format!("{root}/{test}-{}", std::process::id())
    }

    /// `dir/clusters.yaml` with one entry, `test`: the test cluster over SSH,
    /// working in `work_dir`, with the job `defaults` given (a YAML flow
    /// map, e.g. [`JOB_DEFAULTS`]). Its path.
    pub fn ssh_clusters_file(&self, dir: &Path, work_dir: &str, defaults: &str) -> PathBuf {
        let path = dir.join("clusters.yaml");
        let text = format!(
            "clusters:\n  test:\n    transport: ssh\n{}    user: {}\n    work_dir: {work_dir}\n    defaults: {defaults}\n",
            self.ssh_fields(),
            self.get("SWEEP_TEST_SSH_USER")
        );
        std::fs::write(&path, text).expect("clusters file");
        path
    }

    /// [`Env::ssh_clusters_file`] with `test` reaching SLURM through the
    /// test cluster's slurmrestd (JWT from its token file; files on this
    /// machine, where the test cluster runs).
    pub fn rest_clusters_file(&self, dir: &Path, work_dir: &str, defaults: &str) -> PathBuf {
        let path = dir.join("clusters.yaml");
        let text = format!(
            "clusters:\n  test:\n    transport: rest\n    url: {}\n    user: {}\n    token_file: {}\n    files: local\n    \
             max_array_size: 100\n    work_dir: {work_dir}\n    defaults: {defaults}\n",
            self.get("SWEEP_TEST_REST_URL"),
            self.get("SWEEP_TEST_SSH_USER"),
            self.get("SWEEP_TEST_REST_TOKEN_FILE")
        );
        std::fs::write(&path, text).expect("clusters file");
        path
    }

    /// The SSH fields of a clusters-file entry for the test cluster's node
    /// (host, port, key, known_hosts; `user` is the entry's own, REST's too),
    /// indented for an entry's body.
    pub fn ssh_fields(&self) -> String {
        format!(
            "    host: {}\n    port: {}\n    identity_file: {}\n    known_hosts: {}\n",
            self.get("SWEEP_TEST_SSH_HOST"),
            self.get("SWEEP_TEST_SSH_PORT"),
            self.get("SWEEP_TEST_SSH_KEY"),
            self.get("SWEEP_TEST_KNOWN_HOSTS")
        )
    }

    /// Every task SLURM knows, from the cluster's own sacct and squeue, as
    /// (array job id, task id, job name).
    pub fn slurm_tasks(&self) -> BTreeSet<(String, u32, String)> {
        let sacct = self.slurm(&[
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            "--starttime=now-1days",
            "--format=JobID,JobIDRaw,JobName,State,ExitCode",
        ]);
        // `--states=all`: tasks that ended recently, which sacct may not have yet.
        let squeue = self.slurm(&[
            "squeue",
            "--noheader",
            "--array",
            "--states=all",
            &format!("--format={}", orchestrator::slurm::SQUEUE_FORMAT),
        ]);
        // Jobs that are no arrays (the warm-up job of `install --warm`: task id
        // `N/A`) are no sweep's tasks; the orchestrator's own squeue asks by name.
        let array_tasks: String = squeue
            .lines()
            .filter(|l| l.split('|').nth(3).is_some_and(|t| t != "N/A"))
            .map(|l| format!("{l}\n"))
            .collect();
        orchestrator::slurm::parse_sacct(&sacct)
            .expect("sacct parses")
            .into_iter()
            .chain(orchestrator::slurm::parse_squeue(&array_tasks).expect("squeue parses"))
            .map(|o| (o.array_job_id.to_string(), o.task_id, o.name))
            .collect()
    }

    /// How many SLURM tasks ran each config of experiment `exp` in the state
    /// dir `state_root`: SLURM's jobs mapped back to configs through the
    /// submissions' task lists (a task that runs several configs counts for
    /// each). Jobs of earlier runs (same names, submitted before this state's
    /// first submission) are not counted. A job of this experiment submitted
    /// since that no stored submission lists is a lost submission: it panics.
    pub fn jobs_per_config(&self, state_root: &Path, exp: &str) -> BTreeMap<String, usize> {
        let subs = submissions(state_root, exp);
        let since = subs.iter().map(|s| s.intended_at).fold(f64::INFINITY, f64::min);
        let by_name: BTreeMap<String, orchestrator::state::Submission> =
            subs.into_iter().map(|s| (s.job_name.clone(), s)).collect();
        let ours = format!("sw-{}-{}-", orchestrator::slurm::slug(exp, 24), orchestrator::submit::experiment_hash(exp));
        let tasks = self.slurm_tasks();
        // After the tasks, so it should know each of them; but a job can pass
        // from squeue's view to sacct's (slurmdbd a step behind) in between:
        // asked again until it does, for up to 10 s.
        let mut submitted = self.submit_times();
        for _ in 0..10 {
            if tasks.iter().all(|(_, _, name)| submitted.contains_key(name)) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_secs(1));
            submitted = self.submit_times();
        }
        let mut count: BTreeMap<String, usize> = BTreeMap::new();
        // Whole seconds in UTC on both sides; one second of slack for the rounding.
        let since_text = orchestrator::fsio::utc_timestamp(since - 1.0);
        for (_, task, name) in tasks {
            let at = submitted.get(&name).unwrap_or_else(|| panic!("SLURM gives no submit time for job {name}"));
            let recent = since.is_finite() && *at >= since_text;
            let Some(s) = by_name.get(&name) else {
                assert!(
                    !(name.starts_with(&ours) && recent),
                    "SLURM ran job {name} (task {task}, submitted {at}) of experiment {exp}, \
                     which no stored submission lists: a submission was lost"
                );
                continue;
            };
            // Our own jobs are recent by the same clock, or the check above could not see a lost one.
            assert!(recent, "job {name} of this state submitted {at}, before its first intent ({since_text})");
            for config in s.configs_of(task) {
                *count.entry(config.to_string()).or_default() += 1;
            }
        }
        count
    }

    /// When SLURM took each job, by name (the earliest of a name; UTC,
    /// `YYYY-MM-DDTHH:MM:SS`), from sacct and squeue.
    fn submit_times(&self) -> BTreeMap<String, String> {
        let sacct = self.slurm_in_utc(&[
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            "--starttime=now-1days",
            "--format=JobName,Submit",
        ]);
        let squeue = self.slurm_in_utc(&["squeue", "--noheader", "--states=all", "--format=%j|%V"]);
        let mut out: BTreeMap<String, String> = BTreeMap::new();
        for line in sacct.lines().chain(squeue.lines()) {
            if let Some((name, at)) = line.trim().split_once('|') {
                let e = out.entry(name.to_string()).or_insert_with(|| at.to_string());
                if at < e.as_str() {
                    *e = at.to_string();
                }
            }
        }
        out
    }

    /// A SLURM command on the cluster machine: the test's own view, not the orchestrator's.
    pub fn slurm(&self, argv: &[&str]) -> String {
        self.slurm_with(argv, &[])
    }

    /// [`Env::slurm`] printing times in UTC.
    fn slurm_in_utc(&self, argv: &[&str]) -> String {
        self.slurm_with(argv, &[("TZ", "UTC")])
    }

    fn slurm_with(&self, argv: &[&str], env: &[(&str, &str)]) -> String {
        let out = Command::new(argv[0])
            .args(&argv[1..])
            .env("SLURM_CONF", self.get("SLURM_CONF"))
            .envs(env.iter().copied())
            .output()
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        assert!(out.status.success(), "{argv:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// Every config record of experiment `exp` in the state dir `state_root`, by name.
pub fn records(state_root: &Path, exp: &str) -> BTreeMap<String, orchestrator::state::ConfigRecord> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(state_root.join(exp).join("configs")).expect("configs dir") {
        let p = e.expect("entry").path();
        let r: orchestrator::state::ConfigRecord =
            serde_json::from_slice(&std::fs::read(&p).expect("read")).expect("record json");
        out.insert(r.name().to_string(), r);
    }
    out
}

/// Every submission of experiment `exp` in the state dir `state_root`, as
/// the store reads them (a folder a crash left before its intent is none).
pub fn submissions(state_root: &Path, exp: &str) -> Vec<orchestrator::state::Submission> {
    let view = orchestrator::state::View::new(state_root, exp).expect("state view");
    view.submissions().expect("submissions")
}

/// An experiment of `n` small UNet configs differing in batch size (each its
/// own hash), on `cluster` with `template`, `parallel` tasks at a time.
pub fn batch_grid_experiment(
    name: &str,
    description: &str,
    cluster: &str,
    template: &Path,
    n: usize,
    parallel: u32,
) -> String {
    let batches: Vec<String> = (1..=n).map(|b| b.to_string()).collect();
    format!(
        "name: {name}\ndescription: {description}\ncluster: {cluster}\ngpu: A100-SXM4-80GB\nprecision: fp32\n\
         input: {{channels: 1, spatial: [16, 16, 16]}}\noutput_channels: 1\n\
         model: {{family: unet, channels: [32, 64], attention_levels: [false, false], num_res_blocks: 1, num_head_channels: 32}}\n\
         template: {}\narray_parallelism: {parallel}\nsweep:\n  name: \"b{{batch}}\"\n  grid:\n    batch: [{}]\n",
        template.display(),
        batches.join(", ")
    )
}

/// The running test cluster, held for the calling test until the returned
/// `Env` is dropped, or `None` when skipping was asked for. Held: the tests
/// of one binary one at a time; across binaries an advisory lock on the
/// cluster directory's `tests.lock`, shared for [`Use::Shared`], exclusive
/// for [`Use::Alone`].
pub fn cluster(how: Use) -> Option<Env> {
    let one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let vars = cluster_env()?;
    let path = Path::new(&vars["SWEEP_TEST_CLUSTER_DIR"]).join("tests.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match how {
        Use::Shared => file.lock_shared(),
        Use::Alone => file.lock(),
    }
    .unwrap_or_else(|e| panic!("locking {}: {e}", path.display()));
    Some(Env { vars, _held: (one, file) })
}

/// The runtime the async commands run on.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// `orchestrator ARGS --state-dir STATE` run from the repository root (its
/// `experiments/`, `data/`): stdout and stderr together; it must succeed.
pub fn orchestrator(state: &Path, args: &[&str]) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .current_dir(root)
        .args(args)
        .arg("--state-dir")
        .arg(state)
        .output()
        .expect("orchestrator runs");
    let text = text(&out);
    assert!(out.status.success(), "{args:?}: {text}");
    text
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

/// The state directory of experiment `exp` is what its journal replays to:
/// every submission and every config record, field for field.
pub fn assert_journal_replays(state_root: &Path, exp: &str) {
    let view = orchestrator::state::View::new(state_root, exp).expect("a state directory");
    let lines = view.journal().expect("journal");
    assert!(!lines.is_empty(), "{exp}: a journal");
    let replayed = orchestrator::state::journal::replay(&lines);
    let on_disk: BTreeMap<String, orchestrator::state::Submission> =
        view.submissions().expect("submissions").into_iter().map(|s| (s.id.clone(), s)).collect();
    assert_eq!(replayed.submissions, on_disk, "{exp}: the journal's submissions");
    let records = view.records().expect("records");
    for (hash, r) in &records {
        assert_eq!(replayed.records.get(hash), Some(r), "{exp}: config {} as the journal replays it", r.name());
    }
    assert_eq!(replayed.records.len(), records.len(), "{exp}: no config only in the journal");
}

/// `experiments/exp*.yaml` as a shell expands it in the repository `root`.
pub fn group_experiment_files(root: &Path) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(root.join("experiments"))
        .expect("experiments/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("exp") && n.ends_with(".yaml"))
        .map(|n| format!("experiments/{n}"))
        .collect();
    files.sort();
    files
}

/// What the page `page` (a path from the repository `root`, e.g.
/// `docs/active.md`) shows between `<!-- NAME:begin -->` and
/// `<!-- NAME:end -->`, and the whole page.
pub fn doc_block(root: &Path, page: &str, name: &str) -> (String, String) {
    let text = std::fs::read_to_string(root.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
    let begin = format!("<!-- {name}:begin -->\n");
    let (_, rest) = text.split_once(&begin).unwrap_or_else(|| panic!("{page} has no {begin}"));
    let (shown, _) = rest.split_once(&format!("<!-- {name}:end -->")).expect("its end marker");
    (shown.to_string(), text.clone())
}
