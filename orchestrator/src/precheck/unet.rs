//! MONAI `DiffusionModelUNet` (3D): activations saved for backward, level by level.
//!
//! Per ResBlock(cin → cout) at V voxels, under bf16 autocast: GroupNorm upcasts
//! its input to fp32 and saves it (4·cin), SiLU saves the fp32 norm output
//! (4·cin), the conv saves the bf16 cast of the SiLU output (2·cin); the same
//! again at cout after the first conv. Up-path blocks also keep the
//! concatenated input for the 1x1 skip conv (2·cin). Attention blocks save the
//! upcast norm input and output, three bf16 casts for q/k/v, q/k/v themselves
//! and the re-laid-out output (≈ 20·C), plus the heads x N x N score tensors:
//! MONAI runs attention without flash, so scores are materialised.
//! Encoder outputs are held for the decoder's concatenations (skip tensors).

use super::{fmax, TermKind, Walk, WalkInfo};
use spec::{Input, UnetSpec};

/// Per level accumulators (bytes of the physical walk, before coefficients).
#[derive(Default, Clone, Copy)]
struct Level {
    res: f64,
    attn: f64,
    scores: f64,
    skip: f64,
    /// Inputs of up-path blocks (what per-block checkpointing would keep).
    ckpt_inputs: f64,
}

pub(super) fn walk(u: &UnetSpec, input: &Input, out_channels: u32, w: &mut Walk) -> WalkInfo {
    const MAX_LEVELS: usize = 12;
    let levels = u.levels().min(MAX_LEVELS);
    if levels == 0 {
        return WalkInfo::default();
    }
    let ch: Vec<f64> = u.channels.iter().take(levels).map(|&c| c as f64).collect();
    let res = u.res_blocks();
    let heads_ch = u.head_channels();
    let attn_at = |l: usize| u.attention_levels.get(l).copied().unwrap_or(false);
    let sp = input.spatial;
    let vox: Vec<f64> = (0..levels).map(|l| sp.div(1 << l).voxels() as f64).collect();
    let (mm, wide) = (w.dt.mm, w.dt.wide);
    // norm input upcast + norm output + cast for the conv, per channel and voxel.
    let norm_act_conv = wide + wide + mm;
    let res_block = |cin: f64, cout: f64, v: f64, concat: bool| {
        norm_act_conv * (cin + cout) * v + if concat { mm * cin * v } else { 0.0 }
    };
    let heads = |l: usize, c: f64| {
        let hc = heads_ch.get(l).copied().unwrap_or(0).max(1) as f64;
        (c / hc).max(1.0)
    };
    // GroupNorm upcast (wide) + output (wide) + 3 casts (mm) + q,k,v (mm) + output relayout (2 mm).
    let attn_block = |c: f64, v: f64| (2.0 * wide + 8.0 * mm) * c * v;

    let mut lv = [Level::default(); MAX_LEVELS + 1];
    let mut max_block: f64 = 0.0;
    let mut max_block_level = 0;
    let mut max_scores: f64 = 0.0;
    let mut max_scores_level = 0;
    let note = |bytes: f64, l: usize, max_block: &mut f64, at: &mut usize| {
        if bytes > *max_block {
            *max_block = bytes;
            *at = l;
        }
    };

    // Stem: the input cast for conv_in; conv_in's output is the first skip.
    let stem = mm * input.channels as f64 * vox[0];
    lv[0].skip += mm * ch[0] * vox[0];

    // Down path.
    let mut width = ch[0];
    for l in 0..levels {
        let prev = width;
        width = ch[l];
        for j in 0..res[l] {
            let cin = if j == 0 { prev } else { width };
            let b = res_block(cin, width, vox[l], false);
            lv[l].res += b;
            note(b, l, &mut max_block, &mut max_block_level);
            lv[l].skip += mm * width * vox[l];
            if attn_at(l) {
                let a = attn_block(width, vox[l]);
                let s = heads(l, width) * vox[l] * vox[l];
                lv[l].attn += a;
                lv[l].scores += s;
                note(a, l, &mut max_block, &mut max_block_level);
                note(s, l, &mut max_scores, &mut max_scores_level);
            }
        }
        if l + 1 < levels {
            // Downsampler output: one more skip, at the next level's resolution.
            lv[l + 1].skip += mm * width * vox[l + 1];
        }
    }
    // Middle: ResBlock, attention (always), ResBlock at the last level.
    let last = levels - 1;
    let (c, v) = (ch[last], vox[last]);
    for _ in 0..2 {
        let b = res_block(c, c, v, false);
        lv[last].res += b;
        note(b, last, &mut max_block, &mut max_block_level);
    }
    lv[last].attn += attn_block(c, v);
    let s = heads(last, c) * v * v;
    lv[last].scores += s;
    note(s, last, &mut max_scores, &mut max_scores_level);
    lv[last].ckpt_inputs += 3.0 * mm * c * v;

    // Up path: r+1 ResBlocks on concatenated skips, upsample + conv between levels.
    let mut out = ch[last];
    for i in 0..levels {
        let l = last - i;
        let prev = out;
        out = ch[l];
        let skip_in = ch[l.saturating_sub(1)];
        let n = res[l] + 1;
        for j in 0..n {
            let skip = if j + 1 == n { skip_in } else { out };
            let rin = if j == 0 { prev } else { out };
            let b = res_block(rin + skip, out, vox[l], true);
            lv[l].res += b;
            note(b, l, &mut max_block, &mut max_block_level);
            lv[l].ckpt_inputs += mm * out * vox[l];
            if attn_at(l) {
                let a = attn_block(out, vox[l]);
                let s = heads(l, out) * vox[l] * vox[l];
                lv[l].attn += a;
                lv[l].scores += s;
                lv[l].ckpt_inputs += mm * out * vox[l];
                note(a, l, &mut max_block, &mut max_block_level);
                note(s, l, &mut max_scores, &mut max_scores_level);
            }
        }
        if l > 0 {
            // Nearest upsample output (saved by the following conv) at level l-1.
            let b = mm * out * vox[l - 1];
            lv[l - 1].res += b;
            lv[l - 1].ckpt_inputs += b;
        }
    }
    // Output head: GroupNorm, SiLU, conv at full resolution.
    let head = norm_act_conv * ch[0] * vox[0] + mm * out_channels as f64 * vox[0];

    let c = *w.c;
    let bsz = w.batch;
    let a = c.act_scale * bsz;
    // With checkpointing, the in-block share that the runtime still keeps.
    let keep = if w.ckpt { c.unet_ckpt_keep } else { 1.0 };
    w.push("stem and output head", Some(0), TermKind::Activations, a * (stem + head));
    for (l, x) in lv.iter().enumerate().take(levels) {
        w.push("resblocks (norms, convs)", Some(l), TermKind::Activations, a * keep * x.res);
        w.push("attention projections", Some(l), TermKind::Activations, a * keep * x.attn);
        w.push("attention scores", Some(l), TermKind::AttentionScores, bsz * keep * c.score_saved_bytes * x.scores);
        w.push("skip connections", Some(l), TermKind::Skip, a * x.skip);
        if w.ckpt {
            w.push("checkpointed block inputs", Some(l), TermKind::Activations, a * (1.0 - keep) * x.ckpt_inputs);
        }
    }
    if w.ckpt && keep < 1.0 {
        let recompute = fmax(a * max_block, bsz * c.score_saved_bytes * max_scores);
        w.push("checkpoint recompute of one block", Some(max_block_level), TermKind::Workspace, (1.0 - keep) * recompute);
    }
    w.push("attention block at its peak", Some(max_scores_level), TermKind::Workspace, bsz * c.score_transient_bytes * max_scores);
    w.push("backward gradient buffers", Some(max_block_level), TermKind::Workspace, a * c.bwd_transient * max_block);
    WalkInfo::default()
}
