//! U-ViT (Bao et al.), as the group's `src/medgen/models/uvit.py@ff513e0`
//! builds it: pre-LN blocks over [time token; patches], long skips from the
//! first half to the second, learned positions, a 3x3x3 conv after unpatchify.
//!
//! The facts the walk counts, each from the group's code (`uvit.py@ff513e0`
//! unless named) and checked against the H100 reference
//! (`data/gpu-check/2026-11-27-h100/probe-transformers.jsonl`, the group's
//! model rebuilt, cuDNN off as the group's runs: see the test below):
//!
//! * blocks: `LayerNorm(h, eps=1e-6)` pre-norms (`:71,79`; the eps changes
//!   no byte), qkv without bias, no qk-norm (`:65-66`), MLP 4h with GELU tanh
//!   (`:80-81`, `dit_blocks.py@ff513e0:262-264`): what such a block keeps is
//!   `facts::blocks::UVIT` (36h + 4a + 16 a token under bf16 autocast);
//! * `depth // 2` in-blocks, one mid block, `depth // 2` out-blocks
//!   (`:223-257`); each in-block's output is kept as a long skip (`:398-401`)
//!   and each out-block first fuses it, `skip_linear(cat([x, skip]))`
//!   (`:84,95-96`): the out-block keeps the bf16 cast of the concatenation
//!   (4h) beyond the plain block;
//! * checkpointing wraps the blocks only, non-reentrant (`:327-333`): a
//!   block keeps its inputs and is recomputed at its backward;
//! * the head: `LayerNorm`, `Linear(h, p³·C)`, strip the time token,
//!   unpatchify, `Conv3d(C, C, 3, padding=1)` at full resolution
//!   (`:260-274,410-426`).

use super::dit::{block_seg, embed_seg, Stage};
use super::{PrecheckError, Seg, Walk};
use facts::params::uvit_block;
use facts::{Input, UvitSpec};

pub(super) fn walk(m: &UvitSpec, input: &Input, w: &mut Walk) -> Result<(), PrecheckError> {
    let d = m.dims()?;
    let (h, heads) = (d.hidden as f64, d.heads as f64);
    let hu = d.hidden as u64;
    let t = input.spatial.div(m.patch.max(1)).voxels() as f64 + 1.0; // + time token (`:395`)
    let half = d.depth / 2;
    // [time; patches] + pos_embed (`:212-214,395`): the fp32 table is added
    // as it is, an fp32 stream; autocast never casts the table (no bf16 copy).
    let mut embed = embed_seg(w, input, None);
    embed.uncast = t * h;
    w.push(embed);
    let stage = Stage { hidden: h, heads, tokens: t, block: facts::blocks::UVIT, half_input: false };
    // The gradient arriving at an in-block or the mid block is a skip
    // gradient's sibling view (below), held already.
    let plain = block_seg(w, ("transformer blocks", None), stage, 0.0, uvit_block(hu));
    // Out-blocks keep the bf16 cast of [x; skip] for skip_linear (`:96`). Its
    // output is bf16, so each out-block's residual stream and output are
    // bf16, and every out-block after the first receives bf16.
    let with_skip = ("transformer blocks (with long skip)", None);
    let out_params = uvit_block(hu) + 2 * hu * hu + hu;
    let cat_cast = 2.0 * w.dt.mm * h;
    // The gradient arriving at an out-block's output is new, bf16 (made by
    // the next out-block's cast, or the final norm's).
    let incoming = w.exact(w.dt.mm * h * t);
    let mut first_out = block_seg(w, with_skip, stage, cat_cast, out_params);
    first_out.transient += incoming;
    let mut later_out = block_seg(w, with_skip, Stage { half_input: true, ..stage }, cat_cast, out_params);
    later_out.transient += incoming;
    // The skip's gradient: the backward of `cat([x, skip])` hands out views of
    // the gradient of the whole concatenation, in its wide type ([N, 2h]:
    // promoted to fp32 by autocast, the skip being fp32), so each skip's
    // gradient holds 2h wide elements a token until the in-block that made
    // the skip has its gradient summed (H100 reference: U-ViT-S p4 peaks at
    // the first out-block's backward, 10.3 GiB, five of these held).
    let skip_grad = w.exact(2.0 * w.dt.wide * h * t);
    let first_in = w.segs.len();
    for _ in 0..(d.depth - half) {
        w.push(plain);
    }
    for j in 0..half as usize {
        let mut s = if j == 0 { first_out } else { later_out };
        s.bwd_alloc = skip_grad;
        w.segs[first_in + half as usize - 1 - j].bwd_free += skip_grad;
        w.push(s);
    }
    w.push(head(w, input, (h, t), m.patch as f64));
    Ok(())
}

/// The head (`:410-426`): the final LayerNorm keeps its input cast to fp32
/// (the last out-block's output is bf16), the predictor keeps its bf16 cast;
/// its output is unpatchified into a copy, which the 3x3x3 conv keeps, and
/// the conv's output (the prediction the script holds). While the conv runs,
/// its column buffer: PyTorch's native 3D convolution, as the group's runs
/// convolved (cuDNN off: data/gpu-check/2026-11-27-h100), unfolds 27·C
/// elements a voxel.
fn head(w: &Walk, input: &Input, (h, t): (f64, f64), patch: f64) -> Seg {
    let (mm, wide) = (w.dt.mm, w.dt.wide);
    let (c, v) = (input.channels as f64, input.spatial.voxels() as f64);
    let mut s = Seg::new("final layer", None);
    s.kept = w.act((wide + mm) * h * t) + w.exact(2.0 * mm * c * v);
    // The predictor's output, [N, p³·C], until unpatchify has copied it.
    let pred = w.exact(mm * patch.powi(3) * c * (t - 1.0));
    s.transient = pred.max(w.exact(27.0 * mm * c * v));
    s
}

#[cfg(test)]
mod tests {
    use crate::precheck::Predictor;
    use facts::{Input, ModelSpec, Precision, RunConfig, Spatial, UvitSpec, Variant};

    fn uvit(variant: Variant, patch: u32) -> RunConfig {
        RunConfig {
            experiment: "t".into(),
            name: "t".into(),
            model: ModelSpec::Uvit(UvitSpec { variant: Some(variant), hidden: None, heads: None, depth: None, patch }),
            input: Input { channels: 2, spatial: Spatial::new(160, 256, 256) },
            out_channels: 2,
            batch: 1,
            precision: Precision::Bf16Amp,
            grad_ckpt: true,
            mode: facts::Mode::Profile,
            steps: 1,
            gpu: facts::Gpu::A100Pcie80,
            training: None,
        }
    }

    /// The H100 check's PyTorch reference (the group's U-ViT rebuilt, its
    /// `transformer` protocol, cuDNN off as the group's runs): the peaks of
    /// `data/gpu-check/2026-11-27-h100/probe-transformers.jsonl`, mode
    /// `no-cudnn` (`marks.step`, bytes): uvit_S_p8 2258428928, uvit_M_p8
    /// 3385353728, uvit_S_p4 11076985856. The group printed 2.1, 3.2 and 10.3
    /// GiB. The walk, with the shipped fit, must land within that rounding.
    #[test]
    fn the_walk_matches_the_h100_reference_of_the_groups_uvit_within_the_rounding() {
        let reference = [(Variant::S, 8, 2258428928.0), (Variant::M, 8, 3385353728.0), (Variant::S, 4, 11076985856.0)];
        let pred = Predictor::pytorch();
        let mut off = Vec::new();
        for (variant, patch, bytes) in reference {
            let got = pred.predict_peak(&uvit(variant, patch)).unwrap().peak_gib();
            let want = bytes / crate::precheck::GIB;
            eprintln!("U-ViT-{variant} p{patch}: walk {got:.3} GiB, reference {want:.3} GiB");
            if std::env::var_os("UVIT_TERMS").is_some() {
                for t in pred.predict(&uvit(variant, patch)).unwrap().peak_terms() {
                    eprintln!("   {:<48} {:?} {:.4}", t.name, t.level, t.bytes / crate::precheck::GIB);
                }
            }
            if (got - want).abs() > 0.05 {
                off.push(format!("U-ViT-{variant} p{patch}: walk {got:.3} GiB, reference {want:.3}"));
            }
        }
        assert!(off.is_empty(), "outside the 0.1 GiB rounding: {off:?}");
    }
}
