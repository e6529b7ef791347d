//! What the tool tells a user about a sweep on the built-in `local` cluster is
//! true (issue 19), through the real `orchestrator` and `worker` binaries:
//! runs stay with the config that made them, and a job that cannot start says
//! why.

mod common;

use std::path::Path;
use std::process::{Command, Output};

const EXPERIMENT: &str = "\
name: truths
description: two tiny configs for the local cluster
gpu: A100-40GB
precision: fp32
runtime: burn-flex
batch: 1
input: {channels: 1, spatial: [16, 16, 16]}
output_channels: 1
worker: {backend: flex}
model: {family: unet, channels: [32, 64], attention_levels: [false, true], num_res_blocks: 1, num_head_channels: 32}
sweep:
  configs:
    - {name: unet_2L, model: {family: unet, channels: [32, 64], attention_levels: [false, true], num_res_blocks: 1, num_head_channels: 32}}
    - {name: dit_p4, model: {family: dit, hidden: 64, heads: 4, depth: 2, patch: 4}}
";

fn orchestrator(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .args(args)
        .args(["--state-dir", "state"])
        .current_dir(dir)
        .output()
        .expect("orchestrator runs")
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let out = orchestrator(dir, args);
    assert!(out.status.success(), "orchestrator {args:?} failed:\n{}", common::text(&out));
    common::text(&out)
}

/// Submits `file` and waits until every config has ended.
fn run(dir: &Path, file: &str) {
    ok(dir, &["submit", file]);
    let watched = ok(dir, &["status", "truths", "--watch", "--interval", "0.2", "--max-interval", "1"]);
    // Piped, the table comes at the start and at the end, the changes between.
    assert!(watched.matches("config   ").count() <= 2, "the table once per poll:\n{watched}");
}

fn report_rows(dir: &Path) -> Vec<serde_json::Value> {
    let json: serde_json::Value = serde_json::from_str(
        &String::from_utf8(orchestrator(dir, &["report", "truths", "--json"]).stdout).expect("utf-8"),
    )
    .expect("report --json is JSON");
    json["rows"].as_array().expect("rows").clone()
}

#[test]
fn an_edited_config_gets_its_own_run_and_the_old_one_keeps_its_measurement() {
    common::worker_binary();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    std::fs::write(dir.join("truths.yaml"), EXPERIMENT).expect("experiment");
    run(dir, "truths.yaml");
    // What the sweep wrote is in its state directory: nothing beside it in
    // the directory the orchestrator ran from (no kernel `cache/`).
    let mut here: Vec<String> =
        std::fs::read_dir(dir).expect("dir").map(|e| e.expect("entry").file_name().to_string_lossy().into()).collect();
    here.sort();
    assert_eq!(here, ["state", "truths.yaml"], "files left in the working directory");
    // Every config measured: `render` sends nothing, and says why.
    let out = orchestrator(dir, &["render", "truths.yaml"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && !stdout.contains("#SBATCH"), "{stdout}{stderr}");
    assert!(stderr.contains("nothing to render") && stderr.contains("\n  unet_2L: "), "{stderr}");
    let before = report_rows(dir);
    let old = before.iter().find(|r| r["name"] == "unet_2L").expect("unet_2L row").clone();
    assert_eq!(old["status"], "ok", "{old}");

    // The same name, another computation.
    let edited = EXPERIMENT.replacen(
        "{name: unet_2L, model: {family: unet, channels: [32, 64]",
        "{name: unet_2L, model: {family: unet, channels: [32, 128]",
        1,
    );
    std::fs::write(dir.join("truths.yaml"), edited).expect("edited experiment");
    run(dir, "truths.yaml");
    let after = report_rows(dir);

    // `status` tells the two versions apart as the report does.
    let status = ok(dir, &["status", "truths"]);
    let names: Vec<&str> = status.lines().filter(|l| l.starts_with("unet_2L")).collect();
    assert_eq!(names.len(), 2, "{status}");
    assert!(names[0].starts_with("unet_2L ") && names[1].starts_with("unet_2L (earlier version) "), "{status}");
    let new = after.iter().find(|r| r["name"] == "unet_2L").expect("the edited unet_2L");
    let earlier =
        after.iter().find(|r| r["name"] == "unet_2L (earlier version)").expect("the earlier unet_2L, named so");
    assert_ne!(new["id"], earlier["id"]);
    assert_eq!(earlier["id"], old["id"]);
    // The earlier version keeps what it measured; the new one has its own figures.
    for key in ["params", "peak_gib", "wall_s", "predicted_gib"] {
        assert_eq!(earlier[key], old[key], "{key} of the earlier version changed: {earlier}");
    }
    // A measured run keeps the prediction made before it ran (a refit on
    // the runs themselves must not make the report look in-sample).
    let dit = |rows: &[serde_json::Value]| rows.iter().find(|r| r["name"] == "dit_p4").expect("dit_p4").clone();
    assert_eq!(dit(&after)["predicted_gib"], dit(&before)["predicted_gib"]);
    let md = std::fs::read_to_string(dir.join("state/truths/report/report.md")).expect("report.md");
    assert!(md.contains("| Prediction | precheck at submission, before each run: `shipped burn-flex/fp32` |"), "{md}");
    assert!(new["params"].as_u64() > old["params"].as_u64(), "wider channels, more parameters: {new}");
    assert_ne!(new["peak_gib"], old["peak_gib"]);
    // Each run in its own directory, by what ran.
    for row in [new, earlier] {
        let id = row["id"].as_str().expect("hash");
        assert!(dir.join(format!("state/truths/runs/{id}/events.jsonl")).is_file(), "runs/{id}");
    }
}

/// A `local` cluster named `laptop` whose worker is `worker` (a path).
fn laptop(dir: &Path, worker: &Path) {
    let clusters = format!("clusters:\n  laptop:\n    transport: local\n    worker: {}\n", worker.display());
    std::fs::write(dir.join("clusters.yaml"), clusters).expect("clusters file");
    std::fs::write(dir.join("truths.yaml"), format!("cluster: laptop\n{EXPERIMENT}")).expect("experiment");
}

/// [`laptop`] with a worker script that answers `--version` (as the login
/// node's check asks) and runs `job` as the job.
fn laptop_with_fake_worker(dir: &Path, job: &str) {
    use std::os::unix::fs::PermissionsExt;
    let fake = dir.join("worker.sh");
    // Answers `--version` and `backends` (what `submit` asks first), then does `job`.
    let script = format!(
        "#!/bin/sh\n[ \"$1\" = --version ] && {{ echo 'worker 0.1.0'; exit 0; }}\n\
         [ \"$1\" = backends ] && {{ echo flex; exit 0; }}\n{job}\n"
    );
    std::fs::write(&fake, script).expect("fake worker");
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    laptop(dir, &fake);
}

#[test]
fn a_worker_that_cannot_run_is_refused_before_anything_is_submitted() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    laptop(dir, &dir.join("bin/worker"));
    let out = orchestrator(dir, &["submit", "truths.yaml", "--clusters", "clusters.yaml"]);
    let text = common::text(&out);
    assert!(!out.status.success(), "submitted with no worker:\n{text}");
    assert!(text.contains("does not run on cluster `laptop`"), "{text}");
    assert!(text.contains("nothing was submitted"), "{text}");
    assert!(text.contains(&format!("no such file: {}", dir.join("bin/worker").display())), "{text}");
    assert!(
        !dir.join("state/truths/submissions").exists()
            || std::fs::read_dir(dir.join("state/truths/submissions")).expect("dir").next().is_none()
    );
}

#[test]
fn a_job_that_fails_before_the_worker_says_why_and_is_retried_at_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    // Starts for `--version` (as on a login node), but not on the "compute
    // node": the dynamic loader's message and exit status when a library is missing.
    laptop_with_fake_worker(
        dir,
        "echo 'worker: error while loading shared libraries: libvulkan.so.1: cannot open shared object file' >&2\nexit 127",
    );
    ok(dir, &["submit", "truths.yaml", "--clusters", "clusters.yaml"]);
    ok(
        dir,
        &["status", "truths", "--clusters", "clusters.yaml", "--watch", "--interval", "0.2", "--max-interval", "1"],
    );

    let status = ok(dir, &["status", "truths", "--clusters", "clusters.yaml"]);
    let why = "why 2 configs failed (unet_2L, dit_p4), as unet_2L did:\n  worker: error while loading shared \
               libraries: libvulkan.so.1: cannot open shared object file (exit code 127:0, no result from the \
               worker)\n  log: submissions/";
    assert!(status.contains(why), "{status}");
    let json = ok(dir, &["status", "truths", "--clusters", "clusters.yaml", "--json"]);
    let first: serde_json::Value = serde_json::from_str(json.lines().next().expect("a row")).expect("status --json");
    let cause = first["cause"].as_str().expect("a cause in --json");
    assert!(cause.contains("libvulkan.so.1"), "{cause}");
    let report = report_rows(dir);
    let detail = report[0]["detail"].as_str().expect("a detail in the report");
    assert!(detail.contains("libvulkan.so.1"), "{detail}");

    // The worker never ran: no result can arrive late, so no lag grace (a
    // local disk has none anyway) and no refusal.
    let retried = ok(dir, &["resume", "truths", "--clusters", "clusters.yaml", "--retry-failed"]);
    assert!(!retried.contains("shared filesystem lag"), "{retried}");
    assert!(retried.contains("submitted 2 configs"), "{retried}");
}

#[test]
fn an_experiment_for_a_gpu_does_not_run_on_this_cpu_unless_asked() {
    common::worker_binary();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let exp9 = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments/exp9.yaml");
    let exp9 = exp9.to_str().expect("utf-8 path");
    let plan = ok(dir, &["plan", exp9]);
    assert!(plan.contains("cluster: local (none named: the built-in cluster, this machine's CPU)"), "{plan}");
    assert!(plan.contains("note: planned for A100-SXM4-80GB, so `submit` will not run it on this CPU"), "{plan}");
    let out = orchestrator(dir, &["submit", exp9]);
    let text = common::text(&out);
    assert!(!out.status.success(), "exp9 (an A100 experiment) was submitted to this CPU:\n{text}");
    assert!(text.contains("names no cluster and is planned for A100-SXM4-80GB"), "{text}");
    assert!(text.contains("--cluster local to run it here anyway"), "{text}");
    assert!(!dir.join("state/exp9").exists(), "a refused submit leaves no state");
    // An experiment for the CPU runtime runs where it is, and says where.
    std::fs::write(dir.join("truths.yaml"), EXPERIMENT).expect("experiment");
    let submitted = ok(dir, &["submit", "truths.yaml"]);
    assert!(submitted.contains("cluster: local (none named: the built-in cluster, this machine's CPU)"), "{submitted}");
}

#[test]
fn a_backend_the_worker_was_built_without_is_named_with_how_to_build_it() {
    common::worker_binary();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    std::fs::write(dir.join("truths.yaml"), EXPERIMENT.replace("worker: {backend: flex}", "worker: {backend: cuda}"))
        .expect("experiment");
    let out = orchestrator(dir, &["submit", "truths.yaml"]);
    let text = common::text(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("was built without the `cuda` backend the experiment asks for (it has: flex"), "{text}");
    assert!(text.contains("cargo build --release -p worker --features cuda"), "{text}");
    assert!(text.contains("nothing was submitted"), "{text}");
}

/// The group's experiments name no backend (their runtime is PyTorch's): on
/// a cluster whose jobs ask SLURM for a GPU, a worker built without a GPU
/// backend (README's first build: `flex` alone, as the fake worker answers)
/// would pick `flex` and measure every config on the node's CPU.
#[test]
fn a_cpu_only_worker_is_refused_where_the_jobs_ask_for_a_gpu() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    laptop_with_fake_worker(dir, "exit 0");
    let clusters = format!(
        "clusters:\n  laptop:\n    transport: local\n    worker: {}\n    defaults: {{gres: \"gpu:1\"}}\n",
        dir.join("worker.sh").display()
    );
    std::fs::write(dir.join("clusters.yaml"), clusters).expect("clusters file");
    let pytorch = EXPERIMENT.replace("runtime: burn-flex\n", "").replace("worker: {backend: flex}\n", "");
    std::fs::write(dir.join("truths.yaml"), format!("cluster: laptop\n{pytorch}")).expect("experiment");
    let out = orchestrator(dir, &["submit", "truths.yaml", "--clusters", "clusters.yaml"]);
    let text = common::text(&out);
    assert!(!out.status.success(), "a CPU-only worker was sent GPU jobs:\n{text}");
    assert!(
        text.contains("has no GPU backend (it has: flex) and the jobs ask SLURM for a GPU (`--gres=gpu:1`)"),
        "{text}"
    );
    assert!(text.contains("nothing was submitted"), "{text}");
    assert!(text.contains("cargo build --release -p worker --features vulkan"), "{text}");
    assert!(text.contains("`worker: {backend: flex}` in the experiment"), "{text}");
    // Told to run on the CPU, it does.
    std::fs::write(dir.join("truths.yaml"), format!("cluster: laptop\n{EXPERIMENT}")).expect("experiment");
    let submitted = ok(dir, &["submit", "truths.yaml", "--clusters", "clusters.yaml"]);
    assert!(submitted.contains("submitted 2 configs"), "{submitted}");
}

#[test]
fn ctrl_c_stops_watching_and_says_the_sweep_goes_on() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    laptop_with_fake_worker(dir, "exec sleep 60");
    ok(dir, &["submit", "truths.yaml"]);
    let child = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .args(["status", "truths", "--watch", "--interval", "0.2", "--state-dir", "state"])
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("status --watch");
    std::thread::sleep(std::time::Duration::from_secs(2));
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = child.wait_with_output().expect("status --watch ends");
    let text = common::text(&out);
    assert_eq!(out.status.code(), Some(130), "{text}");
    assert!(text.contains("stopped watching; the sweep goes on (`orchestrator status truths --watch`"), "{text}");
    assert!(ok(dir, &["status", "truths"]).contains("RUNNING"), "the jobs still run");
    let first = ok(dir, &["cancel", "truths"]);
    assert!(first.starts_with("cancelled 1 job array(s): "), "{first}");
    // At once again, before any poll saw the jobs end: nothing new is cancelled.
    let again = ok(dir, &["cancel", "truths"]);
    assert!(!again.contains("cancelled 1 job array"), "the second cancel cancelled nothing new:\n{again}");
    assert!(
        again.starts_with("nothing new to cancel: already cancelled") || again.starts_with("nothing to cancel"),
        "{again}"
    );
}

/// `cancel` stops a sweep; `resume` does not quietly undo it: it says how
/// many configs `cancel` stopped and runs them again only when asked.
#[test]
fn resume_after_cancel_runs_nothing_cancelled_unless_asked() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    laptop_with_fake_worker(dir, "exec sleep 60");
    ok(dir, &["submit", "truths.yaml"]);
    assert!(ok(dir, &["cancel", "truths"]).starts_with("cancelled 1 job array(s): "));
    let watched = ok(dir, &["status", "truths", "--watch", "--interval", "0.2", "--max-interval", "1"]);
    assert!(watched.contains("2 configs: 2 CANCELLED"), "{watched}");
    let resumed = ok(dir, &["resume", "truths"]);
    assert!(resumed.contains("skip   unet_2L: cancelled by `cancel` (--retry-cancelled runs it)\n"), "{resumed}");
    assert!(
        resumed.contains(
            "\n2 configs were cancelled by `cancel`; `orchestrator resume truths --retry-cancelled` runs them again\n"
        ),
        "{resumed}"
    );
    assert!(resumed.contains("submitted 0 configs: nothing left to send (2 skipped)"), "{resumed}");
    let retried = ok(dir, &["resume", "truths", "--retry-cancelled"]);
    assert!(retried.contains("submitted 2 configs"), "{retried}");
    ok(dir, &["cancel", "truths"]);
}
