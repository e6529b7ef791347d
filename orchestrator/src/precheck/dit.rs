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

use super::{PrecheckError, Seg, Walk, WalkInfo};
use spec::{DitSpec, Input};

/// Saved bytes per token of one transformer block. `adaln`: DiT-style modulation
/// (keeps the gated branch outputs); otherwise pre-LN (U-ViT).
pub(super) fn block_bytes_per_token(w: &Walk, hidden: f64, adaln: bool) -> f64 {
    let (mm, wide) = (w.dt.mm, w.dt.wide);
    // x, LN1 out, x1, LN2 out: wide. cast, qkv (3), attn out, relayout, cast, fc1 (4), gelu (4).
    let common = 4.0 * wide + 15.0 * mm;
    // adaLN: proj output and fc2 output are kept by the gate multiplies.
    let gates = if adaln { 2.0 * mm } else { 0.0 };
    (common + gates) * hidden
}

/// The shape of a transformer stage: width, heads, tokens, and whether its
/// norms are adaLN-modulated (DiT, HDiT) or plain (U-ViT).
#[derive(Debug, Clone, Copy)]
pub(super) struct Stage {
    pub hidden: f64,
    pub heads: f64,
    pub tokens: f64,
    pub adaln: bool,
}

/// One transformer block of `stage` at `level`: `extra_per_token` walk bytes
/// per token beyond the standard block (U-ViT's skip concatenation), `params`
/// its parameters. Honours checkpointing (keeps only the fp32 block input,
/// recomputes the block at its backward) and score materialisation.
pub(super) fn block_seg(
    w: &Walk,
    (name, level): (&'static str, Option<usize>),
    stage: Stage,
    extra_per_token: f64,
    params: u64,
) -> Seg {
    let Stage { hidden, heads, tokens, adaln } = stage;
    let c = w.c;
    let (saved_attn, score_elems, chunk_elems) = if c.transformer_scores_materialised {
        (0.0, heads * tokens * tokens, 0.0)
    } else {
        // logsumexp per head and query, fp32; a chunked kernel's f32 score tile while it runs.
        (4.0 * heads * tokens, 0.0, (heads * tokens * tokens).min(c.attention_chunk_bytes / 4.0))
    };
    let raw = (block_bytes_per_token(w, hidden, adaln) + extra_per_token) * tokens + saved_attn;
    let full = w.act(raw);
    let scores = w.batch * c.score_saved_bytes * w.dt.score_scale() * score_elems;
    let mut s = Seg::new(name, level);
    if w.ckpt {
        s.kept = w.exact(w.dt.wide * hidden * tokens);
        s.recompute = c.recompute_scale * w.batch * raw + scores;
    } else {
        s.kept = full;
        s.scores = scores;
    }
    s.transient = c.bwd_transient * full
        + w.batch * c.score_transient_bytes * w.dt.score_scale() * score_elems
        + c.score_transient_bytes * chunk_elems;
    s.params = params as f64;
    s
}

/// Patch embedding: the input cast for the conv and the embedded tokens (+ positions).
pub(super) fn embed_seg(w: &Walk, input: &Input, hidden: f64, tokens: f64, level: Option<usize>) -> Seg {
    let mut s = Seg::new("patch embed", level);
    s.kept = w.exact(w.dt.mm * input.channels as f64 * input.spatial.voxels() as f64 + w.dt.wide * hidden * tokens);
    s
}

/// Output head at `level`: final norm (+ modulation), projection to `patch`³
/// patches of `out_ch` channels, unpatchify copy.
pub(super) fn head_seg(
    w: &Walk,
    input: &Input,
    stage: Stage,
    (patch, out_ch): (f64, f64),
    level: Option<usize>,
) -> Seg {
    let Stage { hidden, tokens, adaln, .. } = stage;
    let (mm, wide) = (w.dt.mm, w.dt.wide);
    let norm = if adaln { 2.0 * wide } else { wide };
    let bytes = (norm + mm) * hidden * tokens
        + mm * patch.powi(3) * out_ch * tokens
        + mm * out_ch * input.spatial.voxels() as f64;
    let mut s = Seg::new("final layer", level);
    s.kept = w.act(bytes);
    s.transient = w.c.bwd_transient * s.kept;
    s
}

pub(super) fn walk(m: &DitSpec, input: &Input, out_channels: u32, w: &mut Walk) -> Result<WalkInfo, PrecheckError> {
    let d = m.dims()?;
    let (h, heads) = (d.hidden as f64, d.heads as f64);
    let grid = input.spatial.div(m.patch.max(1));
    let t = grid.voxels() as f64;
    w.push(embed_seg(w, input, h, t, None));
    let stage = Stage { hidden: h, heads, tokens: t, adaln: true };
    let blk = block_seg(w, ("transformer blocks", None), stage, 0.0, spec::params::dit_block(d.hidden as u64));
    for _ in 0..d.depth {
        w.push(blk);
    }
    w.push(head_seg(w, input, stage, (m.patch as f64, out_channels as f64), None));
    // The sin-cos position table is a parameter without gradient.
    Ok(WalkInfo { frozen_params: grid.voxels() * d.hidden as u64 })
}
