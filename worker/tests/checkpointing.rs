//! Per-block gradient checkpointing end to end (`grad_ckpt: true` on a
//! transformer family), on the CPU backend's exact allocator: the start event
//! says how it ran, the forward keeps only the blocks' inputs, and backward
//! (which runs every block again) still yields every gradient.

use std::path::Path;

mod common;
use common::run_worker;

use facts::event::{Checkpointing, Event, Phase, RunStatus};
use facts::{DitSpec, HditSpec, Input, ModelSpec, PerLevel, Precision, RunConfig, Spatial, UnetSpec, UvitSpec};

fn config(name: &str, model: ModelSpec, grad_ckpt: bool) -> RunConfig {
    let input = Input { channels: 1, spatial: Spatial::new(16, 16, 16) };
    RunConfig { grad_ckpt, ..RunConfig::profile("ckpt", name, model, input) }
}

/// Runs `cfg`; returns how the start event says it checkpointed, each phase's
/// peak and read-back value, and the result's status.
fn run(dir: &Path, cfg: &RunConfig) -> (Option<Checkpointing>, Vec<(Phase, u64, f64)>, RunStatus) {
    let (status, events) = run_worker(dir, cfg);
    let ckpt = match &events[0] {
        Event::Start { env, .. } => env.checkpointing,
        other => panic!("{other:?}"),
    };
    let phases = events
        .iter()
        .filter_map(|e| match e {
            Event::PhaseEnd { phase, peak_bytes, readback, .. } => Some((*phase, *peak_bytes, readback.unwrap())),
            _ => None,
        })
        .collect();
    let result = match events.last() {
        Some(Event::Result { status, .. }) => *status,
        other => panic!("{other:?}"),
    };
    assert_eq!(status.success(), result == RunStatus::Ok);
    (ckpt, phases, result)
}

fn dit(depth: u32) -> ModelSpec {
    ModelSpec::Dit(DitSpec { variant: None, hidden: Some(64), heads: Some(4), depth: Some(depth), patch: 2 })
}

fn hdit(level_depths: Vec<u32>) -> ModelSpec {
    ModelSpec::Hdit(HditSpec { variant: None, hidden: Some(64), heads: Some(4), patch: 2, level_depths })
}

fn uvit(depth: u32) -> ModelSpec {
    ModelSpec::Uvit(UvitSpec { variant: None, hidden: Some(64), heads: Some(4), depth: Some(depth), patch: 2 })
}

fn unet(res: u32) -> ModelSpec {
    ModelSpec::Unet(UnetSpec {
        channels: vec![8, 16],
        attention_levels: vec![false, false],
        num_res_blocks: PerLevel::All(res),
        num_head_channels: PerLevel::All(8),
        norm_num_groups: 4,
    })
}

/// The forward's peak grows by what each added block keeps for backward: its
/// whole activation walk without checkpointing, only its input with it. (The
/// peak itself also holds one block's transient attention tiles, the same at
/// any depth, so the test compares two depths. Eight blocks apart: on a busy
/// 2-core machine a forward's peak sometimes holds ~2 MB more of transient
/// buffers, which four blocks' checkpointed growth, 0.6 MB, could not absorb.)
#[test]
fn checkpointed_transformer_blocks_keep_only_their_inputs() {
    let _serial = common::measuring();
    let dir = tempfile::tempdir().unwrap();
    let families =
        [("dit", dit(2), dit(10)), ("hdit", hdit(vec![1, 1, 1]), hdit(vec![5, 1, 5])), ("uvit", uvit(3), uvit(11))];
    let input = Input { channels: 1, spatial: Spatial::new(16, 16, 16) };
    for (family, shallow, deep) in families {
        let (plain, ckpt) = forward_growth(dir.path(), family, [shallow, deep], input);
        eprintln!("{family}: eight more blocks add {plain} B to the forward plain, {ckpt} B checkpointed");
        assert!(plain > 0 && ckpt * 5 < plain, "{family}: {ckpt} B checkpointed vs {plain} B plain");
    }
}

/// How much more the deeper of two models adds to the forward's peak than
/// the shallower, without checkpointing and with it. Each run must end ok,
/// say how it checkpointed, and have run backward through every block (a
/// positive gradient norm: a missing gradient fails the run) and a step that
/// changed the parameters.
fn forward_growth(dir: &Path, family: &str, [shallow, deep]: [ModelSpec; 2], input: Input) -> (i64, i64) {
    let mut growth = Vec::new();
    for grad_ckpt in [false, true] {
        let mut fwd = Vec::new();
        for (depth, model) in [("shallow", &shallow), ("deep", &deep)] {
            let cfg = RunConfig { input, ..config(&format!("{family}_{depth}_{grad_ckpt}"), model.clone(), grad_ckpt) };
            let (ckpt, phases, status) = run(dir, &cfg);
            assert_eq!(status, RunStatus::Ok, "{}", cfg.name);
            let want = if grad_ckpt { Checkpointing::Block } else { Checkpointing::Off };
            assert_eq!(ckpt, Some(want), "{}", cfg.name);
            assert!(phases[2].2 > 0.0, "{}: gradient norm {}", cfg.name, phases[2].2);
            assert_ne!(phases[0].2, phases[3].2, "{}: parameters unchanged by the step", cfg.name);
            fwd.push(phases[1].1 as i64 - phases[0].1 as i64);
        }
        growth.push(fwd[1] - fwd[0]);
    }
    (growth[0], growth[1])
}

/// Under autocast the pieces hand on tensors of two types (the 16-bit block
/// outputs, the f32 conditioning): seeding a piece that handed on both adds
/// their products, which must promote as autocast does. Before the fix every
/// checkpointed transformer run in `bf16-amp` failed in backward ("binary_op:
/// dtype mismatch left: BF16 right: F32"), the group's HDiT and U-ViT runs
/// among them.
#[test]
fn checkpointed_blocks_run_under_autocast() {
    let _serial = common::measuring();
    let dir = tempfile::tempdir().unwrap();
    for (family, model) in [("dit", dit(2)), ("hdit", hdit(vec![1, 1, 1])), ("uvit", uvit(3))] {
        let cfg = RunConfig { precision: Precision::Bf16Amp, ..config(&format!("{family}_amp_ckpt"), model, true) };
        let (ckpt, phases, status) = run(dir.path(), &cfg);
        assert_eq!(status, RunStatus::Ok, "{}", cfg.name);
        assert_eq!(ckpt, Some(Checkpointing::Block), "{}", cfg.name);
        assert!(phases[2].2 > 0.0, "{}: gradient norm {}", cfg.name, phases[2].2);
    }
}

/// `grad_ckpt` on a UNet checkpoints each level block, as the group's pixel
/// scripts wrap MONAI's UNet (`profile_pixel_3d_unet.py@b8e04ab:32-48`): two
/// more ResBlocks a level add their whole activations to the forward without
/// it; with it only the skips the down levels hand on (one volume of the
/// level's width each: 2 x 1 MiB at level 0, 2 x 256 KiB at level 1), the up
/// levels' added ResBlocks nothing. Before, the UNet ran unchecked
/// (`none-in-model`) and the two growths were equal.
#[test]
fn a_checkpointed_unet_keeps_only_its_level_blocks_inputs_and_skips() {
    let _serial = common::measuring();
    let dir = tempfile::tempdir().unwrap();
    let input = Input { channels: 1, spatial: Spatial::new(32, 32, 32) };
    let (plain, ckpt) = forward_growth(dir.path(), "unet", [unet(1), unet(3)], input);
    let skips: i64 = 2 * (8 * 32 * 32 * 32 * 4) + 2 * (16 * 16 * 16 * 16 * 4);
    eprintln!("unet: four more ResBlocks add {plain} B to the forward plain, {ckpt} B checkpointed (skips {skips} B)");
    assert!(ckpt >= skips && ckpt < skips + skips / 2, "{ckpt} B checkpointed against {skips} B of skips");
    assert!(plain > 4 * ckpt, "{ckpt} B checkpointed vs {plain} B plain");
}
