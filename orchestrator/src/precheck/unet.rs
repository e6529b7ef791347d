//! MONAI `DiffusionModelUNet` (3D): activations saved for backward, block by block.
//!
//! Per ResBlock(cin → cout) at V voxels, under bf16 autocast: GroupNorm upcasts
//! its input to fp32 and saves it (4·cin), SiLU saves the fp32 norm output
//! (4·cin), the conv saves the bf16 cast of the SiLU output (2·cin); the same
//! again at cout after the first conv. Up-path blocks also keep the
//! concatenated input for the 1x1 skip conv (2·cin). Attention blocks save the
//! upcast norm input and output, three bf16 casts for q/k/v, q/k/v themselves
//! and the re-laid-out output (≈ 20·C), plus the heads x N x N score tensors:
//! MONAI runs attention without flash, so scores are materialised.
//! Encoder outputs are held for the decoder's concatenations (skip tensors)
//! until the backward pass reaches the encoder block that made them.

use super::{Seg, Walk, WalkInfo};
use spec::params::{unet_attention, unet_res_block};
use spec::{Input, UnetSpec};

pub(super) fn walk(u: &UnetSpec, input: &Input, out_channels: u32, w: &mut Walk) -> WalkInfo {
    let levels = u.levels().min(16);
    if levels == 0 {
        return WalkInfo::default();
    }
    let ch = |l: usize| u.channels[l] as f64;
    let chu = |l: usize| u.channels[l] as u64;
    // Per-level values as `PerLevel::expand` gives them, without allocating.
    let per_level = |p: &spec::PerLevel, l: usize| match p {
        spec::PerLevel::All(v) => *v,
        spec::PerLevel::Each(v) => v.get(l).or(v.last()).copied().unwrap_or(0),
    };
    let res = |l: usize| per_level(&u.num_res_blocks, l);
    let attn_at = |l: usize| u.attention_levels.get(l).copied().unwrap_or(false);
    let sp = input.spatial;
    let vox = |l: usize| sp.div(1 << l).voxels() as f64;
    let temb = 4 * chu(0);
    let (mm, wide) = (w.dt.mm, w.dt.wide);
    let c = *w.c;
    let bsz = w.batch;
    // With checkpointing, the share of in-block activations the runtime still keeps.
    let keep = if w.ckpt { c.unet_ckpt_keep } else { 1.0 };
    // norm input upcast + norm output + cast for the conv, per channel and voxel.
    let nac = wide + wide + mm;

    // A block with `full` saved bytes (walk), `input` bytes (its bf16 input, what
    // checkpointing keeps), `score_elems` materialised scores.
    let block = |w: &Walk, name: &'static str, l: usize, full: f64, input: f64, score_elems: f64, params: u64| {
        let mut s = Seg::new(name, Some(l));
        let full_b = w.act(full);
        let scores_b = bsz * c.score_saved_bytes * w.dt.score_scale() * score_elems;
        s.kept = keep * full_b + (1.0 - keep) * w.exact(input);
        s.scores = keep * scores_b;
        s.recompute = (1.0 - keep) * (full_b + scores_b);
        s.transient = c.bwd_transient * full_b + bsz * c.score_transient_bytes * w.dt.score_scale() * score_elems;
        s.params = params as f64;
        s
    };
    let heads = |l: usize, width: f64| {
        let hc = per_level(&u.num_head_channels, l).max(1) as f64;
        (width / hc).max(1.0)
    };
    // GroupNorm upcast and output (wide) + 3 casts, q, k, v, output relayout, proj input (mm).
    let attn_full = |width: f64, v: f64| (2.0 * wide + 8.0 * mm) * width * v;

    // Stem: input cast for conv_in; conv_in's output is the first skip.
    let mut stem = Seg::new("stem (conv_in)", Some(0));
    stem.kept = w.act(mm * input.channels as f64 * vox(0));
    stem.skip = w.exact(mm * ch(0) * vox(0));
    // Skips are consumed last-in first-out by the decoder; the gradient of each
    // is held from the consuming block's backward to the producing block's.
    let mut skips = SkipStack::default();
    skips.push((w.segs.len(), stem.skip));
    w.push(stem);

    // Down path: r ResBlocks (+ attention) per level, stride-2 conv between levels.
    let mut width = chu(0);
    for l in 0..levels {
        let prev = width;
        width = chu(l);
        let (cw, v) = (ch(l), vox(l));
        for j in 0..res(l) {
            let cin = if j == 0 { prev } else { width };
            let mut s = block(
                w,
                "resblocks (norms, convs)",
                l,
                nac * (cin + width) as f64 * v,
                mm * cin as f64 * v,
                0.0,
                unet_res_block(cin, width, temb),
            );
            if attn_at(l) {
                w.push(s);
                s = block(
                    w,
                    "attention projections",
                    l,
                    attn_full(cw, v),
                    mm * cw * v,
                    heads(l, cw) * v * v,
                    unet_attention(width),
                );
            }
            s.skip = w.exact(mm * cw * v);
            skips.push((w.segs.len(), s.skip));
            w.push(s);
        }
        if l + 1 < levels {
            let mut s = Seg::new("downsample convs", Some(l));
            s.skip = w.exact(mm * cw * vox(l + 1));
            s.params = (27 * width * width + width) as f64;
            skips.push((w.segs.len(), s.skip));
            w.push(s);
        }
    }
    // Middle: ResBlock, attention (always), ResBlock at the last level.
    let last = levels - 1;
    let (cl, vl) = (ch(last), vox(last));
    let wl = chu(last);
    let rb = block(
        w,
        "resblocks (norms, convs)",
        last,
        nac * 2.0 * cl * vl,
        mm * cl * vl,
        0.0,
        unet_res_block(wl, wl, temb),
    );
    w.push(rb);
    let at = block(
        w,
        "attention projections",
        last,
        attn_full(cl, vl),
        mm * cl * vl,
        heads(last, cl) * vl * vl,
        unet_attention(wl),
    );
    w.push(at);
    w.push(rb);

    // Up path: r+1 ResBlocks on concatenated skips (+ attention), upsample + conv between.
    for up in u.up_path() {
        let (l, out) = (up.level, up.width as u64);
        let (co, v) = (ch(l), vox(l));
        for cin in up.block_inputs.into_iter().map(u64::from) {
            let full = nac * (cin + out) as f64 * v + mm * cin as f64 * v;
            let mut s =
                block(w, "resblocks (norms, convs)", l, full, mm * cin as f64 * v, 0.0, unet_res_block(cin, out, temb));
            if let Some((producer, bytes)) = skips.pop() {
                s.bwd_alloc = bytes;
                w.segs[producer].bwd_free += bytes;
            }
            w.push(s);
            if attn_at(l) {
                w.push(block(
                    w,
                    "attention projections",
                    l,
                    attn_full(co, v),
                    mm * co * v,
                    heads(l, co) * v * v,
                    unet_attention(out),
                ));
            }
        }
        if l > 0 {
            // Nearest upsample output, saved by the following conv, at level l-1.
            let up = mm * co * vox(l - 1);
            w.push(block(w, "upsample convs", l - 1, up, up, 0.0, 27 * out * out + out));
        }
    }
    // Output head: GroupNorm, SiLU, conv at full resolution.
    let head = nac * ch(0) * vox(0) + mm * out_channels as f64 * vox(0);
    let mut s = Seg::new("output head", Some(0));
    s.kept = w.act(head);
    s.transient = c.bwd_transient * w.act(head);
    w.push(s);
    WalkInfo::default()
}

/// Skip tensors waiting for the decoder (producer segment, bytes), last in first
/// out; fixed capacity so the walk does not allocate (at most 1 + Σ(r+1) per UNet
/// level; beyond the capacity the oldest are simply not paired).
struct SkipStack {
    items: [(usize, f64); 128],
    len: usize,
}

impl Default for SkipStack {
    fn default() -> Self {
        SkipStack { items: [(0, 0.0); 128], len: 0 }
    }
}

impl SkipStack {
    fn push(&mut self, item: (usize, f64)) {
        if self.len < self.items.len() {
            self.items[self.len] = item;
            self.len += 1;
        }
    }
    fn pop(&mut self) -> Option<(usize, f64)> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        Some(self.items[self.len])
    }
}
