//! The GPU code path (CubeCL's Vulkan runtime) on a real Vulkan device: in CI
//! a CPU one, Mesa's lavapipe on LLVM 19 from a Debian trixie root
//! (`scripts/lavapipe.sh` makes it; `SWEEP_VULKAN_ROOT` names it, and the
//! worker then runs through that root's dynamic loader, as
//! `scripts/lavapipe-run` does), on a workstation whatever Vulkan device the
//! loader finds first. Built only with `--features vulkan`; `scripts/test.sh`
//! runs it so, beside the workspace tests, which skip it (`--skip lavapipe::`).
#![cfg(feature = "vulkan")]

mod common;

/// Every test here, by one name `scripts/test.sh` can run apart: `lavapipe::`.
mod lavapipe {
    use super::common;

    use std::path::Path;

    use facts::event::{AttentionKernel, DtypePolicy, Event, Phase, RunStatus};
    use facts::{DitSpec, ModelSpec, RunConfig, Spatial};

    fn config(name: &str, model: ModelSpec, spatial: Spatial) -> RunConfig {
        worker::warm::config("vulkan", name, model, spatial)
    }

    fn dit(hidden: u32, heads: u32, depth: u32, patch: u32) -> ModelSpec {
        ModelSpec::Dit(DitSpec { variant: None, hidden: Some(hidden), heads: Some(heads), depth: Some(depth), patch })
    }

    /// One kernel cache for every test here (the first run of a kernel compiles
    /// it; on lavapipe that is most of a run's time).
    fn kernel_cache() -> String {
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("vulkan-kernel-cache").display().to_string()
    }

    /// Run `cfg` on the Vulkan backend; the events it wrote.
    fn run(dir: &Path, cfg: &RunConfig, extra: &[&str]) -> (std::process::ExitStatus, Vec<Event>) {
        let cache = kernel_cache();
        let args: Vec<&str> =
            ["--backend", "vulkan", "--cache-dir", &cache].into_iter().chain(extra.iter().copied()).collect();
        let (out, events) = common::run_worker_as(common::gpu_worker(), dir, cfg, &args);
        (out.status, events)
    }

    fn result(events: &[Event]) -> (RunStatus, Option<Phase>, Option<String>) {
        match events.last() {
            Some(Event::Result { status, phase, message, .. }) => (*status, *phase, message.clone()),
            other => panic!("the run ended without a result; last event: {other:?}"),
        }
    }

    /// One small config of each family, in fp32 (what `worker warm` runs):
    /// lavapipe compiles autocast's f16 kernels ten times slower (a tiny DiT:
    /// 47 s cold in fp32, 520 s in bf16-amp).
    fn four_families(s: Spatial) -> Vec<RunConfig> {
        worker::warm::sweep("vulkan", s)
    }

    /// A tensor no device can hold (Burn's decomposed attention over 131,072
    /// tokens: 4 heads x 131072² x 4 bytes = 256 GiB of scores) ends `oom` in the
    /// forward phase: CubeCL attaches the failed allocation to its buffer instead
    /// of raising and skips the kernels that need it; the forward's read-back
    /// surfaces it. The worker before the read-back recorded this config `ok` at a
    /// 0.431 GiB peak on lavapipe (docs/gpu.md).
    #[test]
    fn a_tensor_no_device_can_hold_ends_oom_not_ok() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config("dit_131072_tokens", dit(32, 4, 1, 1), Spatial::new(32, 64, 64));
        let (status, events) = run(dir.path(), &cfg, &["--attention", "materialised"]);
        let (result, phase, message) = result(&events);
        assert_eq!(result, RunStatus::Oom, "256 GiB of scores ended {result:?} in {phase:?}: {message:?}");
        assert_eq!(phase, Some(Phase::Fwd), "{message:?}");
        assert_eq!(status.code(), Some(3));
        eprintln!("{message:?}");
    }

    /// The last result's peak bytes among `events`.
    fn peak(events: &[Event]) -> u64 {
        match events.iter().rev().find(|e| matches!(e, Event::Result { .. })) {
            Some(Event::Result { status: RunStatus::Ok, peak_bytes, .. }) => *peak_bytes,
            other => panic!("not an ok result: {other:?}"),
        }
    }

    /// Every family runs on the Vulkan device and ends `ok` with every phase read
    /// back; then a task of the same four configs (`configs_per_task: 4`: one
    /// process, the pool emptied between configs) measures each config's peak as
    /// a process of its own did. One test, so the four single runs serve both
    /// checks (on lavapipe each cold run compiles for minutes).
    ///
    /// The single runs need lavapipe of Mesa 26 (`scripts/lavapipe.sh`): older
    /// ones (bookworm's Mesa 22.3.6, trixie's 25.0.7, on LLVM 15 and 19)
    /// segfaulted inside `vkCreateComputePipelines`, and such a crash must still
    /// leave a `failed` result naming the signal and the phase, never only the
    /// `start` line (docs/gpu.md; `crash_signals_are_recorded_as_failed_with_the_signal`
    /// in `tests/cli.rs` checks that on the CPU).
    ///
    /// In the task each phase window starts from the pool's bytes in use, never
    /// from its high-water mark, which does not reset. On lavapipe the peaks agree
    /// to the byte once the kernels are tuned; a run that tunes them (a cold
    /// cache) may pick other kernels with other intermediates: 1.3% (10.6 kB) on
    /// the tiny DiT when its lone run was the one tuning. With the multi-tensor
    /// AdamW step (many more fused element-wise kernels, whose fused or
    /// unfused execution CubeCL times on this loaded CPU) the picks differ
    /// from process to process even on a warm cache: seen 3.05 to 3.63 MB for
    /// the 3.5 MB DiT (447 kB apart), later 2.97 to 3.69 MB (713 kB, with the
    /// cluster tests running beside it), 91 kB on the 1.7 MB HDiT. Within 2% or
    /// 1 MiB, the larger: a task that kept one config's tensors into the next
    /// is off by a whole config's bytes (on the CPU: 7.6 MB against 3.1 MB
    /// alone, 4.5 MB off), which this still fails on.
    #[test]
    fn every_family_reads_back_and_a_task_of_four_measures_what_four_processes_do() {
        let configs = four_families(Spatial::new(8, 8, 8));
        let alone = tempfile::tempdir().unwrap();
        let alone: Vec<u64> = configs.iter().map(|c| runs_alone_and_reads_back(alone.path(), c)).collect();

        let dir = tempfile::tempdir().unwrap();
        let manifest = facts::run::Manifest {
            experiment: configs[0].experiment.clone(),
            task_offset: 0,
            configs_per_task: 4,
            memory_limit: None,
            configs: configs.clone(),
        };
        let path = dir.path().join("manifest.json");
        std::fs::write(&path, serde_json::to_vec(&manifest).unwrap()).unwrap();
        let status = common::gpu_worker()
            .args(["run", "--backend", "vulkan", "--cache-dir", &kernel_cache(), "--task-id", "0", "--manifest"])
            .arg(&path)
            .arg("--state-dir")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "{status}");
        let mut off = Vec::new();
        for (c, alone) in configs.iter().zip(alone) {
            let text = std::fs::read_to_string(dir.path().join(&c.experiment).join(c.events_rel())).unwrap();
            let events: Vec<Event> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
            let in_task = peak(&events);
            let diff = (in_task as f64 - alone as f64) / alone as f64;
            eprintln!("{}: {in_task} B in the task, {alone} B alone ({:+.2}%)", c.name, 100.0 * diff);
            if in_task.abs_diff(alone) > (alone / 50).max(1 << 20) {
                off.push((c.name.clone(), in_task, alone));
            }
        }
        assert!(off.is_empty(), "peaks in the task off their peak alone (name, in the task, alone): {off:?}");
    }

    /// `cfg` run alone ends `ok` on the Vulkan device, in fp32 with the attention
    /// kernel its family uses, every phase read back; its peak bytes.
    fn runs_alone_and_reads_back(dir: &Path, cfg: &RunConfig) -> u64 {
        let (status, events) = run(dir, cfg, &[]);
        let (result, phase, message) = result(&events);
        let device = match &events[0] {
            Event::Start { env, .. } => {
                assert_eq!(env.backend, "vulkan");
                assert_eq!(env.dtype_policy, Some(DtypePolicy::Uniform), "{}", cfg.name);
                let expected =
                    if cfg.name == "unet" { AttentionKernel::Materialised } else { AttentionKernel::MemoryEfficient };
                assert_eq!(env.attention, Some(expected));
                env.device.clone()
            }
            other => panic!("{other:?}"),
        };
        eprintln!("{} on {device}: {result:?} in {phase:?}: {message:?}", cfg.name);
        let readbacks = events.iter().filter(|e| matches!(e, Event::PhaseEnd { readback: Some(_), .. })).count();
        assert_eq!(result, RunStatus::Ok, "{} on {device}: {message:?}", cfg.name);
        assert!(status.success(), "{}", cfg.name);
        assert_eq!(readbacks, 4, "{}: every phase reads back", cfg.name);
        peak(&events)
    }

    /// Whether a Vulkan loader is here to break: the Debian root's
    /// (`SWEEP_VULKAN_ROOT`), else this machine's `libvulkan.so.1`.
    fn vulkan_loader_present() -> bool {
        if let Some(root) = std::env::var_os("SWEEP_VULKAN_ROOT") {
            return Path::new(&root).join("usr/lib/x86_64-linux-gnu/libvulkan.so.1").exists();
        }
        // SAFETY: dlopen of a NUL-terminated name, closed at once.
        unsafe {
            let handle = libc::dlopen(c"libvulkan.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            !handle.is_null() && libc::dlclose(handle) == 0
        }
    }

    /// The Vulkan loader pointed at a driver manifest that is not there, then
    /// at one naming a driver library that is not there: the device's own
    /// thread panics (no adapter) and the run's thread sees only its channel
    /// close (`RecvError`, all the H100 check of 2026-11-27 recorded). The
    /// result is `failed` in device setup, and its message says there is no
    /// Vulkan adapter and what is wrong with the driver path.
    #[test]
    fn a_broken_driver_path_is_named_in_the_result() {
        if !vulkan_loader_present() {
            eprintln!(
                "skipped: no Vulkan loader (libvulkan.so.1) on this machine and no SWEEP_VULKAN_ROOT; \
                 SWEEP_VULKAN_ROOT=$(scripts/lavapipe.sh) makes one"
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no_such_icd.json");
        let bogus = dir.path().join("bogus_icd.json");
        std::fs::write(
            &bogus,
            r#"{"file_format_version": "1.0.0", "ICD": {"library_path": "/nonexistent/libvulkan_bogus.so", "api_version": "1.3.0"}}"#,
        )
        .unwrap();
        let cases = [
            (missing.clone(), format!("{} does not exist", missing.display())),
            (
                bogus.clone(),
                format!(
                    "{} names the driver library /nonexistent/libvulkan_bogus.so, which does not exist",
                    bogus.display()
                ),
            ),
        ];
        for (i, (manifest, problem)) in cases.into_iter().enumerate() {
            let state = dir.path().join(format!("state{i}"));
            std::fs::create_dir_all(&state).unwrap();
            let mut worker = common::gpu_worker();
            worker.env("VK_DRIVER_FILES", &manifest).env("VK_ICD_FILENAMES", &manifest);
            let cfg = four_families(Spatial::new(8, 8, 8)).remove(0);
            let (out, events) =
                common::run_worker_as(worker, &state, &cfg, &["--backend", "vulkan", "--cache-dir", &kernel_cache()]);
            let (status, phase, message) = result(&events);
            let message = message.unwrap_or_default();
            eprintln!("{}: {message}", manifest.display());
            assert_eq!(status, RunStatus::Failed, "{message}\n{}", String::from_utf8_lossy(&out.stderr));
            assert_eq!(phase, None, "device setup: {message}");
            assert_eq!(out.status.code(), Some(1));
            assert!(message.starts_with("device setup panicked: no Vulkan adapter: "), "{message}");
            assert!(message.contains(&format!("VK_DRIVER_FILES={}: {problem}", manifest.display())), "{message}");
        }
    }

    /// Two processes of one node starting on one empty cache at once (array
    /// tasks on a multi-GPU node): each runs on its own copy of CubeCL's database
    /// and merges what it compiled back, one at a time, so both end `ok` and the
    /// node's database ends whole, with nothing left beside it. Opening one
    /// database from several processes, as CubeCL does with Turso's experimental
    /// multi-process WAL, corrupted it in CI ("page must be loaded in
    /// add_dirty()") and made every later run on it fail. A third run then
    /// finds every kernel and tuning result it needs: it stores nothing new.
    #[test]
    fn processes_of_one_node_share_the_kernel_cache_without_breaking_it() {
        let cache = tempfile::tempdir().unwrap();
        let cache_arg = cache.path().to_str().unwrap().to_string();
        let cfg = four_families(Spatial::new(8, 8, 8)).into_iter().find(|c| c.name == "dit").unwrap();
        let run = |cfg: &RunConfig| {
            let state = tempfile::tempdir().unwrap();
            let (out, events) = common::run_worker_as(
                common::gpu_worker(),
                state.path(),
                cfg,
                &["--backend", "vulkan", "--cache-dir", &cache_arg],
            );
            (String::from_utf8_lossy(&out.stderr).into_owned(), result(&events))
        };
        let runs: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2).map(|_| s.spawn(|| run(&cfg))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (stderr, (status, phase, message)) in &runs {
            assert_eq!(*status, RunStatus::Ok, "{phase:?}: {message:?}\n{stderr}");
        }
        assert!(runs.iter().any(|(stderr, _)| stderr.contains("new entries merged")), "{runs:?}");

        let versioned = std::fs::read_dir(cache.path()).unwrap().next().unwrap().unwrap().path();
        let node: Vec<_> =
            std::fs::read_dir(versioned.join("cubecl")).unwrap().map(|e| e.unwrap().file_name()).collect();
        let mut node: Vec<_> = node.iter().map(|n| n.to_string_lossy().into_owned()).collect();
        node.sort();
        assert_eq!(node, ["default.db", "merge.lock"], "one standalone database, no WAL or staging file beside it");
        assert_eq!(std::fs::read_dir(versioned.join("proc")).unwrap().count(), 0, "every run's copy removed");

        let (stderr, (status, _, message)) = run(&cfg);
        assert_eq!(status, RunStatus::Ok, "{message:?}\n{stderr}");
        assert!(!stderr.contains("merged"), "a run after the two stores nothing new:\n{stderr}");
    }
}
