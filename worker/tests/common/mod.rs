//! What the end-to-end worker tests share: run the `worker` binary on one
//! config and read back its events.
// Each test file uses part of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, ExitStatus, Output};

use facts::event::Event;
use facts::{Input, ModelSpec, PerLevel, RunConfig, Spatial, UnetSpec};

/// A 2-level UNet with attention at 8^3: runs on the CPU in well under a second.
pub fn tiny_unet(name: &str) -> RunConfig {
    let unet = UnetSpec {
        channels: vec![16, 32],
        attention_levels: vec![false, true],
        num_res_blocks: PerLevel::All(1),
        num_head_channels: PerLevel::All(16),
        norm_num_groups: 8,
    };
    RunConfig::profile("demo", name, ModelSpec::Unet(unet), Input { channels: 2, spatial: Spatial::new(8, 8, 8) })
}

/// Run `cfg` with `worker run` (CPU backend) under `dir`; its exit status and events.
pub fn run_worker(dir: &Path, cfg: &RunConfig) -> (ExitStatus, Vec<Event>) {
    let (out, events) = run_worker_with(dir, cfg, &[] as &[&str]);
    (out.status, events)
}

/// `worker run --backend flex ARGS --config <cfg> --state-dir <dir>`: the
/// process's output and every event of the config's run (earlier runs of the
/// same computation come first: runs are kept by content). The backend is
/// named: a build with GPU features (`scripts/test.sh` builds one) defaults
/// to a GPU one.
pub fn run_worker_with<S: AsRef<OsStr>>(dir: &Path, cfg: &RunConfig, args: &[S]) -> (Output, Vec<Event>) {
    let args: Vec<&OsStr> =
        [OsStr::new("--backend"), OsStr::new("flex")].into_iter().chain(args.iter().map(AsRef::as_ref)).collect();
    run_worker_as(Command::new(env!("CARGO_BIN_EXE_worker")), dir, cfg, &args)
}

/// The worker as the GPU tests and benches start it: through the dynamic
/// loader of the Debian root that `SWEEP_VULKAN_ROOT` names, when set
/// (`scripts/lavapipe.sh`: its C library, Vulkan loader and lavapipe, the CPU
/// Vulkan device of CI), else directly (the loader's first device).
pub fn gpu_worker() -> Command {
    let exe = env!("CARGO_BIN_EXE_worker");
    let Some(root) = std::env::var_os("SWEEP_VULKAN_ROOT").map(std::path::PathBuf::from) else {
        return Command::new(exe);
    };
    let libs = format!("{0}/usr/lib/x86_64-linux-gnu:{0}/lib/x86_64-linux-gnu", root.display());
    let mut c = Command::new(root.join("lib64/ld-linux-x86-64.so.2"));
    c.env("LD_LIBRARY_PATH", libs).env("VK_DRIVER_FILES", root.join("usr/share/vulkan/icd.d/lvp_icd.json")).arg(exe);
    c
}

/// [`run_worker_with`] through `worker`, a command that starts the worker
/// (directly, or [`gpu_worker`]).
pub fn run_worker_as<S: AsRef<OsStr>>(
    mut worker: Command,
    dir: &Path,
    cfg: &RunConfig,
    args: &[S],
) -> (Output, Vec<Event>) {
    let path = dir.join(format!("{}.json", cfg.name));
    std::fs::write(&path, serde_json::to_string(cfg).unwrap()).unwrap();
    let out = worker.arg("run").args(args).arg("--config").arg(&path).arg("--state-dir").arg(dir).output().unwrap();
    let text = std::fs::read_to_string(dir.join(&cfg.experiment).join(cfg.events_rel())).unwrap_or_default();
    (out, text.lines().map(|l| serde_json::from_str(l).expect("an event")).collect())
}

/// Held by a test that compares peaks across runs: the exact allocator's peak
/// of a CPU run moves with how its threads interleave, which two such tests
/// of one binary running at once on a 2-core machine disturb (seen: a
/// checkpointed DiT's forward growth 2.7 MB against 1.2 MB alone).
pub fn measuring() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
