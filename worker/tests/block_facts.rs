//! The worker's transformer blocks keep for backward what `spec::blocks`
//! describes: one group DiT block (adaLN, qk-norm) and one U-ViT pre-LN block,
//! measured by the exact tracking allocator on the flex CPU backend, under
//! bf16 autocast and in fp32 as PyTorch saves (`Autocast::torch_f32`).
//!
//! Bytes held after forward are measured at two token counts and differenced,
//! so what does not grow with tokens (weights' half copies, the adaLN
//! modulation, graph bookkeeping) cancels. The block's input is made before
//! the measurement and its output is counted instead: both are f32 `[B, N, h]`,
//! and the description counts the input (the first norm's) and not the output
//! (the next block's). Its tests measure the whole process's bytes: each holds
//! [`LOCK`].

use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
use spec::blocks::{self, Block};
use worker::alloc;
use worker::models::amp::Autocast;
use worker::models::attention::{AttentionKernel, Heads};
use worker::models::uvit::UvitBlock;
use worker::models::DitBlock;

/// The tests of this binary measure one process's bytes: one at a time.
static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Width, heads and token counts: small enough for a CPU test, with heads of
/// 8 channels so that the per-head terms (statistics, log-sum-exp) weigh a few
/// percent; 2,048 tokens more keep 5 to 12 MB more, against which a few
/// kilobytes of allocator noise would be a fraction of a byte a token.
const H: usize = 64;
const HEADS: usize = 8;
const TOKENS: [usize; 2] = [2048, 4096];
/// Measured and described bytes a token agree within 0.5 %: every saved
/// tensor of the description weighs more than that in one of the measured
/// blocks (the smallest, the LayerNorms' statistics, 16 B a token, is 0.68 %
/// of U-ViT's block under autocast), so dropping any one entry fails a test
/// (`every_saved_tensor_weighs_more_than_the_tolerance`).
const TOLERANCE: f64 = 0.005;

/// Bytes held after one forward of `block` over `n` tokens (input excluded,
/// output included); the graph is then consumed by a backward.
fn held_after_forward(block: &dyn Fn(Tensor<3>) -> Tensor<3>, n: usize, device: &Device) -> u64 {
    let x = Tensor::<3>::random([1, n, H], Distribution::Normal(0.0, 1.0), device).require_grad();
    device.sync().unwrap();
    let before = alloc::current();
    let out = block(x.clone());
    device.sync().unwrap();
    let held = alloc::current().saturating_sub(before);
    drop(out.cast(FloatDType::F32).sum().backward());
    held
}

/// Bytes a token one block keeps: the difference between the two token counts.
fn measured_per_token(block: &dyn Fn(Tensor<3>) -> Tensor<3>, device: &Device) -> f64 {
    // The first run at a size grows the kernels' scratch and the thread pool, which stay.
    held_after_forward(block, TOKENS[1], device);
    let [small, large] = TOKENS.map(|n| held_after_forward(block, n, device));
    (large as f64 - small as f64) / (TOKENS[1] - TOKENS[0]) as f64
}

/// What `spec::blocks` says `block` keeps a token, the attention kernel's
/// log-sum-exp included, and the entries it counts.
fn described(block: Block, autocast: bool) -> (f64, String) {
    let dt = if autocast { (4.0, 2.0) } else { (4.0, 4.0) };
    let (h, a) = (H as f64, HEADS as f64);
    let bytes = block.kept(autocast, false).bytes(dt, h, a) + block.kept(autocast, true).bytes(dt, h, a);
    let names: Vec<&str> = block.saved(autocast).map(|s| s.name).collect();
    (bytes, names.join(", "))
}

fn check(family: &str, block: Block, autocast: bool, measured: f64) {
    let (expected, entries) = described(block, autocast);
    let precision = if autocast { "bf16 autocast" } else { "fp32" };
    let off = measured / expected - 1.0;
    eprintln!(
        "{family}, {precision}: measured {measured:.1} B a token, described {expected} B ({:+.2} %)",
        100.0 * off
    );
    assert!(
        off.abs() <= TOLERANCE,
        "{family} under {precision} keeps {measured:.1} B a token; spec::blocks describes {expected} B \
         ({:+.2} %, tolerance {} %): {entries}",
        100.0 * off,
        100.0 * TOLERANCE
    );
}

/// Runs `f` under bf16 autocast and in fp32 as PyTorch saves.
fn both_precisions(mut f: impl FnMut(bool)) {
    for autocast in [true, false] {
        let _amp = if autocast { Autocast::enter(Some(FloatDType::BF16)) } else { Autocast::torch_f32() };
        f(autocast);
    }
}

#[test]
fn the_groups_dit_block_keeps_what_spec_describes() {
    let _one = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let device = Device::flex().autodiff();
    let block = DitBlock::new(H, Heads { count: HEADS, kernel: AttentionKernel::MemoryEfficient }, &device);
    // The timestep embedding the adaLN modulation reads, tracked as the time MLP's output is.
    let c = Tensor::<2>::random([1, H], Distribution::Normal(0.0, 1.0), &device).require_grad();
    both_precisions(|autocast| {
        let measured = measured_per_token(&|x| block.forward(x, c.clone()), &device);
        check("the group's DiT block", blocks::GROUP_DIT, autocast, measured);
    });
}

#[test]
fn the_uvit_block_keeps_what_spec_describes() {
    let _one = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let device = Device::flex().autodiff();
    let block = UvitBlock::new(H, Heads { count: HEADS, kernel: AttentionKernel::MemoryEfficient }, &device);
    both_precisions(|autocast| {
        let measured = measured_per_token(&|x| block.forward(x), &device);
        check("U-ViT's block", blocks::UVIT, autocast, measured);
    });
}

/// The tests above can tell a dropped fact: each saved tensor of the
/// description weighs more than [`TOLERANCE`] of one measured block's bytes.
#[test]
fn every_saved_tensor_weighs_more_than_the_tolerance() {
    let (h, a) = (H as f64, HEADS as f64);
    for entry in blocks::SAVED {
        let share = |block: Block, autocast: bool| {
            let dt = if autocast { (4.0, 2.0) } else { (4.0, 4.0) };
            let kept = block.saved(autocast).any(|s| s == entry);
            if kept {
                entry.bytes(dt, h, a) / described(block, autocast).0
            } else {
                0.0
            }
        };
        let most = [(blocks::GROUP_DIT, true), (blocks::GROUP_DIT, false), (blocks::UVIT, true), (blocks::UVIT, false)]
            .map(|(b, autocast)| share(b, autocast))
            .into_iter()
            .fold(0.0, f64::max);
        assert!(most > TOLERANCE, "{}: at most {:.2} % of a measured block", entry.name, 100.0 * most);
    }
}
