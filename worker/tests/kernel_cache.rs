//! `worker run --cache-dir`: the kernel cache a run finds is in its `start`
//! event, and a corrupt, foreign or unusable cache is a warning, never a
//! failed run (CPU backend: the cache directory is prepared and checked the
//! same way; CubeCL only reads it on GPU backends).

mod common;

use std::ffi::OsStr;
use std::path::Path;

use common::{run_worker_with, tiny_unet};

use facts::event::{CacheState, Event, RunStatus};

/// Run `name` with `--cache-dir cache`: the cache state of its start event,
/// its result status and the worker's stderr.
fn run(state: &Path, cache: &Path, name: &str) -> (Option<CacheState>, RunStatus, String) {
    let (out, events) = run_worker_with(state, &tiny_unet(name), &[OsStr::new("--cache-dir"), cache.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // The same computation under another name appends to the same run: this run's start is the last.
    let Some(Event::Start { env, .. }) = events.iter().rev().find(|e| matches!(e, Event::Start { .. })) else {
        panic!("{events:?}")
    };
    let Some(Event::Result { status, .. }) = events.last() else { panic!("{events:?}") };
    (env.kernel_cache, *status, stderr)
}

/// The one versioned directory the worker keeps under the cache root.
fn versioned(cache: &Path) -> std::path::PathBuf {
    let dirs: Vec<_> = std::fs::read_dir(cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir() && !p.to_string_lossy().contains(".stale-"))
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs[0].clone()
}

#[test]
fn fresh_then_reused_then_a_corrupt_cache_is_replaced_with_a_warning() {
    let state = tempfile::tempdir().unwrap();
    let cache = state.path().join("cache-node1");
    assert_eq!(run(state.path(), &cache, "first").0, Some(CacheState::Fresh));
    let (found, status, _) = run(state.path(), &cache, "second");
    assert_eq!((found, status), (Some(CacheState::Reused), RunStatus::Ok));

    let dir = versioned(&cache);
    std::fs::write(dir.join("stamp.json"), b"{\"cubecl\": tr").unwrap();
    std::fs::write(dir.join("cubecl").join("default.db"), b"not a database").unwrap();
    let (found, status, stderr) = run(state.path(), &cache, "third");
    assert_eq!((found, status), (Some(CacheState::Replaced), RunStatus::Ok));
    assert!(stderr.contains("warning") && stderr.contains("corrupt"), "{stderr}");
    assert!(!versioned(&cache).join("cubecl").join("default.db").exists(), "the corrupt files are not used");
    assert_eq!(run(state.path(), &cache, "fourth").0, Some(CacheState::Reused));
}

#[test]
fn a_cache_dir_that_cannot_be_made_leaves_the_run_uncached() {
    let state = tempfile::tempdir().unwrap();
    let file = state.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let (found, status, stderr) = run(state.path(), &file, "uncached");
    assert_eq!((found, status), (Some(CacheState::Unusable), RunStatus::Ok));
    assert!(stderr.contains("running without a kernel cache"), "{stderr}");
}
