//! DiT (adaLN-Zero blocks over patch tokens) and the transformer block walk the
//! other transformer families share.
//!
//! What one block keeps for backward per token, under bf16 autocast (h hidden,
//! a heads; the appendix of the group-code notes, from
//! `src/medgen/models/dit_blocks.py@3140d97` in `ModeS7/AIS4900_master`):
//!
//! - the group's DiT block (DiT, HDiT: adaLN-Zero, qk-norm): the fp32 norm
//!   inputs and outputs (4 wide), the fp32 copies of q and k its qk-norm keeps
//!   (2 wide), the bf16 cast for qkv, qkv (3), the normed q and k cast for
//!   SDPA (2), its output and the output's re-layout copy before `proj` (the
//!   output is laid out like the contiguous normed q), the projection output
//!   (kept by the gate), the MLP's cast, fc1 and GELU outputs (4 each) and fc2
//!   output (gate): 6 wide + 19 half elements of h, 62h bytes; the two
//!   LayerNorms' and the qk-norms' row statistics (16 + 16a bytes) and SDPA's
//!   log-sum-exp (4a);
//! - without qk-norm (rows 5, 6 and 8 gone) 4 wide + 16 half: 48h + 4a + 16;
//! - a pre-LN block (U-ViT: no modulation, no gates, no qk-norm) keeps the fp32
//!   norm inputs (2 wide), the casts, qkv (3), the output, fc1 and GELU (4
//!   each): 2 wide + 14 half, 36h + 4a + 16; the walk counts it 46h (see
//!   `block_bytes_per_token`).
//!
//! Memory-efficient attention (PyTorch SDPA) keeps only the per-head
//! log-sum-exp; runtimes that materialise scores add heads x N x N per block.

use super::{PrecheckError, Seg, Walk};
use spec::{DitSpec, Input};

/// Saved bytes per token of one transformer block of `stage` (see above).
pub(super) fn block_bytes_per_token(w: &Walk, stage: &Stage) -> f64 {
    let (mm, wide) = (w.dt.mm, w.dt.wide);
    let Stage { hidden, heads, adaln, qk_norm, .. } = *stage;
    // Row statistics (mean and rstd, f32) of the two LayerNorms, and of q's and k's per head.
    let stats = 16.0 + if qk_norm { 16.0 * heads } else { 0.0 };
    let (mut wides, mut halves) = if adaln {
        // norm in/out x2; cast, qkv 3, out, proj out, cast, fc1 4, gelu 4, fc2 out
        (4.0, 16.0)
    } else {
        // A pre-LN block (U-ViT) is counted as before the group's code was
        // read: norm inputs and outputs x2 (4 wide), cast, qkv 3, out, its
        // re-layout, proj, cast, fc1 4, gelu 4, fc2 (15 half), 46h. What its
        // PyTorch block keeps is 36h + 4a + 16 (2 wide + 14 half); the 10h
        // more stand for what the walk does not see of a checkpointed U-ViT's
        // backward (U-ViT-S p4 peaks there at 10.3 GiB), and the fit holds
        // U-ViT and HDiT together only so (recompute 0.99 and 1.44 otherwise).
        (4.0, 15.0)
    };
    if qk_norm {
        // The normed q, k casts and the output's re-layout copy; under
        // autocast the f32 copies of q and k the norms take (in fp32 they keep
        // views of qkv).
        halves += 3.0;
        if w.dt.autocast {
            wides += 2.0;
        }
    }
    (wides * wide + halves * mm) * hidden + stats
}

/// The shape of a transformer stage: width, heads, tokens, whether its norms
/// are adaLN-modulated (DiT, HDiT) or plain (U-ViT), whether its attention
/// normalises q and k (the group's DiT and HDiT), and whether its blocks
/// receive their input in the half type (HDiT's decoder after the bf16 skip
/// merge, U-ViT's out-blocks after the first): a checkpointed block keeps it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stage {
    pub hidden: f64,
    pub heads: f64,
    pub tokens: f64,
    pub adaln: bool,
    pub qk_norm: bool,
    pub half_input: bool,
}

impl Stage {
    /// The group's DiT block (adaLN, qk-norm) at `tokens`, fp32 input.
    pub fn dit(hidden: f64, heads: f64, tokens: f64) -> Stage {
        Stage { hidden, heads, tokens, adaln: true, qk_norm: true, half_input: false }
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
    let Stage { hidden, heads, tokens, half_input, .. } = stage;
    let c = w.c;
    let (saved_attn, score_elems, chunk_elems) = if c.transformer_scores_materialised {
        (0.0, heads * tokens * tokens, 0.0)
    } else {
        // logsumexp per head and query, fp32; a chunked kernel's f32 score tile while it runs.
        (4.0 * heads * tokens, 0.0, (heads * tokens * tokens).min(c.attention_chunk_bytes / 4.0))
    };
    let raw = (block_bytes_per_token(w, &stage) + extra_per_token) * tokens + saved_attn;
    let full = w.act(raw);
    let scores = w.batch * c.score_saved_bytes * w.dt.score_scale() * score_elems;
    let mut s = Seg::new(name, level);
    if w.ckpt {
        let input = if half_input { w.dt.mm } else { w.dt.wide };
        s.kept = w.exact(input * hidden * tokens);
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

pub(super) fn walk(m: &DitSpec, input: &Input, out_channels: u32, w: &mut Walk) -> Result<(), PrecheckError> {
    let d = m.dims()?;
    let (h, heads) = (d.hidden as f64, d.heads as f64);
    let grid = input.spatial.div(m.patch.max(1));
    let t = grid.voxels() as f64;
    w.push(embed_seg(w, input, h, t, None));
    let stage = Stage::dit(h, heads, t);
    let blk = block_seg(
        w,
        ("transformer blocks", None),
        stage,
        0.0,
        spec::params::dit_block(d.hidden as u64, d.heads as u64),
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
    use spec::Precision;

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
        assert_eq!(per_token(Stage { qk_norm: false, ..group }), 48.0 * h + 4.0 * a + 16.0);
        // A pre-LN block (U-ViT), as the walk counts it (46h: see block_bytes_per_token).
        assert_eq!(per_token(Stage { adaln: false, qk_norm: false, ..group }), 46.0 * h + 4.0 * a + 16.0);
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
        assert_eq!(spec::params::dit_block(384, 6), 18 * 384 * 384 + 15 * 384 + 4 * 64);
    }
}
