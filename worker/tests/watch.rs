//! `worker watch` end to end: the worker binary runs a small bash script as
//! the user's command, and what it writes to `events.jsonl` is what the
//! orchestrator reads of a profiling run: start, heartbeats, result.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use facts::event::{Event, MemoryMeter, RunResult, RunStatus};
use facts::RunConfig;

mod common;
use common::tiny_unet;

/// `worker watch --config <cfg> --state-dir <dir> … -- bash -c SCRIPT`, started.
fn start_watch(dir: &Path, cfg: &RunConfig, script: &str) -> Child {
    let config = dir.join(format!("{}.json", cfg.name));
    std::fs::write(&config, serde_json::to_string(cfg).unwrap()).unwrap();
    Command::new(env!("CARGO_BIN_EXE_worker"))
        .args(["watch", "--meter", "rss", "--heartbeat-s", "0.2", "--sample-s", "0.05", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(dir)
        .args(["--", "bash", "-c", script])
        .env("WATCH_DIR", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn events(dir: &Path, cfg: &RunConfig) -> Vec<Event> {
    let text = std::fs::read_to_string(dir.join(&cfg.experiment).join(cfg.events_rel())).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).expect("an event")).collect()
}

/// Run the script to its end: the worker's output and the run's events.
fn watch(dir: &Path, cfg: &RunConfig, script: &str) -> (Output, Vec<Event>) {
    let out = start_watch(dir, cfg, script).wait_with_output().unwrap();
    (out, events(dir, cfg))
}

fn result(events: &[Event]) -> RunResult {
    RunResult::try_from(events.last().cloned().expect("events")).expect("the last event is the result")
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill has no memory preconditions.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

#[test]
fn a_command_that_exits_0_is_ok_with_its_process_trees_resident_peak() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_unet("ok");
    // A subshell (a process below the command) holds a 48 MB string for a second.
    let script = r#"( x=$(head -c 48000000 /dev/zero | tr '\0' a); sleep 1; echo "${#x}" ); echo trained"#;
    let (out, ev) = watch(dir.path(), &cfg, script);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "48000000\ntrained\n", "the output passes through");
    match &ev[0] {
        Event::Start { config, config_hash, env, .. } => {
            assert_eq!(config, "ok");
            assert_eq!(config_hash, &cfg.hash());
            assert_eq!(env.backend, "command");
            assert_eq!(env.device, "cpu");
            assert_eq!(env.meter, Some(MemoryMeter::ProcessTreeRss));
        }
        other => panic!("the first event is not start: {other:?}"),
    }
    let beats: Vec<u64> = ev
        .iter()
        .filter_map(|e| if let Event::Heartbeat { peak_bytes, .. } = e { Some(*peak_bytes) } else { None })
        .collect();
    assert!(beats.len() >= 2, "a heartbeat every 0.2 s over a second: {ev:?}");
    let r = result(&ev);
    assert_eq!(r.status, RunStatus::Ok);
    assert_eq!(r.message, None);
    assert!(r.peak_bytes >= 48_000_000, "the subshell's string is resident: peak {}", r.peak_bytes);
    assert!(r.peak_bytes < 1 << 30, "peak {}", r.peak_bytes);
    assert_eq!(r.peaks.step, Some(r.peak_bytes));
    assert!(r.wall_s >= 1.0, "{}", r.wall_s);
}

#[test]
fn a_nonzero_exit_is_failed_with_the_code_and_the_last_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_unet("fails");
    let (out, ev) = watch(dir.path(), &cfg, "echo 'ValueError: bad config' >&2; exit 7");
    assert_eq!(out.status.code(), Some(7), "the worker exits with the command's code");
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().next(), Some("ValueError: bad config"));
    let r = result(&ev);
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.message.as_deref(), Some("exit code 7; its last line: ValueError: bad config"));
}

#[test]
fn cuda_out_of_memory_in_stderr_is_an_oom() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_unet("oom");
    let script = "echo 'epoch 315 step 2' ; \
        echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.25 GiB' >&2; \
        echo 'more traceback' >&2; exit 1";
    let (out, ev) = watch(dir.path(), &cfg, script);
    assert_eq!(out.status.code(), Some(3), "the profiling run's OOM exit code");
    let r = result(&ev);
    assert_eq!(r.status, RunStatus::Oom);
    let message = r.message.unwrap();
    assert!(message.contains("CUDA out of memory. Tried to allocate 2.00 GiB"), "{message}");
}

#[test]
fn sigusr1_is_forwarded_and_the_command_saves_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_unet("usr1");
    // As the group's train.py: on SIGUSR1 save a checkpoint and exit 0.
    let script = r#"trap 'echo saved > "$WATCH_DIR/checkpoint_latest"; exit 0' USR1
        touch "$WATCH_DIR/ready"; while :; do sleep 0.05; done"#;
    let child = start_watch(dir.path(), &cfg, script);
    wait_for(&dir.path().join("ready"));
    signal(&child, libc::SIGUSR1);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let marker: PathBuf = dir.path().join("checkpoint_latest");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "saved\n", "the command's trap ran");
    let r = result(&events(dir.path(), &cfg));
    assert_eq!(r.status, RunStatus::Ok);
    assert_eq!(r.message.as_deref(), Some("exited 0 after the worker forwarded SIGUSR1"));
}

#[test]
fn sigterm_is_forwarded_and_the_run_is_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_unet("term");
    let child = start_watch(dir.path(), &cfg, r#"touch "$WATCH_DIR/ready"; while :; do sleep 0.05; done"#);
    wait_for(&dir.path().join("ready"));
    signal(&child, libc::SIGTERM);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143));
    let r = result(&events(dir.path(), &cfg));
    assert_eq!(r.status, RunStatus::Cancelled);
    assert_eq!(r.message.as_deref(), Some("killed by SIGTERM after the worker forwarded SIGTERM"));
}
