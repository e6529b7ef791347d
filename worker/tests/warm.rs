//! `worker warm` on the CPU backend: every family in fp32 and bf16-amp through
//! `worker run` with the kernel cache, one line each, the events in a scratch
//! state directory, never a sweep's.

use std::path::Path;
use std::process::{Command, Output};

use facts::event::{CacheState, Event, RunStatus};

fn warm(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_worker")).current_dir(cwd).arg("warm").args(args).output().expect("worker runs")
}

/// Every run's events under `state/warm/runs/`: (start's cache state, result status) by config name.
fn runs(state: &Path) -> Vec<(String, Option<CacheState>, RunStatus)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(state.join("warm/runs")).expect("runs dir") {
        let text = std::fs::read_to_string(e.unwrap().path().join("events.jsonl")).expect("events");
        let events: Vec<Event> = text.lines().map(|l| serde_json::from_str(l).expect("an event")).collect();
        let Some(Event::Start { config, env, .. }) = events.first() else { panic!("no start: {events:?}") };
        let Some(Event::Result { status, .. }) = events.last() else { panic!("no result: {events:?}") };
        out.push((config.clone(), env.kernel_cache, *status));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn warm_runs_each_family_in_fp32_and_bf16_amp_with_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, state) = (dir.path().join("cache/node1"), dir.path().join("scratch"));
    let args = ["--backend", "flex", "--cache-dir", cache.to_str().unwrap(), "--state-dir", state.to_str().unwrap()];
    let out = warm(dir.path(), &args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    let mut names = Vec::new();
    for family in ["unet", "dit", "hdit", "uvit"] {
        for precision in ["fp32", "bf16-amp"] {
            let name = format!("{family}-{precision}");
            let line = lines.iter().find(|l| l.starts_with(&format!("warm {name}: "))).expect(&name);
            let secs = line.strip_prefix(&format!("warm {name}: ok in ")).and_then(|r| r.strip_suffix(" s"));
            assert!(secs.is_some_and(|s| s.parse::<f64>().is_ok_and(|s| s >= 0.0)), "{line}");
            names.push(name);
        }
    }
    assert_eq!(lines.len(), 9, "one line a config and the total: {stdout}");
    assert!(lines[8].starts_with("warm: 8 of 8 configs ok, kernel cache "), "{stdout}");
    // The runs went through `worker run --cache-dir`: the first found it fresh, the rest reused it.
    let runs = runs(&state);
    names.sort();
    assert_eq!(runs.iter().map(|r| r.0.clone()).collect::<Vec<_>>(), names);
    assert!(runs.iter().all(|r| r.2 == RunStatus::Ok), "{runs:?}");
    let fresh = runs.iter().filter(|r| r.1 == Some(CacheState::Fresh)).count();
    let reused = runs.iter().filter(|r| r.1 == Some(CacheState::Reused)).count();
    assert_eq!((fresh, reused), (1, 7), "{runs:?}");
    let stamped: Vec<_> = std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().path().join("stamp.json")).collect();
    assert!(stamped.len() == 1 && stamped[0].is_file(), "{stamped:?}");
}

#[test]
fn warm_without_a_state_dir_leaves_no_events_behind() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let out = warm(dir.path(), &["--backend", "flex", "--precision", "fp32", "--cache-dir", cache.to_str().unwrap()]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert_eq!(stdout.lines().filter(|l| l.contains(": ok in ")).count(), 4, "{stdout}");
    let scratch = stderr.lines().find_map(|l| l.split_once("events in ").map(|(_, p)| p.trim())).expect(&stderr);
    assert!(scratch.contains("worker-warm-") && !Path::new(scratch).exists(), "the temp dir is gone: {scratch}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, [std::ffi::OsString::from("cache")], "nothing but the cache where it ran (no ./state)");
}

#[test]
fn warm_refuses_an_unknown_precision() {
    let dir = tempfile::tempdir().unwrap();
    let out = warm(dir.path(), &["--cache-dir", "c", "--precision", "fp8"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown precision `fp8`"));
}
