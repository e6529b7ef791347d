//! What an attention keeps for backward, measured by the worker's exact
//! tracking allocator: linear in tokens with the memory-efficient kernel,
//! quadratic with Burn's decomposed (materialised) attention, and what the
//! group's qk-norm adds. Its own test binary; its tests measure the whole
//! process's bytes, so they run one at a time (`--test-threads=1` is not
//! needed: each holds [`LOCK`]).

use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::FloatDType;
use worker::alloc;
use worker::models::amp::Autocast;
use worker::models::attention::{scaled_dot_product, AttentionKernel, Heads};
use worker::models::{self_attention, QkNorm};

/// The tests of this binary measure one process's bytes: one at a time.
static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Bytes still held after the forward pass of one attention over `n` tokens
/// (4 heads of 16 channels): the inputs, the output and what backward keeps.
fn held_after_forward(kernel: AttentionKernel, n: usize) -> u64 {
    let device = Device::flex().autodiff();
    let input = || Tensor::<4>::random([1, 4, n, 16], Distribution::Normal(0.0, 1.0), &device).require_grad();
    let before = alloc::current();
    let (q, k, v) = (input(), input(), input());
    let out = scaled_dot_product(q, k, v, kernel);
    device.sync().unwrap();
    let held = alloc::current().saturating_sub(before);
    // The graph is alive until here: backward works from what was kept.
    let grads = out.sum().backward();
    drop(grads);
    held
}

#[test]
fn memory_efficient_attention_keeps_linear_memory_and_the_decomposed_one_quadratic() {
    let _one = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let tokens = [512, 1024, 2048];
    // The first run at a size also grows the matmul kernels' cached scratch
    // buffers and the thread pool, which stay: warm them at the largest size.
    for kernel in [AttentionKernel::MemoryEfficient, AttentionKernel::Materialised] {
        held_after_forward(kernel, tokens[tokens.len() - 1]);
    }
    let efficient: Vec<u64> = tokens.iter().map(|&n| held_after_forward(AttentionKernel::MemoryEfficient, n)).collect();
    let materialised: Vec<u64> = tokens.iter().map(|&n| held_after_forward(AttentionKernel::Materialised, n)).collect();
    for (i, n) in tokens.iter().enumerate() {
        eprintln!("{n:>5} tokens: memory-efficient {:>10} B, materialised {:>10} B", efficient[i], materialised[i]);
    }
    // q, k, v, out: 4 x n x 64 x 4 bytes; the log-sum-exp n x 4 x 4 bytes.
    let inputs_and_output = |n: u64| 4 * n * 64 * 4;
    for (i, &n) in tokens.iter().enumerate() {
        let n = n as u64;
        assert!(
            efficient[i] >= inputs_and_output(n) && efficient[i] < inputs_and_output(n) * 3 / 2,
            "memory-efficient at {n} tokens holds {} B: q, k, v and the output are {} B",
            efficient[i],
            inputs_and_output(n)
        );
        // One score tensor alone is 4 heads x n x n x 4 bytes.
        assert!(materialised[i] > 4 * n * n * 4, "materialised at {n} tokens holds {} B", materialised[i]);
    }
    for w in 1..tokens.len() {
        let (e, m) =
            (efficient[w] as f64 / efficient[w - 1] as f64, materialised[w] as f64 / materialised[w - 1] as f64);
        assert!((1.9..2.2).contains(&e), "doubling tokens multiplied the memory-efficient hold by {e:.2}");
        assert!(m > 3.5, "doubling tokens multiplied the materialised hold by only {m:.2}");
    }
}

/// The memory-efficient attention's working set over `n` tokens (4 heads of
/// 16 channels): the peak during the forward above what it leaves held, and
/// the peak during the backward above what was live when it started.
fn working_set(n: usize) -> (u64, u64) {
    let device = Device::flex().autodiff();
    let input = || Tensor::<4>::random([1, 4, n, 16], Distribution::Normal(0.0, 1.0), &device).require_grad();
    let (q, k, v) = (input(), input(), input());
    device.sync().unwrap();
    alloc::reset_peak();
    let out = scaled_dot_product(q.clone(), k.clone(), v.clone(), AttentionKernel::MemoryEfficient);
    device.sync().unwrap();
    let fwd = alloc::peak().saturating_sub(alloc::current());
    let before = alloc::current();
    alloc::reset_peak();
    let grads = out.sum().backward();
    device.sync().unwrap();
    let bwd = alloc::peak().saturating_sub(before);
    drop((grads, q, k, v));
    (fwd, bwd)
}

#[test]
fn memory_efficient_working_set_is_bounded_by_its_chunk() {
    let _one = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    use worker::models::attention::CHUNK_SCORE_ELEMS;
    let tokens = [1024usize, 2048, 4096, 8192];
    working_set(tokens[tokens.len() - 1]);
    // The bound: a few f32 score tiles of one chunk (scores, their softmax, the
    // gradient of the softmax in backward, and their half casts), plus
    // tensors of q's size (the output, q, k and v's gradients, the f32
    // accumulators of dk and dv, the chunked dq and its concatenation).
    // One materialised score tensor is 4 x n x n x 4 B: 64 MiB at 2,048
    // tokens, 1 GiB at 8,192; the former 64 MiB score chunks alone exceed it.
    let tile = 4 * CHUNK_SCORE_ELEMS as u64;
    for n in tokens {
        let (fwd, bwd) = working_set(n);
        let q_bytes = (n * 64 * 4) as u64;
        let bound = 4 * tile + 16 * q_bytes;
        eprintln!("{n:>5} tokens: working set forward {fwd:>10} B, backward {bwd:>10} B (bound {bound} B)");
        assert!(fwd <= bound, "forward at {n} tokens peaked {fwd} B above what it keeps; bound {bound} B");
        assert!(bwd <= bound, "backward at {n} tokens peaked {bwd} B above its start; bound {bound} B");
    }
}

/// MONAI's attention under bf16 autocast keeps for backward what PyTorch's
/// autograd keeps of its scores: the f32 softmax output (`_softmax` saves
/// only its output) and the bf16 copy the second matmul takes, 6 bytes a
/// score. Burn's composed softmax kept the exponent's input and output as
/// well: 10 bytes.
#[test]
fn materialised_attention_under_autocast_keeps_six_bytes_a_score() {
    let _one = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let _amp = worker::models::amp::Autocast::enter(Some(burn::tensor::FloatDType::BF16));
    let n = 1024;
    held_after_forward(AttentionKernel::Materialised, n);
    let held = held_after_forward(AttentionKernel::Materialised, n);
    let per_score = held as f64 / (4 * n * n) as f64;
    eprintln!("{n} tokens, 4 heads: {held} B held after forward, {per_score:.2} B a score");
    // Above 6: q, k, v, their half copies and the output, 0.1 B a score here.
    assert!((6.0..6.5).contains(&per_score), "{per_score:.2} B a score held for backward");
}

const HEADS: usize = 4;
const HEAD_DIM: usize = 16;

/// Bytes held after the forward of one attention over `n` tokens from a packed
/// bf16 qkv leaf: the leaf, the output and what backward keeps.
fn held_after_group_attention(n: usize, qk_norm: bool) -> u64 {
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

/// What the group's attention keeps for backward that a plain one does not,
/// measured by the worker's exact tracking allocator under bf16 autocast as
/// PyTorch saves tensors (`src/medgen/models/dit_blocks.py@3140d97:135-157` in
/// `ModeS7/AIS4900_master`; the appendix of the group-code notes):
///
/// - qk-norm (`LayerNorm(head_dim)` on q and on k, in f32 under autocast): the
///   f32 copies of q and k its norms keep (8h bytes a token), their row
///   statistics (mean and rstd for each head, 16a), and the casts of the normed
///   q and k that attention takes (4h);
/// - the output's re-layout: the normed q is contiguous, so the attention's
///   output is laid out like it and the `[B, N, h]` the projection reads is a
///   copy (2h).
///
/// 14h + 16a bytes a token in all, h hidden, a heads. It holds [`LOCK`]: it
/// measures the whole process's bytes.
#[test]
fn qk_norm_keeps_f32_q_and_k_their_statistics_half_casts_and_a_relaid_output() {
    let _one = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let n = 2048;
    for qk in [false, true] {
        held_after_group_attention(n, qk); // the kernels' scratch and the thread pool, once
    }
    let (plain, group) = (held_after_group_attention(n, false), held_after_group_attention(n, true));
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
