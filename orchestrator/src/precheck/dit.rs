//! DiT (adaLN-Zero blocks over patch tokens) and the transformer block walk the
//! other transformer families share.
//!
//! What one block keeps for backward per token is `facts::blocks`' description
//! (the group's DiT block 62h + 20a + 16 bytes under bf16 autocast, U-ViT's
//! pre-LN block 36h + 4a + 16), which the walk counts as it is. Memory-efficient attention
//! (PyTorch SDPA) keeps only the per-head log-sum-exp (the description's
//! kernel entry); runtimes that materialise scores add heads x N x N per block.

use super::{PrecheckError, Seg, Walk};
use facts::blocks::{Block, GROUP_DIT};
use facts::{DitSpec, Input};

/// Saved bytes per token of one transformer block of `stage`: what its
/// layers keep (`facts::blocks`, the attention kernel's share apart). A
/// pre-LN block (U-ViT) is counted as described, 36h + 16 under bf16
/// autocast: what the checkpointed U-ViT's backward holds beyond it (the
/// long skips' gradients, the MLP's gradient buffers) is the U-ViT walk's
/// (`uvit.rs`), not an allowance here.
pub(super) fn block_bytes_per_token(w: &Walk, stage: &Stage) -> f64 {
    let dt = (w.dt.wide, w.dt.mm);
    let Stage { hidden, heads, block, .. } = *stage;
    block.kept(w.dt.autocast, false).bytes(dt, hidden, heads)
}

/// The shape of a transformer stage: width, heads, tokens, its block (the
/// group's DiT block, adaLN-modulated with qk-norm, or U-ViT's pre-LN one:
/// `facts::blocks`), and whether its blocks receive their input in the half
/// type (HDiT's decoder after the bf16 skip merge, U-ViT's out-blocks after
/// the first): a checkpointed block keeps it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stage {
    pub hidden: f64,
    pub heads: f64,
    pub tokens: f64,
    pub block: Block,
    pub half_input: bool,
}

impl Stage {
    /// The group's DiT block (adaLN, qk-norm) at `tokens`, fp32 input.
    pub fn dit(hidden: f64, heads: f64, tokens: f64) -> Stage {
        Stage { hidden, heads, tokens, block: GROUP_DIT, half_input: false }
    }
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
    let Stage { hidden, heads, tokens, block, half_input } = stage;
    let c = w.c;
    let (saved_attn, score_elems, chunk_elems) = if c.transformer_scores_materialised {
        (0.0, heads * tokens * tokens, 0.0)
    } else {
        // What the kernel keeps (the log-sum-exp per head and query, f32); a
        // chunked kernel's f32 score tile while it runs.
        let lse = block.kept(w.dt.autocast, true).bytes((w.dt.wide, w.dt.mm), hidden, heads);
        (lse * tokens, 0.0, (heads * tokens * tokens).min(c.attention_chunk_bytes / 4.0))
    };
    let raw = (block_bytes_per_token(w, &stage) + extra_per_token) * tokens + saved_attn;
    let full = w.act(raw);
    let scores = w.batch * c.score_saved_bytes * w.dt.score_scale() * score_elems;
    let mut s = Seg::new(name, level);
    if w.ckpt {
        s.ckpt = true;
        let input = if half_input { w.dt.mm } else { w.dt.wide };
        s.kept = w.exact(input * hidden * tokens);
        // A block that opens with its norm on a wide input saves that input
        // itself for the norm's backward: the checkpoint already keeps it, the
        // recompute makes it anew only where it is cast (a half input) or made
        // first (U-ViT's skip fusion: `extra_per_token`).
        let reused = if half_input || extra_per_token > 0.0 { 0.0 } else { w.dt.wide * hidden * tokens };
        s.recompute = c.recompute_scale * w.batch * (raw - reused) + scores;
    } else {
        s.kept = full;
        s.scores = scores;
    }
    // While a checkpointed block runs backward, fc2's backward makes the
    // gradient of the MLP's hidden layer (4h, half) while gelu's output is
    // still kept: the gradient buffer at its peak (the gradient arriving at
    // its output is the caller's, where it is not held already). What a
    // runtime holds beyond the walk's is `bwd_transient` (0 in PyTorch's fit).
    let fc2_grad = if w.ckpt { w.exact(4.0 * w.dt.mm * hidden * tokens) } else { 0.0 };
    let buffers = fc2_grad + c.bwd_transient * full;
    s.transient = buffers
        + w.batch * c.score_transient_bytes * w.dt.score_scale() * score_elems
        + c.score_transient_bytes * chunk_elems;
    s.params = params as f64;
    s
}

/// Patch embedding: the input cast the conv keeps for its weight gradient.
/// The embedded tokens (+ positions) are the first block's input, which that
/// block keeps (its norm's input, or the checkpoint's): counted there, once.
pub(super) fn embed_seg(w: &Walk, input: &Input, level: Option<usize>) -> Seg {
    let mut s = Seg::new("patch embed", level);
    s.kept = w.exact(w.dt.mm * input.channels as f64 * input.spatial.voxels() as f64);
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
    let Stage { hidden, tokens, block, .. } = stage;
    let (mm, wide) = (w.dt.mm, w.dt.wide);
    let norm = if block.adaln { 2.0 * wide } else { wide };
    let bytes = (norm + mm) * hidden * tokens
        + mm * patch.powi(3) * out_ch * tokens
        + mm * out_ch * input.spatial.voxels() as f64;
    let mut s = Seg::new("final layer", level);
    s.kept = w.act(bytes);
    s.transient = w.c.bwd_transient * s.kept;
    s
}

pub(super) fn walk(m: &DitSpec, input: &Input, out_channels: u32, w: &mut Walk) -> Result<(), PrecheckError> {
    let d = m.dims()?;
    let (h, heads) = (d.hidden as f64, d.heads as f64);
    let grid = input.spatial.div(m.patch.max(1));
    let t = grid.voxels() as f64;
    // The learned position table (`dit.py@3140d97:109`), added in fp32: trained, never cast.
    let mut embed = embed_seg(w, input, None);
    embed.uncast = t * h;
    w.push(embed);
    let stage = Stage::dit(h, heads, t);
    let blk = block_seg(
        w,
        ("transformer blocks", None),
        stage,
        0.0,
        facts::params::dit_block(d.hidden as u64, d.heads as u64),
    );
    for _ in 0..d.depth {
        w.push(blk);
    }
    w.push(head_seg(w, input, stage, (m.patch as f64, out_channels as f64), None));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precheck::{Calibration, Dtypes};
    use facts::Precision;

    fn with_walk<T>(ckpt: bool, f: impl FnOnce(&Walk) -> T) -> T {
        let c = Calibration::builtin().coefficients("pytorch", Precision::Bf16Amp).expect("pytorch fit");
        let mut segs = Vec::new();
        let w = Walk { c: &c, dt: Dtypes::of(Precision::Bf16Amp), batch: 1.0, ckpt, segs: &mut segs };
        f(&w)
    }

    /// Bytes a token one block keeps, SDPA's log-sum-exp (4a) included.
    fn per_token(stage: Stage) -> f64 {
        with_walk(false, |w| block_bytes_per_token(w, &stage) + 4.0 * stage.heads)
    }

    #[test]
    fn the_groups_dit_block_keeps_62h_20a_16_bytes_a_token_with_qk_norm_and_the_output_copy() {
        let (h, a) = (768.0, 12.0);
        let group = Stage::dit(h, a, 1.0);
        assert_eq!(per_token(group), 62.0 * h + 20.0 * a + 16.0);
        // Rows 5, 6 (the qk-norms' f32 copies and statistics) and 8 (the output's copy) gone.
        let plain = Block { qk_norm: false, ..GROUP_DIT };
        assert_eq!(per_token(Stage { block: plain, ..group }), 48.0 * h + 4.0 * a + 16.0);
        // A pre-LN block (U-ViT) as its PyTorch block keeps it: 36h + 4a + 16 (no allowance).
        assert_eq!(per_token(Stage { block: facts::blocks::UVIT, ..group }), 36.0 * h + 4.0 * a + 16.0);
    }

    #[test]
    fn a_checkpointed_block_keeps_its_input_in_the_type_it_receives() {
        let (h, tokens) = (384.0, 1000.0);
        let kept = |half_input| {
            with_walk(true, |w| {
                let stage = Stage { half_input, ..Stage::dit(h, 6.0, tokens) };
                block_seg(w, ("b", None), stage, 0.0, 0).kept
            })
        };
        assert_eq!(kept(false), 4.0 * h * tokens, "an encoder block's fp32 input");
        assert_eq!(kept(true), 2.0 * h * tokens, "a decoder block's bf16 input (after the skip merge)");
    }

    #[test]
    fn the_group_dit_block_counts_its_qk_norm_parameters() {
        // 18h² + 15h and the affine LayerNorm(head_dim) on q and on k: 4 x 64.
        assert_eq!(facts::params::dit_block(384, 6), 18 * 384 * 384 + 15 * 384 + 4 * 64);
    }
}
