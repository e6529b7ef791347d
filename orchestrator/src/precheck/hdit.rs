//! Hourglass DiT: adaLN DiT blocks at several token resolutions; between levels
//! a 2x2x2 token merge (Linear 8h → h) on the way down, a split (Linear h → 8h)
//! on the way up, and a skip merge (Linear 2h → h on the concatenation).
//!
//! Blocks follow the DiT walk (see `dit.rs`) at each level's token count; with
//! checkpointing (the group's runs) each block keeps only its input (fp32 in
//! the encoder and the middle, bf16 in the decoder, after the skip merge) and
//! is recomputed at its backward. The transitions are not checkpointed and keep
//! their bf16 input casts; each level's encoder output is held for the decoder.

use super::dit::{block_seg, embed_seg, head_seg, Stage};
use super::{PrecheckError, Seg, Walk};
use facts::{HditSpec, Input};

pub(super) fn walk(m: &HditSpec, input: &Input, out_channels: u32, w: &mut Walk) -> Result<(), PrecheckError> {
    let d = m.dims()?;
    let (h, heads) = (d.hidden as f64, d.heads as f64);
    let hu = d.hidden as u64;
    let n = m.level_depths.len();
    let levels = m.levels();
    let t0 = input.spatial.div(m.patch.max(1)).voxels() as f64;
    let tokens = |l: usize| t0 / 8f64.powi(l as i32);
    let stage = |l: usize| Stage::dit(h, heads, tokens(l));
    // The decoder's blocks receive the bf16 output of the skip merge Linear(2h, h).
    let decoder = |l: usize| Stage { half_input: true, ..stage(l) };
    let (mm, wide) = (w.dt.mm, w.dt.wide);
    let block_params = facts::params::dit_block(hu, d.heads as u64);
    // One learned position table a level, added in fp32: trained, never cast.
    let mut embed = embed_seg(w, input, Some(0));
    embed.uncast = (0..levels).map(|l| tokens(l) * h).sum();
    w.push(embed);
    let mut merges = Vec::with_capacity(levels);
    // Down: blocks, then merge to the next level (its input cast; the level output is a skip).
    for l in 0..levels {
        let mut blk = block_seg(w, ("transformer blocks", Some(l)), stage(l), 0.0, block_params);
        if w.ckpt {
            // The gradient arriving at its output: the fp32 residual stream's.
            blk.transient += w.exact(wide * h * tokens(l));
        }
        for _ in 0..m.level_depths.get(l).copied().unwrap_or(0) {
            w.push(blk);
        }
        if l + 1 < levels {
            let mut s = Seg::new("token merge", Some(l));
            s.kept = w.act(mm * h * tokens(l));
            s.skip = w.exact(wide * h * tokens(l));
            s.params = (8 * hu * hu + hu) as f64;
            merges.push((w.segs.len(), s.skip));
            w.push(s);
        }
    }
    // Up: split back to level l, skip merge of [x; skip], blocks.
    for l in (0..levels.saturating_sub(1)).rev() {
        let mut s = Seg::new("token split and skip merge", Some(l));
        s.kept = w.act(mm * h * tokens(l + 1) + 2.0 * mm * h * tokens(l));
        s.params = (8 * hu * hu + 8 * hu + 2 * hu * hu + hu) as f64;
        // The fp32 concatenation [x; skip] and its gradient while the skip merge runs.
        s.transient = w.exact(2.0 * wide * h * tokens(l));
        // The skip's gradient is held until the merge that produced it: the
        // backward of `cat([x, skip])` hands out views of the whole
        // concatenation's gradient (fp32, [N, 2h]), so it holds twice the skip.
        // The skip itself is kept by nothing once concatenated (the merge
        // keeps its bf16 cast; the encoder blocks are checkpointed on their
        // inputs): freed by this forward, not held through backward.
        if let Some((producer, bytes)) = merges.pop() {
            s.bwd_alloc = 2.0 * bytes;
            s.fwd_free = bytes;
            w.segs[producer].bwd_free += 2.0 * bytes;
            w.segs[producer].skip_consumed = true;
        }
        w.push(s);
        let mut blk = block_seg(w, ("transformer blocks", Some(l)), decoder(l), 0.0, block_params);
        if w.ckpt {
            // The gradient arriving at its output: the bf16 stream's after the skip merge.
            blk.transient += w.exact(mm * h * tokens(l));
        }
        for _ in 0..m.level_depths.get(n - 1 - l).copied().unwrap_or(0) {
            w.push(blk);
        }
    }
    w.push(head_seg(w, input, stage(0), (m.patch as f64, out_channels as f64), Some(0)));
    Ok(())
}
