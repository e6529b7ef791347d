//! The Burn worker end to end through the real SLURM test cluster over SSH
//! (`scripts/test-cluster.sh up`; connection details in
//! `$SWEEP_TEST_CLUSTER_DIR/env`, default /tmp/sweep-test-cluster/env). Fails
//! when the cluster is absent unless `SWEEP_SKIP_CLUSTER_TESTS=1`.
//!
//! `orchestrator install` uploads the worker built in this test's own target
//! directory (`cargo build -p worker`; scripts/test.sh builds the workspace
//! first) into the remote work dir, then real sweeps run it as SLURM jobs:
//! measured results land in the local state directory, a memory-limited run
//! is recorded `oom` and never resubmitted, a SIGKILLed worker is recorded
//! without a result and resubmitted.
//!
//! Tests share the cluster and one remote work dir, so they run one at a time.

mod common;

use orchestrator::submit::{self, Options, StatusReport, Watch};
use orchestrator::sweep::{self, Sweep};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{cluster, rt, worker_binary, Env, Use};

/// The connection and the remote work dir every test of this file shares
/// (one install per test run).
struct Shared {
    dir: PathBuf,
    clusters: PathBuf,
    remote_work: String,
    /// The first install's report (uploaded) and the second's (skipped).
    installs: (String, String),
    install_s: f64,
}

fn shared(env: &Env) -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("sweep-cluster-worker-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("test dir");
        let remote_work = env.remote_work("cw");
        let clusters = env.ssh_clusters_file(&dir, &remote_work, common::JOB_DEFAULTS);
        let worker = worker_binary();
        let install = || {
            let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
                .args(["install", "--cluster", "test", "--clusters"])
                .arg(&clusters)
                .arg("--worker")
                .arg(&worker)
                .output()
                .expect("orchestrator runs");
            assert!(out.status.success(), "install: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let t0 = Instant::now();
        let first = install();
        let install_s = t0.elapsed().as_secs_f64();
        let second = install();
        Shared { dir, clusters, remote_work, installs: (first, second), install_s }
    })
}

/// One experiment of a test: its file and a local state dir of its own.
struct Exp {
    name: String,
    file: PathBuf,
    opts: Options,
}

fn experiment(sh: &Shared, name: &str, body: &str) -> Exp {
    let file = sh.dir.join(format!("{name}.yaml"));
    let text = format!(
        "name: {name}\ndescription: worker end to end\ncluster: test\ngpu: A100-SXM4-80GB\nprecision: fp32\nbatch: 1\n\
         input: {{channels: 1, spatial: [8, 8, 8]}}\noutput_channels: 1\narray_parallelism: 2\n{body}"
    );
    std::fs::write(&file, text).expect("experiment file");
    let opts = Options {
        state_root: sh.dir.join(format!("state-{name}")),
        clusters_file: Some(sh.clusters.clone()),
        template_dirs: vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../templates")],
        // No lag here (the lag test sets its own): a killed worker's missing result is final at once.
        result_grace: Duration::from_secs(3),
        ..Options::default()
    };
    Exp { name: name.into(), file, opts }
}

impl Exp {
    fn sweep(&self) -> Sweep {
        sweep::load(&self.file, &[]).expect("experiment loads")
    }

    fn records(&self) -> BTreeMap<String, orchestrator::state::ConfigRecord> {
        common::records(&self.opts.state_root, &self.name)
    }

    /// `status --watch` until every config settled (or `limit`).
    fn watch(&self, limit: Duration) -> StatusReport {
        let watch = Watch {
            min: Duration::from_millis(700),
            max: Duration::from_secs(2),
            max_polls: Some((limit.as_secs_f64() / 0.7) as u32 + 1),
        };
        let r =
            rt().block_on(submit::status(&self.name, &self.opts, Some(watch), &mut |_| {})).expect("status --watch");
        assert!(r.settled, "not settled within {limit:?}:\n{}", r.table());
        r
    }

    fn status(&self) -> StatusReport {
        rt().block_on(submit::status(&self.name, &self.opts, None, &mut |_| {})).expect("status")
    }

    /// `orchestrator <sub> <experiment>` on this experiment's state.
    fn cli(&self, sub: &str) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
            .arg(sub)
            .arg(&self.name)
            .arg("--state-dir")
            .arg(&self.opts.state_root)
            .arg("--clusters")
            .arg(self.opts.clusters_file.as_ref().expect("clusters file"))
            .output()
            .expect("orchestrator runs");
        assert!(out.status.success(), "{sub}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn status_of(r: &orchestrator::state::ConfigRecord) -> Option<&str> {
    r.result().map(|res| res.status.name())
}

/// A stored result as the JSON of its `result` line.
fn json(r: &facts::event::RunResult) -> serde_json::Value {
    serde_json::to_value(r).expect("a result serialises")
}

fn num(v: &serde_json::Value, k: &str) -> u64 {
    v.get(k).and_then(|x| x.as_u64()).unwrap_or_else(|| panic!("result without `{k}`: {v}"))
}

#[test]
fn cluster_worker_install_uploads_once_then_skips() {
    let Some(env) = cluster(Use::Shared) else { return };
    let sh = shared(&env);
    eprintln!(
        "install: {} (first install {:.1} s); again: {}",
        sh.installs.0.trim(),
        sh.install_s,
        sh.installs.1.trim()
    );
    assert!(sh.installs.0.starts_with("installed "), "{}", sh.installs.0);
    assert!(sh.installs.1.starts_with("up to date:"), "same size and sha256: no upload: {}", sh.installs.1);
    let remote = PathBuf::from(format!("{}/bin/worker", sh.remote_work));
    let local = std::fs::read(worker_binary()).expect("worker");
    assert_eq!(std::fs::read(&remote).expect("installed worker (the cluster is this machine)"), local);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&remote).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o755, "executable");
    let leftovers: Vec<_> = std::fs::read_dir(remote.parent().expect("bin"))
        .expect("bin dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name() != "worker")
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
}

/// Tiny configs of all four families as one array, followed to completion:
/// the measured peaks land in the local state (events pulled over SFTP) and
/// in `measurements.jsonl`, which `orchestrator calibrate` reads.
#[test]
fn cluster_worker_sweep_of_four_families_lands_measurements_locally() {
    let Some(env) = cluster(Use::Shared) else { return };
    let sh = shared(&env);
    let exp = experiment(
        sh,
        "cw-sweep",
        "worker: {backend: flex}\n\
         model: {family: unet, channels: [32, 64], attention_levels: [false, true], num_res_blocks: 1, num_head_channels: 32}\n\
         sweep:\n  configs:\n\
         \x20   - {name: unet_2L_16, input.spatial: [16, 16, 16]}\n\
         \x20   - {name: unet_3L_8, model: {family: unet, channels: [32, 32, 64], attention_levels: [false, false, true], num_res_blocks: [1, 1, 2], num_head_channels: 16}}\n\
         \x20   - {name: dit_p2_8, model: {family: dit, hidden: 64, heads: 4, depth: 2, patch: 2}}\n\
         \x20   - {name: dit_p4_16, input.spatial: [16, 16, 16], model: {family: dit, hidden: 64, heads: 4, depth: 2, patch: 4}}\n\
         \x20   - {name: hdit_p2_16, input.spatial: [16, 16, 16], model: {family: hdit, hidden: 64, heads: 4, patch: 2, level_depths: [1, 2, 1]}}\n\
         \x20   - {name: uvit_p4_16, input.spatial: [16, 16, 16], model: {family: uvit, hidden: 64, heads: 4, depth: 3, patch: 4}}\n",
    );
    let sweep = exp.sweep();
    let t0 = Instant::now();
    let rep = rt().block_on(submit::submit(&sweep, &exp.opts, false)).expect("submit");
    assert_eq!(rep.submitted.len(), 6, "{rep:?}");
    assert_eq!(rep.arrays.len(), 1, "one array");
    let r = exp.watch(Duration::from_secs(300));
    let wall = t0.elapsed().as_secs_f64();
    assert_eq!(r.count("COMPLETED"), 6, "{}", r.table());
    eprintln!("{}", r.table());
    eprintln!("e2e sweep: {} configs, {wall:.1} s from submit to the last result", sweep.configs.len());
    every_config_measured(&exp, &sweep, &r);
    measurements_calibrate_the_workers_runtime(&exp);
    the_report_has_an_ok_row_per_config(&exp, &sweep);
}

/// Each config's result is `ok` with the spec's parameter count and a peak
/// above its weights, and its event stream is in the local state.
fn every_config_measured(exp: &Exp, sweep: &Sweep, r: &StatusReport) {
    let recs = exp.records();
    for c in &sweep.configs {
        let rec = &recs[&c.name];
        assert_eq!(status_of(rec), Some("ok"), "{}: {:?}", c.name, rec.result());
        assert_eq!(rec.attempts().last().and_then(|a| a.worker().word()), Some("ok"));
        let res = &json(rec.result().expect("result"));
        let (params, peak) = (num(res, "params"), num(res, "peak_bytes"));
        assert_eq!(
            params,
            facts::params::count(&c.config.model, &c.config.input, c.config.out_channels).expect("params")
        );
        assert!(peak > params * 4, "{}: peak {peak} B must exceed the fp32 weights {} B", c.name, params * 4);
        // The event stream itself is in the local state.
        let events = exp.opts.state_root.join(&exp.name).join(c.config.events_rel());
        let text = std::fs::read_to_string(&events).unwrap_or_else(|e| panic!("{}: {e}", events.display()));
        assert!(text.lines().any(|l| l.contains("\"event\":\"start\"") && l.contains("\"backend\":\"flex\"")));
        let row = r.rows.iter().find(|x| x.name == c.name).expect("row");
        eprintln!(
            "MEASURED {:<12} params {:>8}  measured peak {:>8.1} MiB (CPU, flex, fp32)  predicted {:>6.3} GiB (PyTorch-calibrated precheck, {})",
            c.name,
            params,
            peak as f64 / (1u64 << 20) as f64,
            row.predicted_gib.unwrap_or(f64::NAN),
            c.config.gpu
        );
    }
}

/// The measurement records, in the shared format, teach `calibrate` the
/// worker's runtime.
fn measurements_calibrate_the_workers_runtime(exp: &Exp) {
    // Measurement records, in the shared format, for calibration.
    let mpath = exp.opts.state_root.join(&exp.name).join("measurements.jsonl");
    let text = std::fs::read_to_string(&mpath).expect("measurements.jsonl written");
    let ms = facts::record::read_jsonl(&text).expect("records parse");
    assert_eq!(ms.len(), 6);
    assert!(ms.iter().all(|m| m.framework == "burn-flex" && m.gpu == "cpu" && m.peak_gb.is_some_and(|g| g > 0.0)));
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .args(["calibrate", "--no-loto", "--records"])
        .arg(&mpath)
        .output()
        .expect("calibrate runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "calibrate: {err}");
    assert!(err.contains("runtime burn-flex/fp32"), "calibrate learnt the worker's runtime: {err}");
    let cal: serde_json::Value = serde_json::from_slice(&out.stdout).expect("calibration json");
    assert!(cal.pointer("/runtimes/burn-flex~1fp32").is_some(), "{cal}");
}

/// The report of what the cluster measured: one OK row per config, plots beside it.
fn the_report_has_an_ok_row_per_config(exp: &Exp, sweep: &Sweep) {
    let out_dir = exp.opts.state_root.join(&exp.name).join("report");
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .args(["report", &exp.name, "--state-dir"])
        .arg(&exp.opts.state_root)
        .output()
        .expect("report runs");
    assert!(out.status.success(), "report: {}", String::from_utf8_lossy(&out.stderr));
    let md = std::fs::read_to_string(out_dir.join("report.md")).expect("report.md written");
    for c in &sweep.configs {
        let row = md
            .lines()
            .find(|l| l.starts_with(&format!("| {} |", c.name)))
            .unwrap_or_else(|| panic!("{} has no row:\n{md}", c.name));
        assert!(row.contains("| OK"), "{row}");
    }
    assert!(md.contains("| Backend | flex |"), "hardware header from the workers' events:\n{md}");
    for plot in ["predicted_vs_measured.png", "predicted_vs_measured.svg"] {
        assert!(out_dir.join(plot).is_file(), "{plot} missing");
    }
}

/// A memory limit makes one config run out of memory and the other fit: the
/// first is recorded `oom` (status shows it) and `resume` leaves it alone.
#[test]
fn cluster_worker_memory_limit_oom_is_recorded_and_not_resubmitted() {
    let Some(env) = cluster(Use::Shared) else { return };
    let sh = shared(&env);
    let exp = experiment(
        sh,
        "cw-oom",
        // Measured on flex: the small DiT peaks near 5 MiB, the UNet at 16^3 near 85 MiB.
        "worker: {backend: flex, memory_limit: 32MiB}\n\
         model: {family: dit, hidden: 64, heads: 4, depth: 2, patch: 4}\n\
         sweep:\n  configs:\n\
         \x20   - {name: small}\n\
         \x20   - {name: big, input.spatial: [16, 16, 16], model: {family: unet, channels: [32, 64], attention_levels: [false, true], num_res_blocks: 1, num_head_channels: 32}}\n",
    );
    let sweep = exp.sweep();
    assert_eq!(sweep.experiment.worker.memory_limit, Some(32 << 20));
    // The precheck judges `big` against the 32 MiB limit and predicts the OOM;
    // --force runs it anyway, to measure one.
    let mut exp = exp;
    exp.opts.force = true;
    rt().block_on(submit::submit(&sweep, &exp.opts, false)).expect("submit");
    let r = exp.watch(Duration::from_secs(240));
    eprintln!("{}", r.table());
    let recs = exp.records();
    assert_eq!(status_of(&recs["small"]), Some("ok"), "{:?}", recs["small"].result());
    let big = &recs["big"];
    assert_eq!(status_of(big), Some("oom"), "{:?}", big.result());
    let row = r.rows.iter().find(|x| x.name == "big").expect("row");
    assert_eq!(row.result.as_deref(), Some("oom"), "status shows the oom");
    assert_eq!(row.state, "FAILED", "the worker exits 3 on oom, which SLURM calls FAILED");
    let msg = big.result().and_then(|v| v.message.as_deref()).unwrap_or_default();
    eprintln!("oom result: {msg}");
    // resume: nothing to do, and the oom config is skipped as measured.
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .args(["resume", &exp.name, "--state-dir"])
        .arg(&exp.opts.state_root)
        .arg("--clusters")
        .arg(&sh.clusters)
        .output()
        .expect("resume runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "resume: {}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("skip   big: measured oom"), "{text}");
    assert!(text.contains("submitted 0 configs"), "{text}");
    assert_eq!(exp.records()["big"].attempts().len(), 1, "never resubmitted");
    // The oom is a measurement too.
    let ms =
        std::fs::read_to_string(exp.opts.state_root.join(&exp.name).join("measurements.jsonl")).expect("measurements");
    let ms = facts::record::read_jsonl(&ms).expect("parse");
    assert!(ms
        .iter()
        .any(|m| m.config_name.as_deref() == Some("big") && m.status == facts::record::MeasuredStatus::Oom));
    common::assert_journal_replays(&exp.opts.state_root, &exp.name);
}

/// A worker killed with SIGKILL writes no result: recorded as such, and
/// `resume` runs it again as a new job; `cancel` cleans up.
#[test]
fn cluster_worker_killed_is_recorded_and_resubmitted() {
    let Some(env) = cluster(Use::Shared) else { return };
    let sh = shared(&env);
    let exp = experiment(
        sh,
        "cw-kill",
        "mode: train\nsteps: 1000000\nworker: {backend: flex}\nmodel: {family: dit, hidden: 32, heads: 2, depth: 1, patch: 4}\n",
    );
    let sweep = exp.sweep();
    let rep = rt().block_on(submit::submit(&sweep, &exp.opts, false)).expect("submit");
    let first_array = rep.arrays[0].clone();
    // Wait for the worker to run (its start line pulled), then kill it from outside.
    let name = &sweep.configs[0].name;
    let manifest_dir = format!("{}/state/{}/submissions/", sh.remote_work, exp.name);
    let start = Instant::now();
    let pid = loop {
        assert!(start.elapsed() < Duration::from_secs(120), "the worker never started:\n{}", exp.status().table());
        let _ = exp.status();
        let started = exp.records()[name].attempts().last().and_then(|a| a.worker().word()) == Some("started");
        let out = Command::new("pgrep")
            .args(["-f", &format!("worker run --manifest {manifest_dir}")])
            .output()
            .expect("pgrep");
        let pids: Vec<i32> =
            String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect();
        if started && pids.len() == 1 {
            break pids[0];
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    // SAFETY: signalling the worker process this test's job started (found by its unique manifest path).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill {pid}");
    let r = exp.watch(Duration::from_secs(120));
    eprintln!("{}", r.table());
    let rec = &exp.records()[name];
    let a = rec.attempts().last().expect("attempt");
    assert_eq!(a.worker().word(), Some("started"), "started, no result");
    assert!(rec.result().is_none(), "no result line: {:?}", rec.result());
    let state = a.state().cloned().expect("ended");
    eprintln!("killed worker: SLURM state {state}, history {:?}", a.history());
    assert_eq!(state, orchestrator::slurm::SlurmState::Failed, "SIGKILL: FAILED, exit 0:9");
    let rep = rt().block_on(submit::submit(&sweep, &exp.opts, true)).expect("resume");
    assert_eq!(rep.submitted, vec![name.clone()], "the killed config runs again: {rep:?}");
    assert_ne!(rep.arrays[0], first_array, "as a new job");
    // Clean up: the retry runs a million steps.
    let start = Instant::now();
    while exp.status().rows[0].state != "RUNNING" && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = exp.cli("cancel");
    assert!(out.contains(rep.arrays[0].as_str()), "{out}");
    let r = exp.watch(Duration::from_secs(120));
    assert_eq!(r.rows[0].state, "CANCELLED", "{}", r.table());
    assert_eq!(exp.records()[name].attempts().len(), 2);
}

/// Stops the test cluster's lagging mirror when dropped.
struct Mirror<'a>(&'a Env);

impl Drop for Mirror<'_> {
    fn drop(&mut self) {
        self.0.script(&["lag-stop"]);
    }
}

/// A lagging shared filesystem, for real: the jobs' workers write their
/// events into a worker-side directory that `test-cluster.sh lag-start`
/// mirrors into the one the orchestrator reads, 6 s late. SLURM says FAILED
/// (the worker's exit 3) before the `oom` line is visible: `resume` then must
/// not retry it, and every result is collected once it shows up.
#[test]
fn cluster_worker_lagging_events_are_all_collected_and_a_late_oom_is_not_retried() {
    let Some(env) = cluster(Use::Shared) else { return };
    let sh = shared(&env);
    let profile =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../templates/profile.sbatch.hbs"))
            .expect("template");
    let lagging = profile.replace("--state-dir {{sh state_dir}}", "--state-dir {{sh work_dir}}/lagging-view/state");
    assert_ne!(lagging, profile, "the template names the worker's state dir");
    let template = sh.dir.join("profile-lagging.sbatch.hbs");
    std::fs::write(&template, lagging).expect("template");
    let mut exp = experiment(
        sh,
        "cw-lag",
        &format!(
            "template: {}\nworker: {{backend: flex, memory_limit: 32MiB}}\n\
             model: {{family: dit, hidden: 64, heads: 4, depth: 2, patch: 4}}\n\
             sweep:\n  configs:\n\
             \x20   - {{name: small}}\n\
             \x20   - {{name: big, input.spatial: [16, 16, 16], model: {{family: unet, channels: [32, 64], attention_levels: [false, true], num_res_blocks: 1, num_head_channels: 32}}}}\n",
            template.display()
        ),
    );
    exp.opts.result_grace = Duration::from_secs(120);
    exp.opts.force = true; // `big` is predicted to OOM under the limit: run it to measure it
    let src = format!("{}/lagging-view/state/cw-lag/runs", sh.remote_work);
    let dst = format!("{}/state/cw-lag/runs", sh.remote_work);
    env.script(&["lag-start", &src, &dst, "6"]);
    let _mirror = Mirror(&env);
    let sweep = exp.sweep();
    let t0 = Instant::now();
    rt().block_on(submit::submit(&sweep, &exp.opts, false)).expect("submit");
    // The moment SLURM says `big` ended, its result is not visible yet: the lag is real.
    loop {
        assert!(t0.elapsed() < Duration::from_secs(240), "big never ended:\n{}", exp.status().table());
        let r = exp.status();
        let row = r.rows.iter().find(|x| x.name == "big").expect("row").clone();
        if row.state == "FAILED" {
            assert_eq!(row.result, None, "the oom line must still be in flight:\n{}", r.table());
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    // resume now: FAILED without a visible result is not taken for a killed worker.
    let rep = rt().block_on(submit::submit(&sweep, &exp.opts, true)).expect("resume during the lag");
    assert!(rep.submitted.is_empty(), "nothing resubmitted during the lag: {rep:?}");
    let why = rep.skipped.iter().find(|(n, _)| n == "big").map(|(_, w)| w.clone()).unwrap_or_default();
    assert!(why.contains("without a visible result"), "{why}");
    // Every result arrives, late.
    let r = exp.watch(Duration::from_secs(120));
    eprintln!("{}", r.table());
    let recs = exp.records();
    assert_eq!(status_of(&recs["small"]), Some("ok"), "{:?}", recs["small"].result());
    assert_eq!(status_of(&recs["big"]), Some("oom"), "{:?}", recs["big"].result());
    let rep = rt().block_on(submit::submit(&sweep, &exp.opts, true)).expect("resume");
    assert!(rep.submitted.is_empty(), "{rep:?}");
    assert!(rep.skipped.iter().any(|(n, w)| n == "big" && w == "measured oom"), "{:?}", rep.skipped);
    assert_eq!(exp.records()["big"].attempts().len(), 1, "the late oom is never retried");
    let ms =
        std::fs::read_to_string(exp.opts.state_root.join("cw-lag").join("measurements.jsonl")).expect("measurements");
    let ms = facts::record::read_jsonl(&ms).expect("parse");
    assert_eq!(ms.len(), 2, "one measurement per result, appended once: {ms:?}");
    eprintln!("FIGURES: lag test (6 s lagging view): {:.1} s", t0.elapsed().as_secs_f64());
}
