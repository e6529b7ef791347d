//! Hourglass DiT: adaLN DiT blocks at several token resolutions; between levels
//! a 2x2x2 token merge (Linear 8h → h) on the way down, a split (Linear h → 8h)
//! on the way up, and a skip merge (Linear 2h → h on the concatenation).
//!
//! Blocks follow the DiT walk (see `dit.rs`) at each level's token count; with
//! checkpointing (the group's runs) each block keeps only its fp32 input and
//! one block (the largest: full resolution) is recomputed at a time. The
//! transitions are not checkpointed and keep their bf16 input casts; the
//! encoder output of every level is held for the decoder.

use super::dit::{attention, block_bytes_per_token, embed_and_head, push_stack, push_transients, Stack};
use super::{PrecheckError, TermKind, Walk, WalkInfo};
use spec::{HditSpec, Input};

pub(super) fn walk(m: &HditSpec, input: &Input, out_channels: u32, w: &mut Walk) -> Result<WalkInfo, PrecheckError> {
    let d = m.dims()?;
    let (h, heads) = (d.hidden as f64, d.heads as f64);
    let n = m.level_depths.len();
    let levels = m.levels();
    let mut t = input.spatial.div(m.patch.max(1)).voxels() as f64;
    let (mm, wide) = (w.dt.mm, w.dt.wide);
    let a = w.c.act_scale * w.batch;
    let (mut max_block, mut max_scores, mut max_level) = (0.0f64, 0.0f64, 0usize);
    let t0 = t;
    for l in 0..levels {
        // Blocks at this level: down and up share the level, the bottleneck once.
        let blocks_here = if l + 1 == levels {
            m.level_depths.get(l).copied().unwrap_or(0)
        } else {
            m.level_depths.get(l).copied().unwrap_or(0) + m.level_depths.get(n - 1 - l).copied().unwrap_or(0)
        } as f64;
        let (attn_saved, scores) = attention(w, heads, t);
        let block = block_bytes_per_token(w, h, true) * t + attn_saved;
        if block > max_block {
            max_block = block;
            max_scores = scores;
            max_level = l;
        }
        let s = Stack {
            blocks: blocks_here * block,
            max_block: block,
            scores: blocks_here * scores,
            max_scores: scores,
            ckpt_inputs: blocks_here * wide * h * t,
        };
        push_stack(w, &s, Some(l));
        if l + 1 < levels {
            // Merge input cast, split input cast (at the coarser level), skip-merge cast of [x; skip].
            let transitions = mm * h * t + mm * h * t / 8.0 + 2.0 * mm * h * t;
            w.push("token merge / split / skip merge", Some(l), TermKind::Activations, a * transitions);
            w.push("skip (encoder output held for the decoder)", Some(l), TermKind::Skip, a * wide * h * t);
        }
        t /= 8.0;
    }
    let eh = embed_and_head(w, input, h, t0, m.patch as f64, out_channels as f64, true);
    w.push("patch embed and final layer", Some(0), TermKind::Activations, a * eh);
    push_transients(w, max_block, max_scores, Some(max_level));
    Ok(WalkInfo::default())
}
