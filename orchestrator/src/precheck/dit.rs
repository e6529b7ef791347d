//! DiT (adaLN-Zero blocks over patch tokens) and the transformer block walk the
//! other transformer families share.
//!
//! Per DiT block and token, under bf16 autocast (h = hidden): the fp32 residual
//! input and the fp32 LayerNorm output (saved by the modulation multiply), the
//! bf16 cast for qkv, qkv itself (3h, kept by the attention kernel), the
//! attention output and its re-laid-out copy for the projection, the projection
//! output (kept by the gate multiply); the same residual/norm/cast pattern for
//! the MLP, then fc1 output and GELU output (4h each) and fc2 output.
//! That is 4 wide + 17 bf16 elements of h per token: 50 bytes x h x tokens.
//! Memory-efficient attention (PyTorch SDPA) keeps only a per-head logsumexp;
//! runtimes that materialise scores add heads x N x N per block.

use super::{fmax, PrecheckError, TermKind, Walk, WalkInfo};
use spec::{DitSpec, Input};

/// Saved bytes per token of one transformer block. `adaln`: DiT-style modulation
/// (keeps the gated branch output); otherwise pre-LN (U-ViT).
pub(super) fn block_bytes_per_token(w: &Walk, hidden: f64, adaln: bool) -> f64 {
    let (mm, wide) = (w.dt.mm, w.dt.wide);
    // x, LN1 out, x1, LN2 out: wide. cast, qkv (3), attn out, relayout, cast, fc1 (4), gelu (4).
    let common = 4.0 * wide + 15.0 * mm;
    // adaLN: proj output and fc2 output are kept by the gate multiplies.
    let gates = if adaln { 2.0 * mm } else { 0.0 };
    (common + gates) * hidden
}

/// Attention bookkeeping of one block: (saved bytes beside the block walk,
/// score elements when the runtime materialises them).
pub(super) fn attention(w: &Walk, heads: f64, tokens: f64) -> (f64, f64) {
    if w.c.transformer_scores_materialised {
        (0.0, heads * tokens * tokens)
    } else {
        // logsumexp per head and query, fp32.
        (4.0 * heads * tokens, 0.0)
    }
}

/// Everything a flat transformer stack needs to push its terms.
pub(super) struct Stack {
    /// Saved bytes of all blocks (no checkpointing).
    pub blocks: f64,
    /// The largest single block (saved bytes), for recompute and gradient buffers.
    pub max_block: f64,
    /// Materialised score elements over all blocks / of the largest block.
    pub scores: f64,
    pub max_scores: f64,
    /// Bytes checkpointing keeps: block inputs.
    pub ckpt_inputs: f64,
}

/// Push the block terms of a stack; `level` for hierarchical models.
pub(super) fn push_stack(w: &mut Walk, s: &Stack, level: Option<usize>) {
    let c = *w.c;
    let a = c.act_scale * w.batch;
    if w.ckpt {
        w.push("checkpointed block inputs", level, TermKind::Activations, a * s.ckpt_inputs);
    } else {
        w.push("transformer blocks", level, TermKind::Activations, a * s.blocks);
        w.push("attention scores", level, TermKind::AttentionScores, w.batch * c.score_saved_bytes * s.scores);
    }
}

/// Push the transients of the largest block (after all stacks are pushed).
pub(super) fn push_transients(w: &mut Walk, max_block: f64, max_scores: f64, level: Option<usize>) {
    let c = *w.c;
    let a = c.act_scale * w.batch;
    if w.ckpt {
        let recompute = a * max_block + w.batch * c.score_saved_bytes * max_scores;
        w.push("checkpoint recompute of one block", level, TermKind::Workspace, recompute);
    }
    w.push("attention block at its peak", level, TermKind::Workspace, w.batch * c.score_transient_bytes * max_scores);
    w.push("backward gradient buffers", level, TermKind::Workspace, a * c.bwd_transient * max_block);
}

/// Patch embedding input cast and the output head (norm, projection, unpatchify).
pub(super) fn embed_and_head(w: &Walk, input: &Input, hidden: f64, tokens: f64, patch: f64, out_ch: f64, adaln: bool) -> f64 {
    let (mm, wide) = (w.dt.mm, w.dt.wide);
    let voxels = input.spatial.voxels() as f64;
    let embed = mm * input.channels as f64 * voxels + wide * hidden * tokens;
    let norm = if adaln { 2.0 * wide } else { wide };
    let head = (norm + mm) * hidden * tokens + mm * patch.powi(3) * out_ch * tokens + mm * out_ch * voxels;
    embed + head
}

pub(super) fn walk(m: &DitSpec, input: &Input, out_channels: u32, w: &mut Walk) -> Result<WalkInfo, PrecheckError> {
    let d = m.dims()?;
    let (h, heads, depth) = (d.hidden as f64, d.heads as f64, d.depth as f64);
    let grid = input.spatial.div(m.patch.max(1));
    let t = grid.voxels() as f64;
    let (attn_saved, scores) = attention(w, heads, t);
    let block = block_bytes_per_token(w, h, true) * t + attn_saved;
    let s = Stack {
        blocks: depth * block,
        max_block: block,
        scores: depth * scores,
        max_scores: scores,
        ckpt_inputs: (depth + 1.0) * w.dt.wide * h * t,
    };
    let a = w.c.act_scale * w.batch;
    let eh = embed_and_head(w, input, h, t, m.patch as f64, out_channels as f64, true);
    w.push("patch embed and final layer", None, TermKind::Activations, a * eh);
    push_stack(w, &s, None);
    push_transients(w, fmax(s.max_block, 0.0), s.max_scores, None);
    // The sin-cos position table is a parameter without gradient.
    Ok(WalkInfo { frozen_params: grid.voxels() * d.hidden as u64 })
}
