//! Integration tests over real SSH against the real SLURM test cluster that
//! `scripts/test-cluster.sh up` starts (slurmctld, slurmd, slurmdbd, sshd on
//! loopback). They read its connection details from `$SWEEP_TEST_CLUSTER_DIR/env`
//! (default /tmp/sweep-test-cluster/env) and fail when it is absent, unless
//! `SWEEP_SKIP_CLUSTER_TESTS=1` says to skip them.
//!
//! The jobs use a light test template (`sed` picks the task's line of the
//! manifest and stores it), so they run in about a second; what is tested is
//! the submission, tracking, crash and reconnect behaviour, not the worker.
//!
//! Tests share one cluster and some restart its daemons, so they run one at a time.

mod common;

use orchestrator::slurm::SlurmState;
use orchestrator::submit::{self, Options, Watch};
use orchestrator::transport::ssh::SshShell;
use orchestrator::transport::Shell;
use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use common::ssh_world::{jobs_per_config, template, watch, world, World};
use common::{cluster, rt, Env, Use};

#[test]
fn cluster_sweep_of_24_configs_is_one_array_followed_to_completion() {
    let Some(env) = cluster(Use::Shared) else { return };
    let w = world(&env, "ct-sweep24", 24, 8, 0.0);
    let sweep = w.sweep();
    let report = rt().block_on(submit::submit(&sweep, &w.opts, false)).expect("submit");
    assert_eq!(report.submitted.len(), 24);
    assert_eq!(report.arrays.len(), 1, "one array for 24 configs (MaxArraySize 100)");
    eprintln!("24-config submit: {:?}, {:.2} s", report.counters, report.wall_s);
    let r = watch(&w, "ct-sweep24", Duration::from_secs(150));
    assert_eq!(r.count("COMPLETED"), 24, "{}", r.table());
    assert_eq!(r.poll.commands, 2, "one squeue + one sacct per poll");
    // Each task received its own config, intact, through the manifest.
    let shell = w.shell();
    let sub = std::fs::read_dir(w.opts.state_root.join("ct-sweep24/submissions"))
        .expect("subs")
        .next()
        .expect("one")
        .expect("entry");
    let sid = sub.file_name().to_string_lossy().into_owned();
    for (i, c) in sweep.configs.iter().enumerate() {
        let path = format!("{}/state/ct-sweep24/submissions/{sid}/task-{i}.json", w.remote_work);
        let got = shell.read_file(&path).expect("sftp").unwrap_or_else(|| panic!("{path} missing"));
        let got: facts::RunConfig = serde_json::from_slice(&got).expect("config json");
        assert_eq!(got, c.config, "task {i}");
    }
    // A second submit submits nothing (and a config has exactly one job).
    let again = rt().block_on(submit::submit(&sweep, &w.opts, false)).expect("submit again");
    assert!(again.submitted.is_empty());
    assert!(jobs_per_config(&env, &w, "ct-sweep24").values().all(|&n| n == 1));
}

#[test]
fn cluster_crash_after_sbatch_then_resume_makes_no_duplicate() {
    let Some(env) = cluster(Use::Shared) else { return };
    let w = world(&env, "ct-crash", 6, 6, 0.0);
    let out = w.binary("submit", &w.exp_file).env("ORCHESTRATOR_FAILPOINT", "sbatch:answered").output().expect("runs");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(9), "killed by SIGKILL after sbatch: {out:?}");
    // The intent is on disk, the job id is not.
    let recs = w.records("ct-crash");
    assert_eq!(recs.len(), 6);
    assert!(recs.values().all(|r| r.attempts().len() == 1 && r.attempts()[0].array_job_id().is_none()));
    let out = w.binary("resume", "ct-crash").output().expect("resume runs");
    assert!(out.status.success(), "resume: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("SLURM had it"), "resume adopted the job: {text}");
    assert!(text.contains("submitted 0 configs"), "{text}");
    let r = watch(&w, "ct-crash", Duration::from_secs(90));
    assert_eq!(r.count("COMPLETED"), 6, "{}", r.table());
    let per = jobs_per_config(&env, &w, "ct-crash");
    let dups: Vec<_> = per.iter().filter(|(_, &n)| n != 1).collect();
    eprintln!("crash test: duplicate jobs = {}", dups.len());
    assert_eq!(per.len(), 6);
    assert!(dups.is_empty(), "duplicates: {dups:?}");
}

#[test]
fn cluster_sshd_restart_during_watch_reconnects() {
    let Some(env) = cluster(Use::Alone) else { return };
    let w = world(&env, "ct-sshd", 4, 1, 2.0);
    let sweep = w.sweep();
    rt().block_on(submit::submit(&sweep, &w.opts, false)).expect("submit");
    let rt = rt();
    let polls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let p2 = polls.clone();
    let opts = w.opts.clone();
    let handle = rt.spawn(async move {
        let watch = Watch { min: Duration::from_millis(500), max: Duration::from_secs(2), max_polls: Some(400) };
        submit::status("ct-sshd", &opts, Some(watch), &mut |_| {
            p2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .await
    });
    let start = Instant::now();
    while polls.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        assert!(start.elapsed() < Duration::from_secs(30), "watch never polled");
        std::thread::sleep(Duration::from_millis(100));
    }
    env.script(&["restart-sshd"]);
    let before = polls.load(std::sync::atomic::Ordering::SeqCst);
    let r = rt.block_on(handle).expect("joined").expect("watch survives the restart");
    assert!(polls.load(std::sync::atomic::Ordering::SeqCst) > before, "polled again after the restart");
    assert!(r.settled);
    assert_eq!(r.count("COMPLETED"), 4, "{}", r.table());
}

#[test]
fn cluster_slurmctld_restart_loses_no_config() {
    let Some(env) = cluster(Use::Alone) else { return };
    let w = world(&env, "ct-ctld", 6, 1, 1.0);
    let sweep = w.sweep();
    rt().block_on(submit::submit(&sweep, &w.opts, false)).expect("submit");
    env.script(&["stop-slurmctld"]);
    // While the controller is down, status says so but keeps the state.
    let r = rt().block_on(submit::status("ct-ctld", &w.opts, None, &mut |_| {}));
    if let Ok(r) = &r {
        assert!(!r.poll.errors.is_empty(), "squeue must fail with slurmctld down");
    }
    env.script(&["start-slurmctld"]);
    let r = watch(&w, "ct-ctld", Duration::from_secs(120));
    assert_eq!(r.count("COMPLETED"), 6, "{}", r.table());
    let per = jobs_per_config(&env, &w, "ct-ctld");
    assert_eq!(per.len(), 6, "every config has its job");
    assert!(per.values().all(|&n| n == 1));
}

#[test]
fn cluster_scancel_one_task_shows_cancelled_and_resume_resubmits_it() {
    let Some(env) = cluster(Use::Shared) else { return };
    let w = world(&env, "ct-scancel", 3, 1, 1.0);
    let sweep = w.sweep();
    let rep = rt().block_on(submit::submit(&sweep, &w.opts, false)).expect("submit");
    let array = rep.arrays[0].clone();
    // Task 2 is still pending (%1): cancel it behind the orchestrator's back.
    env.slurm(&["scancel", &format!("{array}_2")]);
    let r = watch(&w, "ct-scancel", Duration::from_secs(90));
    let row = r.rows.iter().find(|x| x.name == sweep.configs[2].name).expect("row");
    assert_eq!(row.state, "CANCELLED", "{}", r.table());
    assert_eq!(r.count("COMPLETED"), 2);
    let rep = rt().block_on(submit::submit(&sweep, &Options { ..w.opts.clone() }, true)).expect("resume");
    assert_eq!(rep.submitted, vec![sweep.configs[2].name.clone()], "only the cancelled one");
    let r = watch(&w, "ct-scancel", Duration::from_secs(90));
    assert_eq!(r.count("COMPLETED"), 3, "{}", r.table());
    let recs = w.records("ct-scancel");
    assert_eq!(recs[&sweep.configs[2].name].attempts().len(), 2);
    let hist = &recs[&sweep.configs[2].name].attempts()[0].history();
    assert!(hist.iter().any(|h| h.state == SlurmState::Cancelled));
    common::assert_journal_replays(&w.opts.state_root, "ct-scancel");
}

#[test]
fn cluster_hostile_values_arrive_intact_and_never_execute() {
    let Some(env) = cluster(Use::Shared) else { return };
    let w = world(&env, "ct-inject", 3, 3, 0.0);
    let marker = w.dir.join("pwned");
    let m = marker.display();
    let mut sweep = w.sweep();
    let hostile = [
        format!("$(touch {m})"),
        format!("it's \"quoted\" `touch {m}` ; touch {m}"),
        format!("line1\nline2 $(touch {m})\n'"),
    ];
    for (c, name) in sweep.configs.iter_mut().zip(&hostile) {
        c.config.name = name.clone();
    }
    sweep.experiment.description = format!("desc with '$(touch {m})'\nand \"quotes\" and\nnewlines `touch {m}`");
    rt().block_on(submit::submit(&sweep, &w.opts, false)).expect("submit");
    let r = watch(&w, "ct-inject", Duration::from_secs(90));
    assert_eq!(r.count("COMPLETED"), 3, "{}", r.table());
    let shell = w.shell();
    let sid = std::fs::read_dir(w.opts.state_root.join("ct-inject/submissions"))
        .expect("subs")
        .next()
        .expect("one")
        .expect("e")
        .file_name();
    let sid = sid.to_string_lossy();
    for (i, c) in sweep.configs.iter().enumerate() {
        let base = format!("{}/state/ct-inject/submissions/{sid}", w.remote_work);
        let got = shell.read_file(&format!("{base}/task-{i}.json")).expect("sftp").expect("task file");
        let got: facts::RunConfig = serde_json::from_slice(&got).expect("json");
        assert_eq!(got.name, hostile[i], "config name intact");
        assert_eq!(got, c.config);
        let d = shell.read_file(&format!("{base}/description-{i}.txt")).expect("sftp").expect("description");
        assert_eq!(String::from_utf8_lossy(&d), sweep.experiment.description, "description intact");
    }
    assert!(!marker.exists(), "a hostile value was executed");
}

#[test]
fn cluster_unknown_or_changed_host_key_is_refused() {
    let Some(env) = cluster(Use::Shared) else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let empty = tmp.path().join("known_hosts");
    std::fs::write(&empty, "").expect("empty known_hosts");
    let mut c = orchestrator::cluster::ClusterConfig::local();
    c.transport = orchestrator::cluster::TransportKind::Ssh;
    c.host = Some(env.get("SWEEP_TEST_SSH_HOST"));
    c.port = Some(env.get("SWEEP_TEST_SSH_PORT").parse().expect("port"));
    c.user = Some(env.get("SWEEP_TEST_SSH_USER"));
    c.identity_file = Some(env.get("SWEEP_TEST_SSH_KEY").into());
    c.work_dir = Some("/tmp".into());
    for (kh, want) in [
        (empty.clone(), "UNKNOWN HOST KEY"),
        (PathBuf::from(env.get("SWEEP_TEST_KNOWN_HOSTS_CHANGED")), "HOST KEY CHANGED"),
    ] {
        c.known_hosts = Some(kh);
        let shell = SshShell::new("t", &c).expect("target");
        let e = shell.run(&["true".to_string()], true).expect_err("refused");
        let msg = e.to_string();
        assert!(msg.contains(want), "{msg}");
        assert!(msg.contains("SHA256:") && msg.contains("Refusing"), "says what and why: {msg}");
    }
    // The right known_hosts connects.
    c.known_hosts = Some(env.get("SWEEP_TEST_KNOWN_HOSTS").into());
    let out = SshShell::new("t", &c).expect("target").run(&["echo".into(), "a b".into()], true).expect("connects");
    assert_eq!(out.stdout, "a b\n");
}

/// The closing figures: a 120-config sweep (split in two arrays by the test
/// cluster's MaxArraySize=100) and one status poll. Jobs are cancelled after.
#[test]
fn cluster_figures_for_a_120_config_sweep() {
    let Some(env) = cluster(Use::Shared) else { return };
    let w = world(&env, "ct-fig120", 120, 4, 0.0);
    let sweep = w.sweep();
    let rep = rt().block_on(submit::submit(&sweep, &w.opts, false)).expect("submit");
    assert_eq!(rep.submitted.len(), 120);
    assert_eq!(rep.arrays.len(), 2, "MaxArraySize 100 splits 120 configs into two arrays");
    let r = rt().block_on(submit::status("ct-fig120", &w.opts, None, &mut |_| {})).expect("status");
    eprintln!(
        "FIGURES: submit 120 configs: {:.2} s wall, {} SSH exec commands (scontrol + sbatch per array), {} SFTP file ops, {} SSH connections; one status poll: {} SLURM commands",
        rep.wall_s, rep.counters.commands, rep.counters.file_ops, rep.counters.connects, r.poll.commands
    );
    assert_eq!(r.poll.commands, 2);
    assert!(rep.counters.commands <= 4, "{:?}", rep.counters);
    let ids = rt().block_on(submit::cancel("ct-fig120", &w.opts)).expect("cancel");
    assert_eq!((ids.new.len(), ids.again.len()), (2, 0));
    let r = watch(&w, "ct-fig120", Duration::from_secs(120));
    assert_eq!(r.count("COMPLETED") + r.count("CANCELLED"), 120, "{}", r.table());
}

#[path = "support/stall.rs"]
mod stall;
use stall::{wait_bounded, wait_for_intent, Stall};

#[derive(Debug, Clone, Copy)]
enum Moment {
    /// The controller is stopped before `submit` starts.
    BeforeSubmit,
    /// Stopped the instant the intent is on disk: sbatch is about to run or in flight.
    MidSbatch,
    /// Stopped 0.3 s after the intent: sbatch has reached the controller or is waiting on it.
    LateSbatch,
    /// Stopped after `submit` returned; a `status` runs against the stalled controller.
    AfterSubmit,
    /// The controller goes down (killed) the instant the intent is on disk:
    /// sbatch fails to connect, and SLURM never gets the job.
    DownDuringSbatch,
}

/// The field report of issue 11: SIGSTOP slurmctld during a submit, SIGCONT
/// later, then `resume`. At every moment SLURM must end up with exactly one
/// array task per config, all completed: an sbatch that timed out leaves its
/// intent unresolved (never abandoned) until SLURM answers by the job name.
#[test]
fn cluster_stalled_slurmctld_at_any_moment_of_submit_makes_exactly_one_job_per_config() {
    let Some(env) = cluster(Use::Alone) else { return };
    let t_all = Instant::now();
    for moment in
        [Moment::BeforeSubmit, Moment::MidSbatch, Moment::LateSbatch, Moment::AfterSubmit, Moment::DownDuringSbatch]
    {
        let t0 = Instant::now();
        // Job names keep 24 characters of the experiment name: stay below.
        let exp = format!("ct-stall-{}", format!("{moment:?}").to_lowercase().chars().take(12).collect::<String>());
        let w = world(&env, &exp, 4, 4, 0.0);
        let mut stall = Stall::new(&env);
        let submit_out = submit_through_a_stall(&w, &exp, moment, &mut stall);
        eprintln!(
            "{moment:?}: submit exit {:?}: {}{}",
            submit_out.status.code(),
            String::from_utf8_lossy(&submit_out.stdout),
            String::from_utf8_lossy(&submit_out.stderr)
        );
        // resume after the controller is back: settles by name, then submits what SLURM never got.
        let out = w.binary("resume", &exp).output().expect("resume");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{moment:?} resume: {}{text}", String::from_utf8_lossy(&out.stderr));
        eprintln!("{moment:?}: resume: {}", text.trim());
        let r = watch(&w, &exp, Duration::from_secs(90));
        assert_eq!(r.count("COMPLETED"), 4, "{moment:?}\n{}", r.table());
        let per = jobs_per_config(&env, &w, &exp);
        eprintln!(
            "{moment:?}: array tasks per config {:?} ({:.1} s)",
            per.values().collect::<Vec<_>>(),
            t0.elapsed().as_secs_f64()
        );
        assert_eq!(per.len(), 4, "{moment:?}: every config has a job: {per:?}");
        assert!(per.values().all(|&n| n == 1), "{moment:?}: duplicates: {per:?}");
    }
    eprintln!("FIGURES: stall test, 5 moments: {:.1} s", t_all.elapsed().as_secs_f64());
}

/// `submit` with the controller stalled (paused or stopped) at `moment`,
/// then back; for `AfterSubmit`, a `status` against the stalled controller.
/// The submit's output.
fn submit_through_a_stall(w: &World, exp: &str, moment: Moment, stall: &mut Stall) -> Output {
    let journal = w.opts.state_root.join(exp).join("journal.jsonl");
    let spawn = |sub: &str, arg: &std::ffi::OsStr| {
        w.binary(sub, arg)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{sub}: {e}"))
    };
    match moment {
        Moment::BeforeSubmit => {
            stall.pause();
            let child = spawn("submit", w.exp_file.as_os_str());
            std::thread::sleep(Duration::from_secs(8));
            stall.resume();
            wait_bounded(child, Duration::from_secs(90), "submit")
        }
        Moment::MidSbatch | Moment::LateSbatch => {
            let child = spawn("submit", w.exp_file.as_os_str());
            wait_for_intent(&journal);
            if matches!(moment, Moment::LateSbatch) {
                std::thread::sleep(Duration::from_millis(300));
            }
            stall.pause();
            std::thread::sleep(Duration::from_secs(8));
            stall.resume();
            wait_bounded(child, Duration::from_secs(90), "submit")
        }
        Moment::DownDuringSbatch => {
            let child = spawn("submit", w.exp_file.as_os_str());
            wait_for_intent(&journal);
            stall.stop();
            let out = wait_bounded(child, Duration::from_secs(90), "submit");
            stall.start();
            out
        }
        Moment::AfterSubmit => {
            let out = w.binary("submit", &w.exp_file).output().expect("submit");
            assert!(out.status.success(), "submit: {}", String::from_utf8_lossy(&out.stderr));
            stall.pause();
            let child = spawn("status", exp.as_ref());
            let st = wait_bounded(child, Duration::from_secs(60), "status against a stalled controller");
            eprintln!("status while stalled: {}", String::from_utf8_lossy(&st.stdout).lines().last().unwrap_or(""));
            stall.resume();
            out
        }
    }
}

/// A worker slow to answer `--version` (here it sleeps) on a host that was
/// reached: `submit` names the command that said nothing and after how long,
/// and what to try, not "cannot reach" the host; nothing is submitted. (A
/// silent link looks the same, so it is retried for the reconnect window
/// first, as a dropped session is.)
#[test]
fn cluster_a_silent_worker_probe_names_the_command_not_the_network() {
    let Some(env) = cluster(Use::Shared) else { return };
    let w = world(&env, "ct-silent", 1, 1, 0.0);
    // A template that runs the worker, so submit checks it first.
    std::fs::write(w.dir.join("record.sbatch.hbs"), template(0.0) + "{{sh worker}} --version\n").expect("template");
    let slow = format!("{}/bin/slow-worker", w.remote_work);
    w.shell().write_file(&slow, b"#!/bin/sh\nsleep 30\n", true).expect("upload");
    let clusters = w.dir.join("clusters.yaml");
    let text = std::fs::read_to_string(&clusters).expect("clusters") + &format!("    worker: {slow}\n");
    std::fs::write(&clusters, text).expect("clusters");
    let t0 = Instant::now();
    let out = w
        .binary("submit", &w.exp_file)
        .env("SWEEP_SSH_COMMAND_SECS", "2")
        .env("SWEEP_SSH_RECONNECT_SECS", "3")
        .output()
        .expect("submit runs");
    let said = common::text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains(&format!("was reached, but `{slow} --version` printed nothing within 2 s")), "{said}");
    assert!(said.contains("Run it there by hand"), "{said}");
    assert!(!said.contains("cannot reach"), "{said}");
    // Retried as a drop would be, for the reconnect window only (3 s here).
    assert!(t0.elapsed() < Duration::from_secs(25), "{:?}", t0.elapsed());
    let subs = w.opts.state_root.join("ct-silent/submissions");
    let submitted = std::fs::read_dir(&subs).map(|d| d.count()).unwrap_or(0);
    assert_eq!(submitted, 0, "nothing submitted: {said}");
}
