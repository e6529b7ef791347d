//! Several configs per array task (`worker: {configs_per_task: K}`) with the
//! real Burn worker on the real SLURM test cluster over SSH
//! (`scripts/test-cluster.sh up`; `$SWEEP_TEST_CLUSTER_DIR/env`). Fails when
//! the cluster is absent unless `SWEEP_SKIP_CLUSTER_TESTS=1`.
//!
//! A task of three configs is stopped while its second config runs, killed
//! (SIGKILL, every process of its worker) or cancelled (scancel): the first
//! keeps its result, the second (started, no result; or `cancelled`) and the
//! third (never reached) are resubmitted once, together as one task, and
//! nothing is submitted twice beyond that.

mod common;

use orchestrator::state::ConfigRecord;
use orchestrator::submit::{self, Options, StatusReport, Watch};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{cluster, rt, worker_binary, Env, Use};

/// A clusters file naming the test cluster `test` (work dir `ck-<pid>` under
/// its work root; those of earlier runs, their process gone, removed), and
/// this build's worker installed there.
fn install(env: &Env, dir: &Path) -> (PathBuf, String) {
    let remote_work = env.remote_work("ck");
    let clusters = env.ssh_clusters_file(dir, &remote_work, common::JOB_DEFAULTS);
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .args(["install", "--cluster", "test", "--clusters"])
        .arg(&clusters)
        .arg("--worker")
        .arg(worker_binary())
        .output()
        .expect("orchestrator runs");
    assert!(out.status.success(), "install: {}", String::from_utf8_lossy(&out.stderr));
    (clusters, remote_work)
}

fn records(opts: &Options, exp: &str) -> BTreeMap<String, ConfigRecord> {
    common::records(&opts.state_root, exp)
}

fn status(opts: &Options, exp: &str) -> StatusReport {
    rt().block_on(submit::status(exp, opts, None, &mut |_| {})).expect("status")
}

/// `status --watch` until every config settled (or `limit`).
fn watch(opts: &Options, exp: &str, limit: Duration) -> StatusReport {
    let watch = Watch {
        min: Duration::from_millis(700),
        max: Duration::from_secs(2),
        max_polls: Some((limit.as_secs_f64() / 0.7) as u32 + 1),
    };
    let r = rt().block_on(submit::status(exp, opts, Some(watch), &mut |_| {})).expect("status --watch");
    assert!(r.settled, "not settled within {limit:?}:\n{}", r.table());
    r
}

fn result_of(r: &ConfigRecord) -> Option<&str> {
    r.result().map(|v| v.status.name())
}

/// The worker processes of this experiment's jobs (found by their manifest paths).
fn worker_pids(manifests: &str) -> Vec<i32> {
    let out =
        Command::new("pgrep").args(["-f", &format!("worker run --manifest {manifests}")]).output().expect("pgrep");
    String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

/// How many `start` and `result` lines an events file holds.
fn starts_and_results(opts: &Options, exp: &str, r: &ConfigRecord) -> (usize, usize) {
    let path = opts.state_root.join(exp).join(facts::run::events_rel(&facts::run::ConfigHash(r.hash().to_string())));
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let count = |kind: &str| text.lines().filter(|l| l.contains(&format!("\"event\":\"{kind}\""))).count();
    (count("start"), count("result"))
}

/// How a test stops the task while `slow` runs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stop {
    /// SIGKILL to every process of the task's worker (a node lost, the OOM killer): no result.
    Kill,
    /// `orchestrator cancel` (scancel: SIGTERM first): `slow` records `cancelled`.
    Cancel,
}

/// One test's experiment: a task of three trainings of one tiny DiT, `slow`'s
/// steps keeping it running long enough to be stopped in (and, retried, to end).
struct Case {
    exp: String,
    sweep: orchestrator::sweep::Sweep,
    opts: Options,
    remote_work: String,
}

fn case(env: &Env, exp: &str) -> Case {
    let dir = std::env::temp_dir().join(format!("sweep-cluster-tasks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("test dir");
    static INSTALLED: std::sync::OnceLock<(PathBuf, String)> = std::sync::OnceLock::new();
    let (clusters, remote_work) = INSTALLED.get_or_init(|| install(env, &dir)).clone();
    let file = dir.join(format!("{exp}.yaml"));
    std::fs::write(
        &file,
        format!(
            "name: {exp}\ndescription: a task of three configs stopped midway\ncluster: test\ngpu: A100-SXM4-80GB\n\
             precision: fp32\nmode: train\ninput: {{channels: 1, spatial: [8, 8, 8]}}\noutput_channels: 1\n\
             model: {{family: dit, hidden: 32, heads: 2, depth: 1, patch: 4}}\n\
             worker: {{backend: flex, configs_per_task: 3}}\n\
             sweep:\n  configs:\n    - {{name: first, steps: 1}}\n    - {{name: slow, steps: {SLOW_STEPS}}}\n    - {{name: last, steps: 2}}\n"
        ),
    )
    .expect("experiment file");
    let opts = Options {
        state_root: dir.join(format!("state-{exp}")),
        clusters_file: Some(clusters),
        template_dirs: vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../templates")],
        // The cluster is this machine: a killed worker's missing result is final at once.
        result_grace: Duration::from_secs(3),
        ..Options::default()
    };
    let sweep = orchestrator::sweep::load(&file, &[]).expect("experiment loads");
    Case { exp: exp.into(), sweep, opts, remote_work }
}

/// Submits the case, stops its task as `stop` says once `first` has its
/// result and `slow` has started; returns when every config settled.
fn submit_and_stop(c: &Case, stop: Stop) {
    let (exp, opts) = (c.exp.as_str(), &c.opts);
    let t0 = Instant::now();
    let rep = rt().block_on(submit::submit(&c.sweep, opts, false)).expect("submit");
    assert_eq!((rep.submitted.len(), rep.arrays.len()), (3, 1), "{rep:?}");
    let subs = common::submissions(&opts.state_root, exp);
    assert_eq!((subs[0].array.as_str(), subs[0].configs_per_task), ("0", 3), "one task runs all three");
    let manifests = format!("{}/state/{exp}/submissions/", c.remote_work);
    loop {
        assert!(t0.elapsed() < Duration::from_secs(180), "slow never started:\n{}", status(opts, exp).table());
        let _ = status(opts, exp);
        let recs = records(opts, exp);
        if let Some(res) = &recs["slow"].result() {
            panic!("slow ended ({:?}) before it could be stopped: raise SLOW_STEPS", res.status);
        }
        let slow_started = recs["slow"].attempts().last().and_then(|a| a.worker().word()) == Some("started");
        let pids = worker_pids(&manifests);
        if result_of(&recs["first"]) == Some("ok") && slow_started && !pids.is_empty() {
            match stop {
                Stop::Kill => {
                    // The supervisor first (its children run `--from J`), so none outlives another to
                    // record anything: every process of the task gone at once, as when its node is lost.
                    let is_child = |pid: &i32| {
                        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                        cmdline.split(|b| *b == 0).any(|arg| arg == b"--from")
                    };
                    let mut pids = pids.clone();
                    pids.sort_by_key(is_child);
                    for &pid in &pids {
                        // SAFETY: signalling the worker processes of this test's own job (its unique manifest path).
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
                Stop::Cancel => {
                    let cancelled = rt().block_on(submit::cancel(exp, opts)).expect("cancel");
                    assert_eq!(cancelled.new.len(), 1, "{cancelled:?}");
                }
            }
            eprintln!("{stop:?} {pids:?} while `slow` ran, {:.1} s after submit", t0.elapsed().as_secs_f64());
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let r = watch(opts, exp, Duration::from_secs(120));
    eprintln!("{}", r.table());
}

/// After the stop: `first` keeps its result; `resume` sends `slow` and
/// `last` again, together as one task of a new array, once; they end; a
/// second `resume` has nothing to do, and nothing ran twice beyond that.
fn resume_retries_the_rest_once(env: &Env, c: &Case) {
    let (exp, opts) = (c.exp.as_str(), &c.opts);
    let t0 = Instant::now();
    let rep = rt().block_on(submit::submit(&c.sweep, opts, true)).expect("resume");
    let mut again = rep.submitted.clone();
    again.sort();
    assert_eq!(again, ["last", "slow"], "{rep:?}");
    assert!(rep.skipped.iter().any(|(n, why)| n == "first" && why == "completed"), "{:?}", rep.skipped);
    let mut subs = common::submissions(&opts.state_root, exp);
    subs.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!((subs.len(), subs[1].array.as_str(), subs[1].tasks.len()), (2, "0", 2));
    let r = watch(opts, exp, Duration::from_secs(300));
    eprintln!("after resume ({:.1} s):\n{}", t0.elapsed().as_secs_f64(), r.table());
    let recs = records(opts, exp);
    for name in ["first", "slow", "last"] {
        assert_eq!(result_of(&recs[name]), Some("ok"), "{name}: {:?}", recs[name].result());
    }
    let attempts: Vec<usize> = ["first", "slow", "last"].iter().map(|n| recs[*n].attempts().len()).collect();
    assert_eq!(attempts, [1, 2, 2], "retried exactly once");
    let rep = rt().block_on(submit::submit(&c.sweep, opts, true)).expect("resume again");
    assert!(rep.submitted.is_empty() && rep.arrays.is_empty(), "{rep:?}");
    // SLURM's own accounting agrees: `first` ran in one task, the others in two.
    let jobs = env.jobs_per_config(&opts.state_root, exp);
    let by_name: BTreeMap<&str, usize> =
        recs.values().map(|r| (r.name(), jobs.get(r.hash().as_str()).copied().unwrap_or(0))).collect();
    assert_eq!(by_name, BTreeMap::from([("first", 1), ("last", 2), ("slow", 2)]));
    // Nothing lost, nothing twice: one measurement per config.
    let ms = std::fs::read_to_string(opts.state_root.join(exp).join("measurements.jsonl")).expect("measurements");
    let mut measured: Vec<String> =
        facts::record::read_jsonl(&ms).expect("parse").into_iter().filter_map(|m| m.config_name).collect();
    measured.sort();
    assert_eq!(measured, ["first", "last", "slow"]);
    assert_eq!(starts_and_results(opts, exp, &recs["first"]), (1, 1));
    assert_eq!(starts_and_results(opts, exp, &recs["last"]), (1, 1), "reached only by the retry");
    common::assert_journal_replays(&opts.state_root, exp);
}

#[test]
fn cluster_tasks_a_task_killed_midway_keeps_what_ended_and_retries_the_rest_once() {
    let Some(env) = cluster(Use::Shared) else { return };
    let t0 = Instant::now();
    let c = case(&env, "ck-kill");
    submit_and_stop(&c, Stop::Kill);
    let recs = records(&c.opts, &c.exp);
    for name in ["first", "slow", "last"] {
        let a = recs[name].attempts().last().expect("an attempt");
        assert_eq!(a.state().map(|s| s.name()), Some("FAILED"), "{name}: the task was SIGKILLed");
        assert_eq!(a.task_id(), 0, "{name}");
    }
    assert_eq!(result_of(&recs["first"]), Some("ok"), "the ended config keeps its result");
    assert_eq!((recs["slow"].attempts()[0].worker().word(), result_of(&recs["slow"])), (Some("started"), None));
    assert_eq!((recs["last"].attempts()[0].worker().word(), result_of(&recs["last"])), (None, None), "never reached");
    resume_retries_the_rest_once(&env, &c);
    let recs = records(&c.opts, &c.exp);
    assert_eq!(starts_and_results(&c.opts, &c.exp, &recs["slow"]), (2, 1), "killed once, then ended");
    eprintln!("FIGURES: task of 3 killed midway and resumed: {:.1} s", t0.elapsed().as_secs_f64());
}

#[test]
fn cluster_tasks_a_task_cancelled_midway_keeps_what_ended_and_retries_the_rest_when_asked() {
    let Some(env) = cluster(Use::Shared) else { return };
    let t0 = Instant::now();
    let c = case(&env, "ck-cancel");
    submit_and_stop(&c, Stop::Cancel);
    let recs = records(&c.opts, &c.exp);
    for name in ["first", "slow", "last"] {
        let state = recs[name].attempts().last().and_then(|a| a.state().cloned());
        assert_eq!(state.as_ref().map(|s| s.name()), Some("CANCELLED"), "{name}");
    }
    assert_eq!(result_of(&recs["first"]), Some("ok"), "the ended config keeps its result");
    assert_eq!(result_of(&recs["slow"]), Some("cancelled"), "SIGTERM: the running config says so");
    assert_eq!(
        (recs["last"].attempts()[0].worker().word(), result_of(&recs["last"])),
        (None, None),
        "no events at all"
    );
    // `cancel` stopped them: `resume` says so, and sends them only when asked.
    let rep = rt().block_on(submit::submit(&c.sweep, &c.opts, true)).expect("resume");
    let mut stopped = rep.cancelled_by_cancel.clone();
    stopped.sort();
    assert_eq!((stopped, rep.submitted.is_empty()), (vec!["last".to_string(), "slow".into()], true), "{rep:?}");
    let retry = orchestrator::slurm::RetryPolicy { cancelled_by_cancel: true, ..c.opts.retry };
    let c = Case { opts: Options { retry, ..c.opts.clone() }, ..c };
    resume_retries_the_rest_once(&env, &c);
    let recs = records(&c.opts, &c.exp);
    assert_eq!(starts_and_results(&c.opts, &c.exp, &recs["slow"]), (2, 2), "cancelled once, then ended");
    eprintln!("FIGURES: task of 3 cancelled midway and resumed: {:.1} s", t0.elapsed().as_secs_f64());
}

/// `slow`'s training steps: long enough on the test cluster's CPU (a debug
/// worker) to be seen running and killed, short enough to end when retried.
const SLOW_STEPS: u32 = 2500;
