//! Interrupted anywhere, on the built-in clusters (`local` and `replay`),
//! through the real `orchestrator` binary (issue 41):
//!
//! - `submit` killed (SIGKILL) at every failpoint of the submission protocol
//!   and of the built-in clusters' own `sbatch`, then `resume`;
//! - `submit` of a sweep of a few hundred configs sent SIGINT or SIGTERM at
//!   many moments (times from its start, and the moments its intent, its job
//!   and its first run appear), then `resume`;
//!
//! each ends with every config run exactly once (a `start` in its run
//! directory on `replay`, a line of the fake worker's log on `local`) and
//! every submission settled: 0 lost, 0 duplicates. A cluster that denies a
//! job its tasks ran leaves the configs unsettled and says so. And Ctrl-C
//! stops `submit --active` in every phase of a round: exit 130, no new round.
//! (The same submission tests on the real SLURM cluster: `cluster_crash.rs`.)

mod common;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use orchestrator::util::failpoint::{BUILTIN_SBATCH, SUBMIT_PROTOCOL};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Local,
    Replay,
}

impl Kind {
    fn cluster(self) -> &'static str {
        match self {
            Kind::Local => "laptop",
            Kind::Replay => "rp",
        }
    }
}

/// A fake worker for the `local` cluster: answers the login node's checks,
/// and as a job logs `<job name> <task id>` (one line per task run), then sleeps.
fn fake_worker(sleep: f64) -> String {
    format!(
        "#!/bin/sh\ncase \"$1\" in --version) echo 'worker 0.1.0'; exit 0;; backends) echo flex; exit 0;; esac\n\
         printf '%s %s\\n' \"$SLURM_JOB_NAME\" \"$SLURM_ARRAY_TASK_ID\" >> \"$(dirname \"$0\")/ran.log\"\nsleep {sleep}\n"
    )
}

/// One test's world: a clusters file (`laptop`: local with the fake worker;
/// `rp`: replay of the group's records), an experiment of `n` tiny configs.
struct World {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    kind: Kind,
    exp: String,
}

impl World {
    fn new(kind: Kind, exp: &str, n: usize, sleep: f64) -> World {
        World::with_tasks_of(kind, exp, n, sleep, 1)
    }

    /// [`World::new`], each array task running `k` configs in turn.
    fn with_tasks_of(kind: Kind, exp: &str, n: usize, sleep: f64, k: u32) -> World {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        let worker = dir.join("worker.sh");
        std::fs::write(&worker, fake_worker(sleep)).expect("fake worker");
        std::fs::set_permissions(&worker, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let records = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/vram-measurements.jsonl");
        let clusters = format!(
            "clusters:\n  laptop: {{transport: local, worker: {}, max_parallel: 8}}\n  rp: {{transport: replay, records: {}}}\n",
            worker.display(),
            records.display()
        );
        std::fs::write(dir.join("clusters.yaml"), clusters).expect("clusters file");
        let batches: Vec<String> = (1..=n).map(|b| b.to_string()).collect();
        let experiment = format!(
            "name: {exp}\ndescription: interrupt test\ncluster: {}\ngpu: A100-40GB\nprecision: fp32\nruntime: burn-flex\n\
             worker: {{backend: flex, configs_per_task: {k}}}\ninput: {{channels: 1, spatial: [16, 16, 16]}}\noutput_channels: 1\n\
             model: {{family: unet, channels: [32, 64], attention_levels: [false, false], num_res_blocks: 1, num_head_channels: 32}}\n\
             sweep:\n  name: \"b{{batch}}\"\n  grid:\n    batch: [{}]\n",
            kind.cluster(),
            batches.join(", ")
        );
        std::fs::write(dir.join(format!("{exp}.yaml")), experiment).expect("experiment file");
        World { _tmp: tmp, dir, kind, exp: exp.to_string() }
    }

    fn state(&self) -> PathBuf {
        self.dir.join("state")
    }

    fn file(&self) -> String {
        format!("{}.yaml", self.exp)
    }

    /// The orchestrator binary running `args` in this world.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_orchestrator"));
        c.args(args).args(["--state-dir", "state", "--clusters", "clusters.yaml", "--result-grace", "0"]);
        c.current_dir(&self.dir).stdin(Stdio::null());
        c
    }

    fn submit(&self) -> Command {
        self.cmd(&["submit", &self.file(), "--force"])
    }

    fn run(&self, args: &[&str]) -> Result<String, String> {
        let out = self.cmd(args).output().map_err(|e| e.to_string())?;
        match out.status.success() {
            true => Ok(common::text(&out)),
            false => Err(format!("{args:?} failed ({:?}):\n{}", out.status, common::text(&out))),
        }
    }

    /// How many times each config ran, by name: `start`s in its run
    /// directory (`replay`), or the fake worker's lines of the tasks that ran
    /// it (`local`: task → config through the stored submissions; a job no
    /// submission lists is a lost submission, an error).
    fn runs_per_config(&self) -> Result<BTreeMap<String, usize>, String> {
        let sweep = orchestrator::sweep::load(&self.dir.join(self.file()), &[]).map_err(|e| e.to_string())?;
        let name: BTreeMap<&str, &str> = sweep.configs.iter().map(|c| (c.hash.as_str(), c.name.as_str())).collect();
        let mut count: BTreeMap<String, usize> = BTreeMap::new();
        if self.kind == Kind::Replay {
            for c in &sweep.configs {
                let events = self.state().join(&self.exp).join(c.config.events_rel());
                let text = std::fs::read_to_string(events).unwrap_or_default();
                let n = text.lines().filter(|l| l.contains("\"event\":\"start\"")).count();
                if n > 0 {
                    count.insert(c.name.clone(), n);
                }
            }
            return Ok(count);
        }
        let subs = common::submissions(&self.state(), &self.exp);
        let ran = std::fs::read_to_string(self.dir.join("ran.log")).unwrap_or_default();
        for line in ran.lines() {
            let (job, task) = line.split_once(' ').ok_or(format!("ran.log: `{line}`"))?;
            let task: u32 = task.parse().map_err(|_| format!("ran.log: `{line}`"))?;
            let sub =
                subs.iter().find(|s| s.job_name == job).ok_or(format!("job {job} ran; no submission lists it"))?;
            for hash in sub.configs_of(task) {
                *count.entry(name.get(hash.as_str()).unwrap_or(&"?").to_string()).or_default() += 1;
            }
        }
        Ok(count)
    }

    /// After `resume`: every config ran exactly once and every submission is
    /// settled. (Not that the journal replays to the state: a kill between
    /// `submission.json` and its journal line leaves the journal, which is
    /// not fsynced and not the record, a line short.)
    fn check(&self, n: usize) -> Result<(), String> {
        let watch = ["status", &self.exp, "--watch", "--interval", "0.2", "--max-interval", "0.5"];
        self.run(&watch)?;
        let open: Vec<String> = common::submissions(&self.state(), &self.exp)
            .into_iter()
            .filter(|s| s.state().is_open())
            .map(|s| format!("{} ({})", s.id, s.state().name()))
            .collect();
        if !open.is_empty() {
            return Err(format!("submissions left unsettled: {open:?}"));
        }
        let per = self.runs_per_config()?;
        let wrong: BTreeMap<&String, &usize> = per.iter().filter(|(_, &k)| k != 1).collect();
        if per.len() != n || !wrong.is_empty() {
            return Err(format!("{} of {n} configs ran; ran more than once: {wrong:?}", per.len()));
        }
        Ok(())
    }
}

/// `f` over `items`, `width` at a time, each on its own thread (the tests
/// mostly wait: on a resume's confirmation, on jobs); a panic is an error.
fn in_parallel<T: Send, R: Send>(
    items: Vec<T>,
    width: usize,
    f: impl Fn(usize, T) -> Result<R, String> + Sync,
) -> Vec<Result<R, String>> {
    let mut out = Vec::new();
    let mut items: Vec<(usize, T)> = items.into_iter().enumerate().collect();
    while !items.is_empty() {
        let batch: Vec<(usize, T)> = items.drain(..width.min(items.len())).collect();
        std::thread::scope(|s| {
            let f = &f;
            let runs: Vec<_> = batch.into_iter().map(|(i, t)| s.spawn(move || f(i, t))).collect();
            out.extend(runs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("panicked".into()))));
        });
    }
    out
}

#[test]
fn a_crash_at_every_failpoint_then_resume_loses_nothing_and_duplicates_nothing_on_local_and_replay() {
    let cases: Vec<(Kind, &str)> = [Kind::Local, Kind::Replay]
        .into_iter()
        .flat_map(|k| {
            let own = BUILTIN_SBATCH
                .iter()
                .filter(move |f| f.starts_with(if k == Kind::Local { "local:" } else { "replay:" }));
            SUBMIT_PROTOCOL.iter().chain(own).map(move |fp| (k, *fp))
        })
        .collect();
    assert_eq!(cases.len(), 2 * SUBMIT_PROTOCOL.len() + BUILTIN_SBATCH.len());
    let outcomes = in_parallel(cases.clone(), 8, |i, (kind, fp)| {
        let w = World::new(kind, &format!("fp{i}"), 3, 0.0);
        let out = w.submit().env("ORCHESTRATOR_FAILPOINT", fp).output().map_err(|e| e.to_string())?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.signal() != Some(9) || !stderr.contains(&format!("failpoint {fp}: dying by SIGKILL")) {
            return Err(format!("submit was not killed at the failpoint: {:?}\n{stderr}", out.status));
        }
        w.run(&["resume", &w.file(), "--force"])?;
        w.check(3)
    });
    report(cases.iter().map(|(k, fp)| format!("{k:?} {fp}")), outcomes, "0 lost, 0 duplicates");
}

/// Each outcome (`ok` when it went right), then a failure for any that went wrong.
fn report<T>(names: impl Iterator<Item = String>, outcomes: Vec<Result<T, String>>, ok: &str) {
    let mut failed = vec![];
    for (name, o) in names.zip(&outcomes) {
        eprintln!("{name:<40} {}", o.as_ref().map_or_else(|e| e.clone(), |_| ok.to_string()));
        if let Err(e) = o {
            failed.push(format!("{name}: {e}"));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// When a signal is sent: a share of an uninterrupted submit's time after
/// the start, or a few milliseconds after something appears on disk.
#[derive(Debug, Clone, Copy)]
enum At {
    Share(f64),
    Intent(u64),
    Job(u64),
    Run(u64),
}

impl World {
    /// Whether what `at` waits for is on disk.
    fn reached(&self, at: At) -> bool {
        let any = |dir: PathBuf, f: &dyn Fn(&Path) -> bool| {
            std::fs::read_dir(dir).into_iter().flatten().filter_map(|e| e.ok()).any(|e| f(&e.path()))
        };
        let state = self.state();
        match (at, self.kind) {
            (At::Share(_), _) => true,
            (At::Intent(_), _) => {
                any(state.join(&self.exp).join("submissions"), &|p| p.join("submission.json").exists())
            }
            (At::Job(_), Kind::Replay) => {
                any(state.join(".replay-jobs"), &|p| p.extension().is_some_and(|x| x == "json"))
            }
            (At::Job(_), Kind::Local) => any(state.join(".local-jobs"), &|p| p.join("job.json").exists()),
            (At::Run(_), Kind::Replay) => any(state.join(&self.exp).join("runs"), &|_| true),
            (At::Run(_), Kind::Local) => self.dir.join("ran.log").exists(),
        }
    }
}

/// `submit` sent `signal` at `at` (`whole`: an uninterrupted submit's
/// seconds), then `resume`; whether the signal ended it.
fn interrupt_and_resume(w: &World, n: usize, at: At, signal: i32, whole: f64) -> Result<bool, String> {
    let mut child = w.submit().stdout(Stdio::null()).stderr(Stdio::piped()).spawn().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let (wait, after) = match at {
        At::Share(s) => (Duration::from_secs_f64(whole * s), 0),
        At::Intent(ms) | At::Job(ms) | At::Run(ms) => (Duration::ZERO, ms),
    };
    let mut exited = None;
    while exited.is_none() && (t0.elapsed() < wait || !w.reached(at)) {
        exited = child.try_wait().map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_millis(1));
    }
    if exited.is_none() {
        std::thread::sleep(Duration::from_millis(after));
        // SAFETY: a plain kill(2) of our own child, not yet reaped.
        unsafe { libc::kill(child.id() as i32, signal) };
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let interrupted = out.status.signal() == Some(signal);
    if !interrupted && !out.status.success() {
        return Err(format!("submit failed ({:?}): {}", out.status, String::from_utf8_lossy(&out.stderr)));
    }
    w.run(&["resume", &w.file(), "--force"])?;
    w.check(n)?;
    Ok(interrupted)
}

#[test]
fn sigint_and_sigterm_at_any_moment_of_a_large_submit_lose_nothing_and_duplicate_nothing() {
    const N: usize = 240;
    let moments = [
        At::Share(0.3),
        At::Share(0.6),
        At::Share(0.85),
        At::Intent(0),
        At::Intent(30),
        At::Job(0),
        At::Run(0),
        At::Run(15),
    ];
    for kind in [Kind::Local, Kind::Replay] {
        // On `local`, 8 configs a task: a few hundred configs, not as many processes.
        let world = |exp: &str| World::with_tasks_of(kind, exp, N, 0.0, if kind == Kind::Local { 8 } else { 1 });
        // An uninterrupted submit, timed: the shares are of it.
        let w = world("whole");
        let t0 = Instant::now();
        w.run(&["submit", &w.file(), "--force"]).expect("an uninterrupted submit");
        let whole = t0.elapsed().as_secs_f64();
        w.check(N).expect("an uninterrupted submit runs every config once");
        let cases: Vec<(At, i32)> = moments
            .iter()
            .enumerate()
            .map(|(i, &at)| (at, if i % 2 == 0 { libc::SIGINT } else { libc::SIGTERM }))
            .collect();
        let outcomes = in_parallel(cases.clone(), 8, |i, (at, signal)| {
            interrupt_and_resume(&world(&format!("sig{i}")), N, at, signal, whole)
        });
        let hit = outcomes.iter().filter(|o| matches!(o, Ok(true))).count();
        let names = cases
            .iter()
            .map(|(at, s)| format!("{kind:?} {} at {at:?}", if *s == libc::SIGINT { "SIGINT" } else { "SIGTERM" }));
        report(names, outcomes, "0 lost, 0 duplicates");
        assert!(hit * 2 >= moments.len(), "{kind:?}: only {hit} of {} signals came before submit ended", moments.len());
    }
}

#[test]
fn a_cluster_that_denies_a_job_its_tasks_ran_leaves_the_configs_unsettled_and_says_so() {
    let w = World::new(Kind::Replay, "denied", 3, 0.0);
    let out = w.submit().env("ORCHESTRATOR_FAILPOINT", "sbatch:answered").output().expect("submit runs");
    assert_eq!(out.status.signal(), Some(9), "{}", common::text(&out));
    // The cluster forgets the job its tasks ran (as a cluster whose sbatch is
    // not all or nothing, or whose accounting lost it, would answer).
    for e in std::fs::read_dir(w.state().join(".replay-jobs")).expect("jobs").filter_map(|e| e.ok()) {
        if e.path().extension().is_some_and(|x| x == "json") {
            std::fs::remove_file(e.path()).expect("forget the job");
        }
    }
    let said = w.run(&["resume", &w.file(), "--force"]).expect("resume");
    assert!(said.contains("unresolved submission s001-"), "{said}");
    assert!(said.contains("the cluster lists no job of its name, but "), "{said}");
    assert!(said.contains("holds a run of config b"), "{said}");
    assert!(!said.contains("never got it"), "{said}");
    assert!(said.contains("submitted 0 configs"), "{said}");
    let per = w.runs_per_config().expect("runs");
    assert!(per.len() == 3 && per.values().all(|&k| k == 1), "{per:?}");
    let subs = common::submissions(&w.state(), &w.exp);
    assert!(subs.len() == 1 && subs[0].state().is_open(), "the submission stays unsettled: {subs:?}");
}

/// `submit --active` on the local cluster (rounds of 2 of 20 configs, each
/// task 5 s): its output, once it ended (or was killed after `limit`).
fn active(w: &World, env: &[(&str, &str)], limit: Duration) -> Output {
    let mut c = w.cmd(&["submit", &w.file(), "--active", "--poll-interval", "0.2"]);
    let child = c.envs(env.iter().copied()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let out = wait_at_most(child, limit);
    let _ = w.run(&["cancel", &w.exp]);
    out
}

/// The child's output once it ended, killed (SIGKILL) after `limit`.
fn wait_at_most(child: std::process::Child, limit: Duration) -> Output {
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    rx.recv_timeout(limit).map(|o| o.expect("output")).unwrap_or_else(|_| {
        // SAFETY: a plain kill(2) of our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        panic!("still running after {limit:?}: Ctrl-C did not stop it")
    })
}

/// The rounds the journal recorded, and the submissions, all settled.
fn rounds_and_submissions(w: &World) -> (usize, usize) {
    let view = orchestrator::state::View::new(&w.state(), &w.exp).expect("state");
    let rounds = view
        .journal()
        .unwrap_or_default()
        .iter()
        .filter(|l| matches!(l.change, orchestrator::state::Change::ActiveRound { .. }))
        .count();
    let subs = view.submissions().unwrap_or_default();
    assert!(subs.iter().all(|s| s.state().is_final()), "{subs:?}");
    (rounds, subs.len())
}

#[test]
fn ctrl_c_in_every_phase_of_an_active_round_stops_the_loop_with_exit_130_and_no_new_round() {
    // Each phase's first Ctrl-C, sent at the step by the debug build's signal points.
    let phases = [("active:choosing", 0), ("active:submitting", 1), ("watch:polling", 1), ("watch:waiting", 1)];
    let outcomes = in_parallel(phases.to_vec(), 4, |i, (phase, rounds)| {
        let w = World::new(Kind::Local, &format!("act{i}"), 20, 5.0);
        let out = active(&w, &[("ORCHESTRATOR_SIGNAL_AT", phase)], Duration::from_secs(60));
        let text = common::text(&out);
        if out.status.code() != Some(130) || text.contains("round 2:") {
            return Err(format!("{:?}, a second round or none stopped:\n{text}", out.status));
        }
        // Each command as printed, with the clusters file named (absolute: it runs from anywhere).
        let clusters = format!("--clusters {}", w.dir.join("clusters.yaml").display());
        let said = match rounds {
            0 => "interrupted: no round is chosen; nothing is running.".to_string(),
            _ => format!(
                "interrupted after round 1: no new round is chosen; still running: 2 configs (b19, b20); \
                 `orchestrator status {0} --watch {clusters}` follows them, `orchestrator cancel {0} {clusters}` stops them.",
                w.exp
            ),
        };
        let goes_on =
            format!("`orchestrator submit {}.yaml --active {clusters}` goes on", w.dir.join(&w.exp).display());
        if !text.contains(&said) || !text.contains(&goes_on) {
            return Err(format!("does not say `{said}`:\n{text}"));
        }
        if rounds_and_submissions(&w) != (rounds, rounds) {
            return Err(format!("rounds and submissions {:?}, not {rounds} each:\n{text}", rounds_and_submissions(&w)));
        }
        if rounds > 0 {
            common::assert_journal_replays(&w.state(), &w.exp);
        }
        Ok(())
    });
    report(phases.iter().map(|(p, _)| p.to_string()), outcomes, "exit 130, no new round");
}

#[test]
fn a_second_ctrl_c_leaves_at_once() {
    let w = World::new(Kind::Local, "twice", 20, 5.0);
    let env = [("ORCHESTRATOR_SIGNAL_AT", "active:submitting"), ("ORCHESTRATOR_SIGNALS", "2")];
    let out = active(&w, &env, Duration::from_secs(60));
    let text = common::text(&out);
    assert_eq!(out.status.code(), Some(130), "{text}");
    assert!(text.contains("Ctrl-C again: leaving at once"), "{text}");
    // Gone before the round's submission and before any summary.
    assert!(!text.contains("interrupted"), "{text}");
    assert_eq!(rounds_and_submissions(&w), (1, 0), "{text}");
}

#[test]
fn ctrl_c_while_a_round_runs_stops_the_loop_and_says_what_still_runs() {
    let w = World::new(Kind::Local, "running", 20, 5.0);
    let mut child = w
        .cmd(&["submit", &w.file(), "--active", "--poll-interval", "0.2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Its output read to the end (a closed pipe would end it otherwise), each line told.
    let stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || stdout.lines().map_while(Result::ok).try_for_each(|l| tx.send(l)));
    let mut seen = String::new();
    while !seen.contains("round 1:") {
        let line = lines.recv_timeout(Duration::from_secs(30)).expect("round 1 begins");
        seen += &format!("{line}\n");
    }
    // The round's tasks run (5 s each): the loop waits on them.
    std::thread::sleep(Duration::from_secs(1));
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let t0 = Instant::now();
    let out = wait_at_most(child, Duration::from_secs(30));
    let rest: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let text = format!("{seen}{rest}{}", common::text(&out));
    assert_eq!(out.status.code(), Some(130), "{text}");
    assert!(t0.elapsed() < Duration::from_secs(4), "stopped only after {:?}:\n{text}", t0.elapsed());
    assert!(!text.contains("round 2:"), "{text}");
    assert!(text.contains("interrupted after round 1: no new round is chosen; still running: 2 configs"), "{text}");
    assert_eq!(rounds_and_submissions(&w), (1, 1), "{text}");
    let status = w.run(&["status", &w.exp]).expect("status");
    assert!(status.contains("RUNNING"), "the round's jobs still run:\n{status}");
    w.run(&["cancel", &w.exp]).expect("cancel");
}

#[test]
fn status_watch_stops_at_ctrl_c_in_a_poll_and_a_second_leaves_at_once() {
    let w = World::new(Kind::Local, "watched", 2, 5.0);
    w.run(&["submit", &w.file(), "--force"]).expect("submit");
    let watch = |signals: &str| {
        let mut c = w.cmd(&["status", &w.exp, "--watch", "--interval", "0.2"]);
        c.envs([("ORCHESTRATOR_SIGNAL_AT", "watch:polling"), ("ORCHESTRATOR_SIGNALS", signals)]);
        let child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("status --watch");
        let out = wait_at_most(child, Duration::from_secs(30));
        (out.status.code(), common::text(&out))
    };
    // Pressed during a poll: the poll is applied, then the watch ends.
    let (code, once) = watch("1");
    assert_eq!(code, Some(130), "{once}");
    assert!(once.contains("stopped watching; the sweep goes on"), "{once}");
    // Pressed twice: gone at once, saying so.
    let (code, twice) = watch("2");
    assert_eq!(code, Some(130), "{twice}");
    assert!(twice.contains("Ctrl-C again: leaving at once"), "{twice}");
    assert!(!twice.contains("stopped watching"), "{twice}");
    w.run(&["cancel", &w.exp]).expect("cancel");
}
