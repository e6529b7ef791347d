//! `worker watch --chain-max …` end to end, without SLURM: the worker runs its
//! own scripted trainer (`worker demo-trainer`) as the command, SIGUSR1 comes
//! as SLURM's `--signal=B:USR1@…` would, and the events say what the
//! orchestrator reads of each segment. Where SLURM is absent (no
//! SLURM_JOB_ID) or `scontrol` refuses, the segment is left for `resume`;
//! where `scontrol` takes it, the job is requeued. The real cluster runs the
//! same in orchestrator/tests/cluster_chain.rs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use facts::chain::SegmentNext;
use facts::event::{Event, RunResult, RunStatus};
use facts::RunConfig;

mod common;
use common::tiny_unet;

fn run_dir(dir: &Path, cfg: &RunConfig) -> PathBuf {
    dir.join(&cfg.experiment).join(cfg.events_rel()).parent().unwrap().to_path_buf()
}

/// `worker watch --chain-max MAX … -- worker demo-trainer --steps STEPS`, started.
fn segment(dir: &Path, cfg: &RunConfig, max: u32, steps: u32, env: &[(&str, &str)]) -> Child {
    let config = dir.join(format!("{}.json", cfg.name));
    std::fs::write(&config, serde_json::to_string(cfg).unwrap()).unwrap();
    let checkpoint = run_dir(dir, cfg).join("checkpoint.txt");
    let mut c = Command::new(env!("CARGO_BIN_EXE_worker"));
    c.args(["watch", "--meter", "rss", "--heartbeat-s", "0.1", "--sample-s", "0.02", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(dir)
        .args(["--chain-max", &max.to_string(), "--checkpoint", "checkpoint.txt", "--marker", ".training_complete"])
        .arg("--resume-arg")
        .arg(format!("--resume={}", checkpoint.display()))
        .args(["--progress", r"step [0-9]+/[0-9]+", "--"])
        .arg(env!("CARGO_BIN_EXE_worker"))
        .args([
            "demo-trainer",
            "--steps",
            &steps.to_string(),
            "--step-s",
            "0.05",
            "--save-every",
            "4",
            "--hold-mb",
            "8",
        ])
        .env_remove("SLURM_JOB_ID")
        .env_remove("SLURM_ARRAY_JOB_ID")
        .env_remove("SLURM_ARRAY_TASK_ID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

fn events(dir: &Path, cfg: &RunConfig) -> Vec<Event> {
    let text = std::fs::read_to_string(dir.join(&cfg.experiment).join(cfg.events_rel())).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).expect("an event")).collect()
}

/// Waits until the trainer logged `n` steps in this segment's run directory.
fn wait_steps(run_dir: &Path, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let steps = std::fs::read_to_string(run_dir.join("steps.log")).unwrap_or_default();
        if steps.lines().count() >= n {
            return;
        }
        assert!(Instant::now() < deadline, "the trainer never reached {n} steps");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn usr1(child: &Child) {
    // SAFETY: kill has no memory preconditions.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) }, 0);
}

fn stderr_of(child: Child) -> (Option<i32>, String) {
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_signalled_segment_saves_and_the_next_resumes_from_its_checkpoint_to_completion() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_unet("chain");
    let rd = run_dir(dir.path(), &cfg);
    let first = segment(dir.path(), &cfg, 5, 30, &[]);
    wait_steps(&rd, 6);
    usr1(&first);
    let (code, err) = stderr_of(first);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("not requeued: not a SLURM job"), "{err}");
    let ev = events(dir.path(), &cfg);
    let ends: Vec<_> = ev.iter().filter_map(|e| if let Event::Segment(s) = e { Some(s) } else { None }).collect();
    assert_eq!(ends.len(), 2, "the end before the requeue, then why it did not happen: {ev:?}");
    assert_eq!((ends[0].segment, ends[0].max_segments, ends[0].checkpoint), (1, 5, true));
    assert_eq!(ends[0].next, SegmentNext::Requeue, "recorded before it is asked");
    assert!(matches!(&ends[1].next, SegmentNext::Resume { reason } if reason.contains("SLURM_JOB_ID")));
    assert!(ends[0].progress.as_deref().is_some_and(|p| p.starts_with("step ") && p.ends_with("/30")), "{ends:?}");
    assert!(!ev.iter().any(|e| matches!(e, Event::Result { .. })), "a segment that goes on writes no result");
    let saved: u32 = std::fs::read_to_string(rd.join("checkpoint.txt")).unwrap().trim().parse().unwrap();
    assert!(saved >= 6, "saved at the signal: step {saved}");

    let second = segment(dir.path(), &cfg, 5, 30, &[]);
    let (code, err) = stderr_of(second);
    assert_eq!(code, Some(0), "{err}");
    let segments = std::fs::read_to_string(rd.join("segments.log")).unwrap();
    let began: Vec<&str> = segments.lines().collect();
    assert_eq!(began.len(), 2);
    assert!(began[0].starts_with("began at step 1 "), "{segments}");
    assert!(began[1].starts_with(&format!("began at step {} ", saved + 1)), "resumed, not from scratch: {segments}");
    let ev = events(dir.path(), &cfg);
    let starts: Vec<_> =
        ev.iter().filter_map(|e| if let Event::Start { env, .. } = e { env.chain } else { None }).collect();
    assert_eq!(starts.iter().map(|p| p.segment).collect::<Vec<_>>(), [1, 2]);
    let r = RunResult::try_from(ev.last().cloned().unwrap()).expect("the chain's last event is its result");
    assert_eq!(r.status, RunStatus::Ok);
    assert_eq!(r.message.as_deref(), Some("complete (its marker is there) after segment 2"));
    assert!(r.peak_bytes >= 8 << 20, "the trainer's 8 MiB seen: {}", r.peak_bytes);
    let steps = std::fs::read_to_string(rd.join("steps.log")).unwrap();
    assert_eq!(steps.lines().count(), 30, "each step trained once:\n{steps}");
}

#[test]
fn scontrol_is_asked_to_requeue_this_job_and_a_refusal_is_left_for_resume() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let asked = dir.path().join("asked");
    let fake = format!("#!/bin/sh\necho \"$@\" >> '{}'\n[ \"$REFUSE\" = 1 ] && {{ echo 'Requeue not allowed' >&2; exit 1; }}\nexit 0\n", asked.display());
    std::fs::write(bin.join("scontrol"), fake).unwrap();
    std::process::Command::new("chmod").arg("+x").arg(bin.join("scontrol")).status().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    for (refuse, batch) in [("0", 1), ("1", 2)] {
        // Two configs of their own (a run directory is named by the config's content).
        let mut cfg = tiny_unet("requeue");
        cfg.batch = batch;
        let env = [("PATH", path.as_str()), ("SLURM_JOB_ID", "4242"), ("REFUSE", refuse)];
        let child = segment(dir.path(), &cfg, 5, 30, &env);
        wait_steps(&run_dir(dir.path(), &cfg), 2);
        usr1(&child);
        let (code, err) = stderr_of(child);
        assert_eq!(code, Some(0), "{refuse}: {err}");
        let ends: Vec<_> = events(dir.path(), &cfg)
            .into_iter()
            .filter_map(|e| if let Event::Segment(s) = e { Some(s.next) } else { None })
            .collect();
        match refuse {
            "0" => assert_eq!(ends, [SegmentNext::Requeue]),
            _ => assert!(
                matches!(&ends[..], [SegmentNext::Requeue, SegmentNext::Resume { reason }] if reason.contains("Requeue not allowed")),
                "{ends:?}"
            ),
        }
    }
    assert_eq!(std::fs::read_to_string(&asked).unwrap(), "requeue 4242\nrequeue 4242\n");
}

#[test]
fn the_last_allowed_segment_stops_the_chain_failed_with_its_checkpoint_kept() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_unet("capped");
    let child = segment(dir.path(), &cfg, 1, 30, &[]);
    wait_steps(&run_dir(dir.path(), &cfg), 2);
    usr1(&child);
    let (code, err) = stderr_of(child);
    assert_ne!(code, Some(0), "{err}");
    let ev = events(dir.path(), &cfg);
    let r = RunResult::try_from(ev.last().cloned().unwrap()).expect("a result");
    assert_eq!(r.status, RunStatus::Failed);
    assert!(
        r.message.as_deref().is_some_and(|m| m.contains("max_segments (1)") && m.contains("checkpoint.txt")),
        "{r:?}"
    );
    assert!(!ev.iter().any(|e| matches!(e, Event::Segment(_))));
}
