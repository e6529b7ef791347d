//! What the group's attention keeps for backward that a plain one does not,
//! measured by the worker's exact tracking allocator under bf16 autocast as
//! PyTorch saves tensors (`src/medgen/models/dit_blocks.py@3140d97:135-157` in
//! `ModeS7/AIS4900_master`; the appendix of the group-code notes):
//!
//! - qk-norm (`LayerNorm(head_dim)` on q and on k, in f32 under autocast): the
//!   f32 copies of q and k its norms keep (8h bytes a token), their row
//!   statistics (mean and rstd for each head, 16a), and the casts of the normed
//!   q and k that attention takes (4h);
//! - the output's re-layout: the normed q is contiguous, so the attention's
//!   output is laid out like it and the `[B, N, h]` the projection reads is a
//!   copy (2h).
//!
//! 14h + 16a bytes a token in all, h hidden, a heads. Its own test binary: it
//! measures the whole process's bytes.

use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
use worker::alloc;
use worker::models::amp::Autocast;
use worker::models::attention::{AttentionKernel, Heads};
use worker::models::{self_attention, QkNorm};

const HEADS: usize = 4;
const HEAD_DIM: usize = 16;

/// Bytes held after the forward of one attention over `n` tokens from a packed
/// bf16 qkv leaf: the leaf, the output and what backward keeps.
fn held_after_forward(n: usize, qk_norm: bool) -> u64 {
    let device = Device::flex().autodiff();
    let h = HEADS * HEAD_DIM;
    let norm = QkNorm::new(HEAD_DIM, &device);
    let _amp = Autocast::enter(Some(FloatDType::BF16));
    let heads = Heads { count: HEADS, kernel: AttentionKernel::MemoryEfficient };
    device.sync().unwrap();
    let before = alloc::current();
    let qkv = Tensor::<3>::random([1, n, 3 * h], Distribution::Normal(0.0, 1.0), &device)
        .cast(FloatDType::BF16)
        .require_grad();
    let out = self_attention(qkv, heads, qk_norm.then_some(&norm));
    device.sync().unwrap();
    let held = alloc::current().saturating_sub(before);
    drop(out.cast(FloatDType::F32).sum().backward());
    held
}

#[test]
fn qk_norm_keeps_f32_q_and_k_their_statistics_half_casts_and_a_relaid_output() {
    let n = 2048;
    for qk in [false, true] {
        held_after_forward(n, qk); // the kernels' scratch and the thread pool, once
    }
    let (plain, group) = (held_after_forward(n, false), held_after_forward(n, true));
    let (h, a) = ((HEADS * HEAD_DIM) as f64, HEADS as f64);
    let per_token = (group as f64 - plain as f64) / n as f64;
    eprintln!("{n} tokens: plain {plain} B, with qk-norm {group} B: {per_token:.1} B a token more");
    // f32 q, k (8h) + statistics (16a) + half casts (4h) + the output's copy (2h).
    let expected = 14.0 * h + 16.0 * a;
    let without_copy = expected - 2.0 * h;
    assert!(
        (per_token - expected).abs() < 0.02 * expected,
        "qk-norm added {per_token:.1} B a token; the group's block keeps {expected} more \
         ({without_copy} without the output's re-layout copy)"
    );
}
