//! The `rest` transport against the test cluster's real slurmrestd (Slurm
//! 22.05, API v0.0.38, JWT auth; `scripts/test-cluster.sh up`, details in
//! `$SWEEP_TEST_CLUSTER_DIR/env`). Fails when the cluster is absent unless
//! `SWEEP_SKIP_CLUSTER_TESTS=1`.
//!
//! SLURM is driven only through HTTP; files move on this machine's
//! filesystem (`files: local`: the test cluster is this machine) or over SFTP
//! to the cluster's sshd (`files: sftp`). The worker sweep runs the real
//! Burn worker (`cargo build -p worker` first, as for cluster_worker.rs); the
//! other tests use a light template that copies its manifest line.
//!
//! Tests share one cluster, so they run one at a time.

mod common;

use orchestrator::submit::{self, Options, StatusReport, Watch};
use orchestrator::sweep::{self, Sweep};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{cluster, rt, text, worker_binary, Env, Use};

/// One test's world: its clusters file (`test`: REST with local files;
/// `test-sftp`: REST with files over SFTP; both on one fresh work dir), its
/// template and experiment, its local state.
struct World {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    opts: Options,
    exp: String,
    exp_file: PathBuf,
}

/// A clusters file entry; `token` is `token_file: …` or `token_env: …`.
fn entry(env: &Env, name: &str, files: &str, token: &str, work: &str, sleep: f64) -> String {
    let sftp = if files == "sftp" { env.ssh_fields() } else { String::new() };
    format!(
        "  {name}:\n    transport: rest\n    url: {}\n    user: {}\n    {token}\n    files: {files}\n{sftp}    max_array_size: 100\n    work_dir: {work}\n    env: {{SWEEP_TEST_SLEEP: \"{sleep}\"}}\n    defaults: {{partition: gpu, time: \"00:10:00\", cpus_per_task: 1}}\n",
        env.get("SWEEP_TEST_REST_URL"),
        env.get("SWEEP_TEST_SSH_USER"),
    )
}

fn world(env: &Env, test: &str, cluster: &str, body: &str, sleep: f64) -> World {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_path_buf();
    let work = env.remote_work(test);
    let token = format!("token_file: {}", env.get("SWEEP_TEST_REST_TOKEN_FILE"));
    let clusters = format!(
        "clusters:\n{}{}",
        entry(env, "test", "local", &token, &work, sleep),
        entry(env, "test-sftp", "sftp", &token, &work, sleep)
    );
    std::fs::write(dir.join("clusters.yaml"), clusters).expect("clusters file");
    std::fs::write(dir.join("record.sbatch.hbs"), common::RECORD_TEMPLATE).expect("template");
    let exp_file = dir.join(format!("{test}.yaml"));
    let text = format!(
        "name: {test}\ndescription: rest test\ncluster: {cluster}\ngpu: A100-SXM4-80GB\nprecision: fp32\n\
         input: {{channels: 1, spatial: [8, 8, 8]}}\noutput_channels: 1\n{body}"
    );
    std::fs::write(&exp_file, text.replace("RECORD", &dir.join("record.sbatch.hbs").display().to_string()))
        .expect("experiment file");
    let opts = Options {
        state_root: dir.join("state"),
        clusters_file: Some(dir.join("clusters.yaml")),
        template_dirs: vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../templates")],
        result_grace: Duration::from_secs(3),
        ..Options::default()
    };
    World { _tmp: tmp, dir, opts, exp: test.to_string(), exp_file }
}

/// `n` configs of the record template, `parallel` at a time.
fn record_body(n: usize, parallel: u32) -> String {
    let batches: Vec<String> = (1..=n).map(|b| b.to_string()).collect();
    format!(
        "model: {{family: unet, channels: [32, 64], attention_levels: [false, false], num_res_blocks: 1, num_head_channels: 32}}\n\
         template: RECORD\narray_parallelism: {parallel}\nsweep:\n  name: \"b{{batch}}\"\n  grid:\n    batch: [{}]\n",
        batches.join(", ")
    )
}

impl World {
    fn sweep(&self) -> Sweep {
        sweep::load(&self.exp_file, &[]).expect("experiment loads")
    }

    fn records(&self) -> BTreeMap<String, orchestrator::state::ConfigRecord> {
        common::records(&self.opts.state_root, &self.exp)
    }

    /// The orchestrator binary: `args`, then this world's state and clusters.
    fn binary(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_orchestrator"));
        c.args(args).arg("--clusters").arg(self.dir.join("clusters.yaml")).env_remove("SLURM_JWT");
        c
    }

    fn cli(&self, sub: &str, arg: &Path) -> Command {
        let mut c = self.binary(&[sub]);
        c.arg(arg).arg("--state-dir").arg(&self.opts.state_root);
        c
    }

    fn watch(&self, limit: Duration) -> StatusReport {
        let watch = Watch {
            min: Duration::from_millis(700),
            max: Duration::from_secs(2),
            max_polls: Some((limit.as_secs_f64() / 0.7) as u32 + 1),
        };
        let r = rt().block_on(submit::status(&self.exp, &self.opts, Some(watch), &mut |_| {})).expect("status --watch");
        assert!(r.settled, "not settled within {limit:?}:\n{}", r.table());
        r
    }

    /// Every submission this world's state made.
    fn submissions(&self) -> Vec<orchestrator::state::Submission> {
        common::submissions(&self.opts.state_root, &self.exp)
    }

    /// How many SLURM tasks ran each config, from the cluster's own sacct and
    /// squeue, mapped back through the submissions' task lists.
    fn jobs_per_config(&self, env: &Env) -> BTreeMap<String, usize> {
        env.jobs_per_config(&self.opts.state_root, &self.exp)
    }
}

/// A debug worker is hundreds of MiB: those installed by earlier runs of
/// this file (`rt-*-<pid>/bin`, their pid gone) are removed.
fn remove_stale_workers(root: &Path) {
    let Ok(rd) = std::fs::read_dir(root) else { return };
    for e in rd.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("rt-").and_then(|n| n.rsplit('-').next()).and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only checks whether the process exists.
        if pid != std::process::id() as i32 && unsafe { libc::kill(pid, 0) } != 0 {
            let _ = std::fs::remove_dir_all(e.path().join("bin"));
        }
    }
}

/// The real worker through REST: installed, run as a job array, its measured
/// results collected into the local state; every poll is two requests.
#[test]
fn rest_worker_sweep_runs_to_completion_with_results_collected() {
    let Some(env) = cluster(Use::Shared) else { return };
    let w = world(
        &env,
        "rt-worker",
        "test",
        "batch: 1\narray_parallelism: 2\nworker: {backend: flex}\n\
         model: {family: unet, channels: [32, 64], attention_levels: [false, true], num_res_blocks: 1, num_head_channels: 32}\n\
         sweep:\n  configs:\n    - {name: unet_8}\n    - {name: dit_8, model: {family: dit, hidden: 64, heads: 4, depth: 2, patch: 2}}\n",
        0.0,
    );
    remove_stale_workers(Path::new(&env.get("SWEEP_TEST_WORK_DIR")));
    let out = w.binary(&["install", "--cluster", "test"]).arg("--worker").arg(worker_binary()).output().expect("runs");
    assert!(out.status.success(), "install: {}", text(&out));
    let sweep = w.sweep();
    let t0 = Instant::now();
    let rep = rt().block_on(submit::submit(&sweep, &w.opts, false)).expect("submit");
    assert_eq!((rep.submitted.len(), rep.arrays.len()), (2, 1), "{rep:?}");
    eprintln!("rest submit: {:?}, {:.2} s", rep.counters, rep.wall_s);
    let r = w.watch(Duration::from_secs(300));
    eprintln!("{}\nrest worker sweep: {:.1} s from submit to the last result", r.table(), t0.elapsed().as_secs_f64());
    assert_eq!(r.count("COMPLETED"), 2, "{}", r.table());
    assert_eq!(r.poll.commands, 2, "one slurmctld job list + one accounting query per poll");
    assert!(r.poll.errors.is_empty(), "both views answered: {:?}", r.poll.errors);
    // Requests per poll, counted on the wire: the transport itself, after its one version discovery.
    let (file, label) =
        orchestrator::cluster::ClustersFile::load_or_default(w.opts.clusters_file.as_deref()).expect("clusters");
    let (name, c) = file.get("test", &label).expect("test cluster");
    let t = orchestrator::transport::open(&name, &c, &w.opts.state_root).expect("rest transport");
    let names: Vec<String> = w.submissions().into_iter().map(|s| s.job_name).collect();
    let since = orchestrator::fsio::now() - 3600.0;
    t.poll(&names, since).expect("first poll");
    let before = t.counters();
    let p = t.poll(&names, since).expect("poll");
    let requests = t.counters().commands - before.commands;
    eprintln!("requests per poll: {requests} ({} tasks seen)", p.tasks.len());
    assert_eq!(requests, 2);
    assert!(p.complete() && p.tasks.len() == 2 && p.tasks.values().all(|o| o.state.name() == "COMPLETED"), "{p:?}");
    for (name, rec) in w.records() {
        let res = rec.result().unwrap_or_else(|| panic!("{name}: no result collected"));
        let res = &serde_json::to_value(res).expect("a result serialises");
        assert_eq!(res.get("status").and_then(|s| s.as_str()), Some("ok"), "{name}: {res}");
        assert!(res.get("peak_bytes").and_then(|p| p.as_u64()).is_some_and(|p| p > 0), "{name}: {res}");
        let events = w.opts.state_root.join(&w.exp).join("runs").join(rec.hash().as_str()).join("events.jsonl");
        assert!(events.is_file(), "{}: the event stream was pulled into the local state", events.display());
    }
    common::assert_journal_replays(&w.opts.state_root, &w.exp);
}

/// `cancel` through REST (files over SFTP): the running and the pending
/// tasks end CANCELLED.
#[test]
fn rest_cancel_over_sftp_files_cancels_running_and_pending_tasks() {
    let Some(env) = cluster(Use::Shared) else { return };
    let w = world(&env, "rt-cancel", "test-sftp", &record_body(4, 2), 60.0);
    let rep = rt().block_on(submit::submit(&w.sweep(), &w.opts, false)).expect("submit");
    assert_eq!(rep.submitted.len(), 4);
    assert!(
        rep.counters.connects >= 1 && rep.counters.file_ops > 0,
        "the job files went over SFTP: {:?}",
        rep.counters
    );
    // Wait until two tasks run (the other two wait behind %2).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = rt().block_on(submit::status(&w.exp, &w.opts, None, &mut |_| {})).expect("status");
        if r.count("RUNNING") == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "tasks never ran:\n{}", r.table());
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = w.cli("cancel", Path::new(&w.exp)).output().expect("cancel runs");
    assert!(out.status.success(), "cancel: {}", text(&out));
    let r = w.watch(Duration::from_secs(60));
    assert_eq!(r.count("CANCELLED"), 4, "{}", r.table());
    // The jobs are gone from SLURM too, not just from the orchestrator's view.
    let ours: BTreeSet<String> = w.submissions().into_iter().map(|s| s.job_name).collect();
    let live = env.slurm(&["squeue", "--noheader", "--array", "--states=PENDING,RUNNING", "--format=%j"]);
    assert!(!live.lines().any(|l| ours.contains(l.trim())), "still queued or running: {live}");
}

/// Killed between the submit request's answer and its record: `resume`
/// finds the job by its name through REST and adopts it; nothing runs twice.
#[test]
fn rest_crash_after_submit_then_resume_adopts_without_duplicate() {
    let Some(env) = cluster(Use::Shared) else { return };
    let w = world(&env, "rt-crash", "test", &record_body(5, 5), 0.0);
    let out = w.cli("submit", &w.exp_file).env("ORCHESTRATOR_FAILPOINT", "sbatch:answered").output().expect("runs");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(9), "killed after the submit request: {}", text(&out));
    let recs = w.records();
    assert_eq!(recs.len(), 5);
    assert!(recs.values().all(|r| r.attempts().len() == 1 && r.attempts()[0].array_job_id().is_none()), "intent only");
    let out = w.cli("resume", Path::new(&w.exp)).output().expect("resume runs");
    assert!(out.status.success(), "resume: {}", text(&out));
    let said = text(&out);
    assert!(said.contains("SLURM had it") && said.contains("submitted 0 configs"), "{said}");
    let r = w.watch(Duration::from_secs(90));
    assert_eq!(r.count("COMPLETED"), 5, "{}", r.table());
    let per = w.jobs_per_config(&env);
    assert_eq!(per.len(), 5, "{per:?}");
    assert!(per.values().all(|&n| n == 1), "duplicates: {per:?}");
}

impl World {
    /// Adds `name` to the clusters file: the `test` entry over the test
    /// cluster's https front (its certificate signed by the site's own CA),
    /// with `ca_file` when `trust` is set.
    fn add_https_cluster(&self, env: &Env, name: &str, trust: bool) {
        let path = self.dir.join("clusters.yaml");
        let text = std::fs::read_to_string(&path).expect("clusters file");
        let test =
            text.trim_start_matches("clusters:\n").split("  test-sftp:").next().expect("the test entry").to_string();
        let plain = format!("url: {}", env.get("SWEEP_TEST_REST_URL"));
        let mut https = format!("url: {}", env.get("SWEEP_TEST_REST_TLS_URL"));
        if trust {
            https.push_str(&format!("\n    ca_file: {}", env.get("SWEEP_TEST_REST_CA")));
        }
        let entry = test.replacen("  test:", &format!("  {name}:"), 1).replace(&plain, &https);
        std::fs::write(&path, format!("{text}{entry}")).expect("clusters file");
    }
}

/// A site serving slurmrestd over https with its own CA: with the CA in
/// `ca_file` a sweep runs through it; without, the certificate is refused
/// before anything is sent, and the error names the endpoint and why.
#[test]
fn rest_over_https_trusts_the_sites_ca_and_only_that() {
    let Some(env) = cluster(Use::Shared) else { return };
    let w = world(&env, "rt-https", "https", &record_body(3, 3), 0.0);
    w.add_https_cluster(&env, "https", true);
    let t = Instant::now();
    let rep = rt().block_on(submit::submit(&w.sweep(), &w.opts, false)).expect("submit over https");
    assert_eq!(rep.submitted.len(), 3);
    let r = w.watch(Duration::from_secs(90));
    assert_eq!(r.count("COMPLETED"), 3, "{}", r.table());
    eprintln!("https sweep of 3 configs completed in {:.1} s", t.elapsed().as_secs_f64());
    assert!(w.jobs_per_config(&env).values().all(|&n| n == 1));

    let w = world(&env, "rt-https-unknown-ca", "https-no-ca", &record_body(2, 2), 0.0);
    w.add_https_cluster(&env, "https-no-ca", false);
    let out = w.cli("submit", &w.exp_file).output().expect("runs");
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    let endpoint = format!("GET {}/openapi/v3", env.get("SWEEP_TEST_REST_TLS_URL"));
    assert!(said.contains(&endpoint) && said.contains("UnknownIssuer"), "{said}");
    // Only the POST can create a job, and it never left: the intent is
    // released at once (no configs held until SLURM answers) and no job exists.
    assert!(said.contains("nothing reached SLURM") && said.contains("free to submit again"), "{said}");
    let subs = w.submissions();
    assert_eq!(subs.len(), 1);
    assert_eq!(subs[0].state().name(), "abandoned");
    assert!(w.jobs_per_config(&env).is_empty());
}

/// A token SLURM refuses, and one past its lifespan: each command fails with
/// the endpoint and the HTTP status, and never prints the token.
#[test]
fn rest_wrong_or_expired_token_is_a_clear_error_without_the_token() {
    let Some(env) = cluster(Use::Shared) else { return };
    let url = env.get("SWEEP_TEST_REST_URL");
    let t0 = Instant::now();
    // Wrong: a well-formed JWT for this user, signed with another key.
    let real = std::fs::read_to_string(env.get("SWEEP_TEST_REST_TOKEN_FILE")).expect("token file");
    let mut parts: Vec<String> = real.trim().split('.').map(str::to_string).collect();
    assert_eq!(parts.len(), 3, "the test cluster's token is a JWT");
    parts[2] = parts[2].chars().rev().collect();
    let wrong = parts.join(".");
    // Expired: a real token with a 2-second lifespan, 3 seconds later.
    let expired = env.script(&["token", "2"]).trim().to_string();
    assert!(expired.starts_with("eyJ"), "scontrol token printed a JWT");
    std::thread::sleep(Duration::from_secs(3));
    for (case, token) in [("wrong", &wrong), ("expired", &expired)] {
        let w = world(&env, &format!("rt-token-{case}"), "test", &record_body(2, 2), 0.0);
        // The wrong token comes from a file, the expired one from a variable.
        let (line, var) = if case == "wrong" {
            let f = w.dir.join("token");
            std::fs::write(&f, format!("SLURM_JWT={token}\n")).expect("token file");
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            (format!("token_file: {}", f.display()), None)
        } else {
            ("token_env: SWEEP_TEST_JWT".to_string(), Some(token.clone()))
        };
        let clusters = std::fs::read_to_string(w.dir.join("clusters.yaml")).expect("clusters");
        let clusters = clusters.replace(&format!("token_file: {}", env.get("SWEEP_TEST_REST_TOKEN_FILE")), &line);
        std::fs::write(w.dir.join("clusters.yaml"), clusters).expect("clusters");
        let mut cmd = w.cli("submit", &w.exp_file);
        cmd.env("RUST_LOG", "debug");
        if let Some(v) = &var {
            cmd.env("SWEEP_TEST_JWT", v);
        }
        let out = cmd.output().expect("runs");
        let said = text(&out);
        eprintln!("{case} token: {said}");
        assert!(!out.status.success(), "{case}: submit must fail: {said}");
        assert!(
            said.contains(&format!("POST {url}/slurm/v0.0.38/job/submit: HTTP 500")),
            "{case}: endpoint and status: {said}"
        );
        let secret = token.rsplit('.').next().expect("signature");
        assert!(!said.contains(secret) && !said.contains(token.as_str()), "{case}: the token leaked: {said}");
        // Nowhere in the state either: journal, submissions, records, job files.
        let mut dirs = vec![w.opts.state_root.clone()];
        let mut files = 0;
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).expect("state dir").map(|e| e.expect("entry").path()) {
                if e.is_dir() {
                    dirs.push(e);
                } else {
                    files += 1;
                    let bytes = std::fs::read(&e).expect("state file");
                    assert!(
                        !String::from_utf8_lossy(&bytes).contains(secret),
                        "{case}: the token is in {}",
                        e.display()
                    );
                }
            }
        }
        assert!(files > 3, "{case}: the state was written (intent, journal, records)");
        match case {
            "wrong" => assert!(said.contains("job/submit: HTTP 500 Internal Server Error: Zero Bytes were transmitted or received; slurmrestd gives this generic error when SLURM refuses the token"), "{said}"),
            _ => assert!(said.contains("SWEEP_TEST_JWT: the token expired at"), "{said}"),
        }
    }
    eprintln!("token errors: {:.1} s", t0.elapsed().as_secs_f64());
}

/// Undoes test-cluster.sh actions when dropped, so a failing test never
/// leaves the shared cluster's slurmctld paused or slurmrestd stopped.
struct Undo<'a> {
    env: &'a Env,
    pending: Vec<&'static str>,
}

impl Undo<'_> {
    fn run(&mut self, action: &str, undo: &'static str) {
        self.env.script(&[action]);
        self.pending.push(undo);
    }

    fn undo(&mut self) {
        while let Some(a) = self.pending.pop() {
            self.env.script(&[a]);
        }
    }
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        self.undo();
    }
}

/// A submit request without an answer is not a "no": slurmctld paused
/// (SIGSTOP) the instant the intent is on disk, or slurmrestd down, during
/// `submit`; then `resume` settles by name through REST. Each config ends
/// with exactly one SLURM job, completed.
#[test]
fn rest_stalled_controller_or_stopped_slurmrestd_during_submit_makes_exactly_one_job_per_config() {
    let Some(env) = cluster(Use::Alone) else { return };
    for (case, action, undo) in
        [("paused", "pause-slurmctld", "resume-slurmctld"), ("norest", "stop-slurmrestd", "start-slurmrestd")]
    {
        let t0 = Instant::now();
        let w = world(&env, &format!("rt-stall-{case}"), "test", &record_body(3, 3), 0.0);
        let journal = w.opts.state_root.join(&w.exp).join("journal.jsonl");
        let mut guard = Undo { env: &env, pending: vec![] };
        let child = w
            .cli("submit", &w.exp_file)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("submit");
        let start = Instant::now();
        while !std::fs::read_to_string(&journal).unwrap_or_default().contains("\"op\":\"intent\"") {
            assert!(start.elapsed() < Duration::from_secs(60), "submit never wrote its intent");
            std::thread::sleep(Duration::from_millis(2));
        }
        guard.run(action, undo);
        let out = wait_bounded(child, Duration::from_secs(120));
        guard.undo();
        eprintln!(
            "{case}: submit exit {:?} after {:.1} s: {}",
            out.status.code(),
            start.elapsed().as_secs_f64(),
            text(&out).trim()
        );
        let out = w.cli("resume", Path::new(&w.exp)).output().expect("resume");
        assert!(out.status.success(), "{case}: resume: {}", text(&out));
        eprintln!("{case}: resume: {}", text(&out).trim());
        let r = w.watch(Duration::from_secs(90));
        assert_eq!(r.count("COMPLETED"), 3, "{case}\n{}", r.table());
        let per = w.jobs_per_config(&env);
        eprintln!(
            "{case}: array tasks per config {:?} ({:.1} s)",
            per.values().collect::<Vec<_>>(),
            t0.elapsed().as_secs_f64()
        );
        assert_eq!(per.len(), 3, "{case}: every config has a job: {per:?}");
        assert!(per.values().all(|&n| n == 1), "{case}: duplicates: {per:?}");
    }
}

/// Waits for a child with a deadline (killing it past the deadline).
fn wait_bounded(mut child: std::process::Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("did not finish within {limit:?}: {}", text(&child.wait_with_output().expect("output")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}
