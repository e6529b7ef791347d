//! U-ViT (Bao et al.): pre-LN transformer blocks over [time token; patches],
//! long skips from the first half to the second (out-blocks concatenate the skip
//! and project 2h → h), learned positions, a 3x3x3 conv after unpatchify.
//!
//! Without checkpointing every block keeps its walk (see `dit.rs`; pre-LN keeps
//! 4 wide + 15 bf16 elements of h per token) and out-blocks also keep the bf16
//! cast of the concatenation (2h). With checkpointing (the group's runs) only
//! the block inputs stay (fp32 residual stream; the in-block outputs double as
//! the skips) and one block is recomputed at a time during backward.

use super::dit::{attention, block_bytes_per_token, embed_and_head, push_stack, push_transients, Stack};
use super::{PrecheckError, TermKind, Walk, WalkInfo};
use spec::{Input, UvitSpec};

pub(super) fn walk(m: &UvitSpec, input: &Input, w: &mut Walk) -> Result<WalkInfo, PrecheckError> {
    let d = m.dims()?;
    let (h, heads, depth) = (d.hidden as f64, d.heads as f64, d.depth as f64);
    let t = input.spatial.div(m.patch.max(1)).voxels() as f64 + 1.0; // + time token
    let half = (d.depth / 2) as f64;
    let (attn_saved, scores) = attention(w, heads, t);
    let plain = block_bytes_per_token(w, h, false) * t + attn_saved;
    let out_block = plain + 2.0 * w.dt.mm * h * t;
    let stream = w.dt.wide * h * t;
    let s = Stack {
        blocks: (depth - half) * plain + half * out_block,
        max_block: out_block,
        scores: depth * scores,
        max_scores: scores,
        // Block inputs and the final output, less the skips pushed separately.
        ckpt_inputs: (depth + 1.0 - half) * stream,
    };
    let a = w.c.act_scale * w.batch;
    let eh = embed_and_head(w, input, h, t, m.patch as f64, input.channels as f64, false)
        + 2.0 * w.dt.mm * input.channels as f64 * input.spatial.voxels() as f64;
    w.push("patch embed and output head", None, TermKind::Activations, a * eh);
    if w.ckpt {
        w.push("long skips (in-block outputs)", None, TermKind::Skip, a * half * stream);
    }
    push_stack(w, &s, None);
    push_transients(w, s.max_block, s.max_scores, None);
    Ok(WalkInfo::default())
}
