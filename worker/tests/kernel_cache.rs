//! `worker run --cache-dir`: the kernel cache a run finds is in its `start`
//! event, and a corrupt, foreign or unusable cache is a warning, never a
//! failed run (CPU backend: the cache directory is prepared and checked the
//! same way; CubeCL only reads it on GPU backends).

use std::path::Path;
use std::process::Command;

use spec::event::{CacheState, Event, RunStatus};
use spec::{Gpu, Input, Mode, ModelSpec, PerLevel, Precision, RunConfig, Spatial, UnetSpec};

fn tiny(name: &str) -> RunConfig {
    RunConfig {
        experiment: "cache".into(),
        name: name.into(),
        model: ModelSpec::Unet(UnetSpec {
            channels: vec![8, 16],
            attention_levels: vec![false, false],
            num_res_blocks: PerLevel::All(1),
            num_head_channels: PerLevel::All(8),
            norm_num_groups: 4,
        }),
        input: Input { channels: 1, spatial: Spatial::new(4, 4, 4) },
        out_channels: 1,
        batch: 1,
        precision: Precision::Fp32,
        grad_ckpt: false,
        mode: Mode::Profile,
        steps: 1,
        gpu: Gpu::A100Sxm80,
    }
}

/// Run `name` with `--cache-dir cache`: the cache state of its start event,
/// its result status and the worker's stderr.
fn run(state: &Path, cache: &Path, name: &str) -> (Option<CacheState>, RunStatus, String) {
    let cfg = tiny(name);
    let path = state.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_string(&cfg).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_worker"))
        .args(["run", "--config"])
        .arg(&path)
        .arg("--state-dir")
        .arg(state)
        .arg("--cache-dir")
        .arg(cache)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let text = std::fs::read_to_string(state.join(&cfg.experiment).join(cfg.events_rel())).unwrap();
    let events: Vec<Event> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
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
