//! The worker's transformer blocks keep for backward what `facts::blocks`
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
//!
//! The UNet's ResBlock is measured the same way at two volumes, a voxel
//! instead of a token, against `facts::blocks::unet`. Its input is handed
//! over (the test keeps no handle to it), so that it stays only if the
//! block keeps it, as the description says which entries do; its output is
//! measured and set apart.

use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
use facts::blocks::unet::{self as unet_blocks, Of, RES_BLOCK};
use facts::blocks::{self, Block, Storage};
use worker::alloc;
use worker::models::amp::Autocast;
use worker::models::attention::{AttentionKernel, Heads};
use worker::models::unet::ResBlock;
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

/// What `facts::blocks` says `block` keeps a token, the attention kernel's
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
        "{family} under {precision} keeps {measured:.1} B a token; facts::blocks describes {expected} B \
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

/// The ResBlock's widths: they differ, so the skip convolution is there, and
/// the output is the wider, so conv2's column buffer is the largest. Norm
/// groups and the time embedding's width as the UNet gives them (4·c0).
const CIN: usize = 16;
const COUT: usize = 32;
const GROUPS: usize = 8;
const TEMB: usize = 4 * CIN;
/// Two volumes `[D, H, W]` 8,192 voxels apart: 3.9 MB more held under
/// autocast, 4.2 MB in fp32, against a few kilobytes of allocator noise.
const VOLUMES: [[usize; 3]; 2] = [[16, 16, 32], [16, 32, 32]];

/// One ResBlock forward at `dims`: the bytes held after it (its input handed
/// over, its output included), the output's bytes, and the forward's peak
/// above what it holds after; the graph is then consumed by a backward.
fn res_forward(block: &ResBlock, emb: &Tensor<2>, dims: [usize; 3], autocast: bool, device: &Device) -> [i64; 3] {
    let [d, h, w] = dims;
    let x = Tensor::<5>::random([1, CIN, d, h, w], Distribution::Normal(0.0, 1.0), device).require_grad();
    // The UNet hands its blocks their input in the half type under autocast.
    let x = if autocast { x.cast(FloatDType::BF16) } else { x };
    device.sync().unwrap();
    let before = alloc::current() as i64;
    alloc::reset_peak();
    let out = block.forward(x, emb.clone());
    device.sync().unwrap();
    let (held, peak) = (alloc::current() as i64 - before, alloc::peak() as i64 - before);
    let output = (out.dims().iter().product::<usize>() * out.dtype().size()) as i64;
    drop(out.cast(FloatDType::F32).sum().backward());
    [held, output, peak - held]
}

/// What a ResBlock makes and keeps a voxel, the input dropped where no entry
/// of `saved` keeps it: elements of `facts::blocks::unet` at `dt` bytes.
fn res_described<'a>(saved: impl Iterator<Item = &'a unet_blocks::Saved>, autocast: bool) -> f64 {
    let dt = if autocast { (4.0, 2.0) } else { (4.0, 4.0) };
    // In fp32 norm1's input is the block's input itself; under autocast its f32 copy.
    let is_input = |s: &unet_blocks::Saved| s.of == Of::Input || (s.of == Of::InputUpcast && !autocast);
    let (mut made, mut keeps_input) = (0.0, false);
    for s in saved {
        if is_input(s) {
            keeps_input = true;
        } else {
            made += s.storage.bytes(dt) * s.elems.at(CIN as f64, COUT as f64, 0.0);
        }
    }
    // The input arrives in the half type (f32 in fp32).
    let input = Storage::Half.bytes(dt) * CIN as f64;
    if keeps_input {
        made
    } else {
        made - input
    }
}

#[test]
fn the_unet_res_block_keeps_what_spec_describes_and_frees_its_column_buffers() {
    let _one = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let device = Device::flex().autodiff();
    let block = ResBlock::new(CIN, COUT, TEMB, GROUPS, &device).expect("a ResBlock");
    // The time embedding, tracked as the time MLP's output is.
    let emb = Tensor::<2>::random([1, TEMB], Distribution::Normal(0.0, 1.0), &device).require_grad();
    let voxels = VOLUMES.map(|[d, h, w]| (d * h * w) as f64);
    both_precisions(|autocast| {
        // The first run at a size grows the kernels' scratch and the thread pool, which stay.
        res_forward(&block, &emb, VOLUMES[1], autocast, &device);
        let [small, large] = VOLUMES.map(|dims| res_forward(&block, &emb, dims, autocast, &device));
        let per_voxel = |i: usize| (large[i] - small[i]) as f64 / (voxels[1] - voxels[0]);
        let (output, above) = (per_voxel(1), per_voxel(2));
        let measured = per_voxel(0) - output;
        let names: Vec<&str> = RES_BLOCK.saved(CIN as u64, COUT as u64).map(|s| s.name).collect();
        let expected = res_described(RES_BLOCK.saved(CIN as u64, COUT as u64), autocast);
        let precision = if autocast { "bf16 autocast" } else { "fp32" };
        let off = measured / expected - 1.0;
        eprintln!(
            "the UNet ResBlock, {precision}: measured {measured:.1} B a voxel (its output's {output:.1} B apart), \
             described {expected} B ({:+.2} %); forward peak {above:.1} B a voxel above that",
            100.0 * off
        );
        assert!(
            off.abs() <= TOLERANCE,
            "the UNet ResBlock under {precision} keeps {measured:.1} B a voxel; facts::blocks::unet describes \
             {expected} B ({:+.2} %, tolerance {} %): {}",
            100.0 * off,
            100.0 * TOLERANCE,
            names.join(", ")
        );
        // The column buffers are transients: none is held after forward
        // (above), and the forward peaked above that by the largest, conv2's:
        // while it runs the block holds what it holds after, conv2's output
        // in place of its own (the same size), and the buffer.
        let (elems, storage) = RES_BLOCK.largest_transient(CIN as u64, COUT as u64).expect("3x3x3 convolutions");
        let columns = elems * storage.bytes(if autocast { (4.0, 2.0) } else { (4.0, 4.0) });
        assert!(
            (above / columns - 1.0).abs() <= TOLERANCE,
            "{precision}: the forward peaked {above:.1} B a voxel above what it holds after; \
             facts::blocks::unet's largest column buffer is {columns} B"
        );
    });
}

/// The ResBlock test can tell a dropped entry: dropping any one moves the
/// described bytes by more than [`TOLERANCE`] in one of the precisions.
#[test]
fn every_res_block_entry_weighs_more_than_the_tolerance() {
    let saved = || RES_BLOCK.saved(CIN as u64, COUT as u64);
    for entry in saved() {
        let most = [true, false]
            .map(|autocast| {
                let all = res_described(saved(), autocast);
                (all - res_described(saved().filter(|s| *s != entry), autocast)).abs() / all
            })
            .into_iter()
            .fold(0.0, f64::max);
        assert!(most > TOLERANCE, "{}: at most {:.2} % of the measured ResBlock", entry.name, 100.0 * most);
    }
}
