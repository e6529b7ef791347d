//! The GPU code path (CubeCL's Vulkan runtime) on a real Vulkan device: in CI
//! a CPU one, Mesa's lavapipe on LLVM 19 from a Debian trixie root
//! (`scripts/lavapipe.sh` makes it; `SWEEP_VULKAN_ROOT` names it, and the
//! worker then runs through that root's dynamic loader, as
//! `scripts/lavapipe-run` does), on a workstation whatever Vulkan device the
//! loader finds first. Built only with `--features vulkan`; `scripts/test.sh`
//! runs it so.
#![cfg(feature = "vulkan")]

mod common;

use std::path::Path;

use spec::event::{AttentionKernel, DtypePolicy, Event, Phase, RunStatus};
use spec::{
    DitSpec, Gpu, HditSpec, Input, Mode, ModelSpec, PerLevel, Precision, RunConfig, Spatial, UnetSpec, UvitSpec,
};

fn config(name: &str, model: ModelSpec, spatial: Spatial) -> RunConfig {
    RunConfig {
        experiment: "vulkan".into(),
        name: name.into(),
        model,
        input: Input { channels: 1, spatial },
        out_channels: 1,
        batch: 1,
        precision: Precision::Bf16Amp,
        grad_ckpt: false,
        mode: Mode::Profile,
        steps: 1,
        gpu: Gpu::A100Sxm80,
    }
}

fn dit(hidden: u32, heads: u32, depth: u32, patch: u32) -> ModelSpec {
    ModelSpec::Dit(DitSpec { variant: None, hidden: Some(hidden), heads: Some(heads), depth: Some(depth), patch })
}

/// Run `cfg` on the Vulkan backend; the events it wrote.
fn run(dir: &Path, cfg: &RunConfig, extra: &[&str]) -> (std::process::ExitStatus, Vec<Event>) {
    let args: Vec<&str> = ["--backend", "vulkan"].into_iter().chain(extra.iter().copied()).collect();
    let (out, events) = common::run_worker_as(common::gpu_worker(), dir, cfg, &args);
    (out.status, events)
}

fn result(events: &[Event]) -> (RunStatus, Option<Phase>, Option<String>) {
    match events.last() {
        Some(Event::Result { status, phase, message, .. }) => (*status, *phase, message.clone()),
        other => panic!("the run ended without a result; last event: {other:?}"),
    }
}

/// Every run on the Vulkan device ends with a result, never with only its
/// `start` line. Where the device runs CubeCL's kernels the run is `ok` with
/// every phase read back; lavapipe (Mesa 22.3.6 and 25.0.7 with LLVM 15, the
/// only CPU Vulkan devices Debian bookworm offers) segfaults inside
/// `vkCreateComputePipelines`, and then the result is `failed`, naming the
/// signal and the phase (docs/gpu.md).
#[test]
fn every_run_on_the_vulkan_device_ends_with_a_result() {
    let dir = tempfile::tempdir().unwrap();
    let s = Spatial::new(8, 8, 8);
    let unet = ModelSpec::Unet(UnetSpec {
        channels: vec![16, 32],
        attention_levels: vec![false, true],
        num_res_blocks: PerLevel::All(1),
        num_head_channels: PerLevel::All(16),
        norm_num_groups: 8,
    });
    let hdit = ModelSpec::Hdit(HditSpec {
        variant: None,
        hidden: Some(32),
        heads: Some(2),
        patch: 2,
        level_depths: vec![1, 1, 1],
    });
    let uvit = ModelSpec::Uvit(UvitSpec { variant: None, hidden: Some(32), heads: Some(2), depth: Some(3), patch: 2 });
    for cfg in
        [config("unet", unet, s), config("dit", dit(32, 2, 2, 2), s), config("hdit", hdit, s), config("uvit", uvit, s)]
    {
        let (status, events) = run(dir.path(), &cfg, &[]);
        let (result, phase, message) = result(&events);
        let device = match &events[0] {
            Event::Start { env, .. } => {
                assert_eq!(env.backend, "vulkan");
                assert_eq!(env.dtype_policy, Some(DtypePolicy::Autocast), "{}", cfg.name);
                let expected =
                    if cfg.name == "unet" { AttentionKernel::Materialised } else { AttentionKernel::MemoryEfficient };
                assert_eq!(env.attention, Some(expected));
                env.device.clone()
            }
            other => panic!("{other:?}"),
        };
        eprintln!("{} on {device}: {result:?} in {phase:?}: {message:?}", cfg.name);
        let readbacks = events.iter().filter(|e| matches!(e, Event::PhaseEnd { readback: Some(_), .. })).count();
        match result {
            RunStatus::Ok => {
                assert!(status.success(), "{}", cfg.name);
                assert_eq!(readbacks, 4, "{}: every phase reads back", cfg.name);
            }
            RunStatus::Failed => {
                let message = message.expect("a failed run says why");
                assert!(phase.is_some(), "{}: the phase it stopped in", cfg.name);
                // Known on lavapipe: the crash inside the driver's pipeline compiler.
                if message.contains("crashed with SIG") {
                    use std::os::unix::process::ExitStatusExt;
                    assert!(status.signal().is_some(), "{}: the process still dies of the signal", cfg.name);
                }
            }
            other => panic!("{}: {other:?} ({message:?})", cfg.name),
        }
    }
}

/// A score tensor beyond what the device can hold in one buffer (the decomposed
/// attention over 8,192 tokens: 4 heads x 8192² x 4 bytes = 1 GiB; lavapipe's
/// storage buffers end at 128 MiB) must not end `ok`: the read-back surfaces
/// the failed allocation or skipped kernel, a crash is `failed`.
#[test]
fn a_tensor_the_device_cannot_hold_never_ends_ok() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config("dit_8192_tokens", dit(32, 4, 1, 1), Spatial::new(8, 32, 32));
    cfg.precision = Precision::Fp32;
    let (_, events) = run(dir.path(), &cfg, &["--attention", "materialised"]);
    let (status, phase, message) = result(&events);
    assert!(
        matches!(status, RunStatus::Oom | RunStatus::Failed),
        "materialised scores of 1 GiB ended {status:?} in {phase:?}: {message:?}"
    );
    assert!(phase.is_some() && message.is_some());
}
