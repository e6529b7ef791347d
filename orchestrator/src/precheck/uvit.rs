//! U-ViT (Bao et al.): pre-LN transformer blocks over [time token; patches],
//! long skips from the first half to the second (out-blocks concatenate the skip
//! and project 2h → h), learned positions, a 3x3x3 conv after unpatchify.
//!
//! Without checkpointing every block keeps its walk (see `dit.rs`; a pre-LN
//! block is counted as 4 wide + 15 bf16 elements of h per token) and out-blocks also keep the bf16
//! cast of the concatenation (2h). With checkpointing (the group's runs) only
//! the block inputs stay (the fp32 residual stream up to the first out-block,
//! the out-blocks' bf16 outputs after it; the in-block outputs double as the
//! skips) and one block is recomputed at a time during backward.

use super::dit::{block_seg, embed_seg, head_seg, Stage};
use super::{PrecheckError, Walk};
use facts::params::uvit_block;
use facts::{Input, UvitSpec};

pub(super) fn walk(m: &UvitSpec, input: &Input, w: &mut Walk) -> Result<(), PrecheckError> {
    let d = m.dims()?;
    let (h, heads) = (d.hidden as f64, d.heads as f64);
    let hu = d.hidden as u64;
    let t = input.spatial.div(m.patch.max(1)).voxels() as f64 + 1.0; // + time token
    let half = d.depth / 2;
    w.push(embed_seg(w, input, h, t, None));
    let stage = Stage { hidden: h, heads, tokens: t, block: facts::blocks::UVIT, half_input: false };
    let plain = block_seg(w, ("transformer blocks", None), stage, 0.0, uvit_block(hu));
    // Out-blocks: cast of [x; skip] for the skip Linear(2h → h). Their output is
    // bf16 (the skip merge's), so each out-block after the first receives bf16.
    let with_skip = ("transformer blocks (with long skip)", None);
    let out_params = uvit_block(hu) + 2 * hu * hu + hu;
    let first_out = block_seg(w, with_skip, stage, 2.0 * w.dt.mm * h, out_params);
    let later_out = block_seg(w, with_skip, Stage { half_input: true, ..stage }, 2.0 * w.dt.mm * h, out_params);
    // In-blocks' outputs are the long skips; each out-block's backward makes the
    // skip's fp32 gradient, held until the matching in-block's backward.
    let skip_grad = w.exact(w.dt.wide * h * t);
    let first_in = w.segs.len();
    for _ in 0..(d.depth - half) {
        w.push(plain);
    }
    // The fp32 concatenation [x; skip] and its gradient exist while an out-block runs.
    let concat = w.exact(2.0 * w.dt.wide * h * t);
    for j in 0..half as usize {
        let mut s = if j == 0 { first_out } else { later_out };
        s.transient += concat;
        s.bwd_alloc = skip_grad;
        w.segs[first_in + half as usize - 1 - j].bwd_free += skip_grad;
        w.push(s);
    }
    // Head: norm, predictor, unpatchify, then the 3x3x3 conv at full resolution.
    let mut head = head_seg(w, input, stage, (m.patch as f64, input.channels as f64), None);
    let (c, v) = (input.channels as f64, input.spatial.voxels() as f64);
    head.kept += w.act(w.dt.mm * c * v);
    // The conv's column buffer while it runs (PyTorch's native 3D convolution,
    // as the group's runs convolved: see the UNet walk), 27·C a voxel.
    head.transient += w.exact(27.0 * w.dt.mm * c * v);
    w.push(head);
    Ok(())
}
