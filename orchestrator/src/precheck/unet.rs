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
//!
//! Every 3x3x3 convolution also unfolds its input into a column buffer while
//! it runs, forward and backward: 27·cin elements a voxel. The group's runs
//! convolved so (PyTorch's native 3D convolution, not cuDNN's kernels: with
//! cuDNN off PyTorch reproduces their UNet records, with it 48 of 64 read low;
//! data/gpu-check/2026-11-27-h100/RUN.md), so the walk holds the largest
//! buffer of a block as one of its transients.
//!
//! With `grad_ckpt`, each level block runs under `torch.utils.checkpoint` as
//! the group's pixel scripts wrap MONAI's UNet from outside
//! (`misc/profiling/profile_pixel_3d_unet.py@b8e04ab:32-48`): every
//! `down_blocks[i]` (a level's ResBlocks, attention and downsampler), the
//! `middle_block` and every `up_blocks[i]` (ResBlocks on the skips, attention,
//! upsampler); the stem and the output head are not wrapped. See [`checkpoint`].

use super::{Coefficients, Seg, Walk};
use spec::params::{unet_attention, unet_res_block};
use spec::{Input, UnetSpec};

pub(super) fn walk(u: &UnetSpec, input: &Input, out_channels: u32, w: &mut Walk) {
    let levels = u.levels().min(16);
    if levels == 0 {
        return;
    }
    let net = Net::new(u, input, w);
    // Skips are consumed last-in first-out by the decoder; the gradient of each
    // is held from the consuming block's backward to the producing block's.
    let mut skips = SkipStack::default();
    net.stem(w, input, &mut skips);
    net.down(w, levels, &mut skips);
    net.middle(w, levels - 1);
    net.up(w, &mut skips);
    net.head(w, out_channels);
}

/// Checkpoints the level block made of the segments from `first` on, whose
/// input is `input` bytes not held otherwise. Forward keeps that input alone:
/// the block's outputs are skips (held as before) or the next block's input.
/// At the block's backward its saved activations come back all at once, before
/// its last segment's backward, and leave segment by segment: segment j
/// recomputes what segments `first..=j` saved (times `recompute_scale`, as
/// the transformer walks count a recomputed block).
fn checkpoint(w: &mut Walk, first: usize, input: f64) {
    if !w.ckpt {
        return;
    }
    let (scale, input) = (w.c.recompute_scale, w.exact(input));
    let mut again = 0.0;
    for (i, s) in w.segs[first..].iter_mut().enumerate() {
        again += scale * (s.kept + s.scores);
        s.recompute = again;
        s.kept = if i == 0 { input } else { 0.0 };
        s.scores = 0.0;
    }
}

/// What every segment of one UNet's walk is computed from.
struct Net<'a> {
    u: &'a UnetSpec,
    input: &'a Input,
    c: Coefficients,
    /// Bytes per element: matmul/conv operands, and wide (fp32) tensors.
    mm: f64,
    wide: f64,
    batch: f64,
    /// Norm input upcast + norm output + cast for the conv, per channel and voxel.
    nac: f64,
    /// Width of the time embedding.
    temb: u64,
}

/// Per-level values as `PerLevel::expand` gives them, without allocating.
fn per_level(p: &spec::PerLevel, l: usize) -> u32 {
    match p {
        spec::PerLevel::All(v) => *v,
        spec::PerLevel::Each(v) => v.get(l).or(v.last()).copied().unwrap_or(0),
    }
}

impl<'a> Net<'a> {
    fn new(u: &'a UnetSpec, input: &'a Input, w: &Walk) -> Self {
        let (mm, wide) = (w.dt.mm, w.dt.wide);
        let c = *w.c;
        Net { u, input, c, mm, wide, batch: w.batch, nac: wide + wide + mm, temb: 4 * u.channels[0] as u64 }
    }

    fn ch(&self, l: usize) -> f64 {
        self.u.channels[l] as f64
    }

    fn chu(&self, l: usize) -> u64 {
        self.u.channels[l] as u64
    }

    fn vox(&self, l: usize) -> f64 {
        self.input.spatial.div(1 << l).voxels() as f64
    }

    fn attn_at(&self, l: usize) -> bool {
        self.u.attention_levels.get(l).copied().unwrap_or(false)
    }

    /// The column buffer of a 3x3x3 convolution over `cin` channels at `v` output voxels.
    fn columns(&self, w: &Walk, cin: f64, v: f64) -> f64 {
        w.exact(27.0 * self.mm * cin * v)
    }

    fn heads(&self, l: usize, width: f64) -> f64 {
        let hc = per_level(&self.u.num_head_channels, l).max(1) as f64;
        (width / hc).max(1.0)
    }

    /// GroupNorm upcast and output (wide) + 3 casts, q, k, v, output relayout, proj input (mm).
    fn attn_full(&self, width: f64, v: f64) -> f64 {
        (2.0 * self.wide + 8.0 * self.mm) * width * v
    }

    /// A block at `level` with `full` saved bytes (walk) and `score_elems`
    /// materialised scores.
    fn block(&self, w: &Walk, (name, l): (&'static str, usize), full: f64, score_elems: f64, params: u64) -> Seg {
        let c = &self.c;
        let mut s = Seg::new(name, Some(l));
        let full_b = w.act(full);
        s.kept = full_b;
        s.scores = self.batch * c.score_saved_bytes * w.dt.score_scale() * score_elems;
        s.transient =
            c.bwd_transient * full_b + self.batch * c.score_transient_bytes * w.dt.score_scale() * score_elems;
        s.params = params as f64;
        s
    }

    /// The attention block at `level`: `cw` channels (the level's width),
    /// its parameters those of attention on `width` channels.
    fn attention(&self, w: &Walk, l: usize, cw: f64, width: u64) -> Seg {
        let v = self.vox(l);
        let name = ("attention projections", l);
        self.block(w, name, self.attn_full(cw, v), self.heads(l, cw) * v * v, unet_attention(width))
    }

    /// Input cast for conv_in; conv_in's output is the first skip.
    fn stem(&self, w: &mut Walk, input: &Input, skips: &mut SkipStack) {
        let mut stem = Seg::new("stem (conv_in)", Some(0));
        stem.kept = w.act(self.mm * input.channels as f64 * self.vox(0));
        stem.transient = self.columns(w, input.channels as f64, self.vox(0));
        stem.skip = w.exact(self.mm * self.ch(0) * self.vox(0));
        skips.push((w.segs.len(), stem.skip));
        w.push(stem);
    }

    /// Down path: r ResBlocks (+ attention) per level, stride-2 conv between levels.
    fn down(&self, w: &mut Walk, levels: usize, skips: &mut SkipStack) {
        let mm = self.mm;
        let mut width = self.chu(0);
        for l in 0..levels {
            // The level's input is the last skip (conv_in's or the downsampler's output).
            let first = w.segs.len();
            let prev = width;
            width = self.chu(l);
            let (cw, v) = (self.ch(l), self.vox(l));
            for j in 0..per_level(&self.u.num_res_blocks, l) {
                let cin = if j == 0 { prev } else { width };
                let full = self.nac * (cin + width) as f64 * v;
                let params = unet_res_block(cin, width, self.temb);
                let mut s = self.block(w, ("resblocks (norms, convs)", l), full, 0.0, params);
                s.transient += self.columns(w, cin.max(width) as f64, v);
                if self.attn_at(l) {
                    w.push(s);
                    s = self.attention(w, l, cw, width);
                }
                s.skip = w.exact(mm * cw * v);
                skips.push((w.segs.len(), s.skip));
                w.push(s);
            }
            if l + 1 < levels {
                let mut s = Seg::new("downsample convs", Some(l));
                s.skip = w.exact(mm * cw * self.vox(l + 1));
                s.transient = self.columns(w, cw, self.vox(l + 1));
                s.params = (27 * width * width + width) as f64;
                skips.push((w.segs.len(), s.skip));
                w.push(s);
            }
            checkpoint(w, first, 0.0);
        }
    }

    /// Middle: ResBlock, attention (always), ResBlock at the last level. Its
    /// input is the last skip.
    fn middle(&self, w: &mut Walk, last: usize) {
        let (cl, vl, wl) = (self.ch(last), self.vox(last), self.chu(last));
        let params = unet_res_block(wl, wl, self.temb);
        let mut rb = self.block(w, ("resblocks (norms, convs)", last), self.nac * 2.0 * cl * vl, 0.0, params);
        rb.transient += self.columns(w, cl, vl);
        let first = w.segs.len();
        w.push(rb);
        let at = self.attention(w, last, cl, wl);
        w.push(at);
        w.push(rb);
        checkpoint(w, first, 0.0);
    }

    /// Up path: r+1 ResBlocks on concatenated skips (+ attention), upsample + conv between.
    fn up(&self, w: &mut Walk, skips: &mut SkipStack) {
        let mm = self.mm;
        // Each up block's input: the middle block's output, then the upsampler's.
        let mut input = self.ch(self.u.levels() - 1);
        for up in self.u.up_path() {
            let (l, out) = (up.level, up.width as u64);
            let (co, v) = (self.ch(l), self.vox(l));
            let first = w.segs.len();
            let held = mm * input * v;
            for cin in up.block_inputs.into_iter().map(u64::from) {
                let full = self.nac * (cin + out) as f64 * v + mm * cin as f64 * v;
                let params = unet_res_block(cin, out, self.temb);
                let mut s = self.block(w, ("resblocks (norms, convs)", l), full, 0.0, params);
                s.transient += self.columns(w, cin.max(out) as f64, v);
                if let Some((producer, bytes)) = skips.pop() {
                    s.bwd_alloc = bytes;
                    w.segs[producer].bwd_free += bytes;
                }
                w.push(s);
                if self.attn_at(l) {
                    let at = self.attention(w, l, co, out);
                    w.push(at);
                }
            }
            if l > 0 {
                // Nearest upsample output, saved by the following conv, at level l-1.
                let up = mm * co * self.vox(l - 1);
                let mut s = self.block(w, ("upsample convs", l - 1), up, 0.0, 27 * out * out + out);
                s.transient += self.columns(w, co, self.vox(l - 1));
                w.push(s);
            }
            checkpoint(w, first, held);
            input = co;
        }
    }

    /// Output head: GroupNorm, SiLU, conv at full resolution.
    fn head(&self, w: &mut Walk, out_channels: u32) {
        let head = self.nac * self.ch(0) * self.vox(0) + self.mm * out_channels as f64 * self.vox(0);
        let mut s = Seg::new("output head", Some(0));
        s.kept = w.act(head);
        s.transient = self.c.bwd_transient * w.act(head) + self.columns(w, self.ch(0), self.vox(0));
        w.push(s);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precheck::{Calibration, Dtypes};
    use spec::{PerLevel, Precision, Spatial};

    /// A 3-level UNet, one ResBlock a level, attention at the two deeper levels.
    fn walked(ckpt: bool) -> (Vec<Seg>, f64) {
        let u = UnetSpec {
            channels: vec![32, 64, 128],
            attention_levels: vec![false, true, true],
            num_res_blocks: PerLevel::All(1),
            num_head_channels: PerLevel::All(32),
            norm_num_groups: 16,
        };
        let input = Input { channels: 2, spatial: Spatial::new(16, 16, 16) };
        let c = Calibration::builtin().coefficients("pytorch", Precision::Bf16Amp).expect("pytorch fit");
        let mut segs = Vec::new();
        let mut w = Walk { c: &c, dt: Dtypes::of(Precision::Bf16Amp), batch: 1.0, ckpt, segs: &mut segs };
        walk(&u, &input, 1, &mut w);
        (segs, c.recompute_scale)
    }

    /// The level blocks the group's pixel scripts wrap, as index ranges of the
    /// walk: stem, down 0 (ResBlock, downsampler), down 1 (ResBlock, attention,
    /// downsampler), down 2 (ResBlock, attention), middle (3), up 2 (2 x
    /// ResBlock + attention, upsampler), up 1 (the same), up 0 (2 ResBlocks), head.
    const BLOCKS: [std::ops::Range<usize>; 7] = [1..3, 3..6, 6..8, 8..11, 11..16, 16..21, 21..23];

    #[test]
    fn a_checkpointed_unet_keeps_level_block_inputs_and_recomputes_a_whole_level_block() {
        let ((plain, scale), (ckpt, _)) = (walked(false), walked(true));
        assert_eq!(plain.len(), 24);
        let saved = |s: &Seg| s.kept + s.scores;
        // Stem and head are not wrapped: the same either way.
        for i in [0, 23] {
            assert_eq!((ckpt[i].kept, ckpt[i].recompute), (plain[i].kept, 0.0), "segment {i}");
        }
        for (b, range) in BLOCKS.iter().enumerate() {
            let first = &ckpt[range.start];
            // Down blocks and the middle get the last skip as input (held already);
            // up blocks hold their input: the middle's or the upsampler's bf16 output.
            let input = match b {
                4 => 2.0 * 128.0 * 4.0f64.powi(3),
                5 => 2.0 * 128.0 * 8.0f64.powi(3),
                6 => 2.0 * 64.0 * 16.0f64.powi(3),
                _ => 0.0,
            };
            assert_eq!(first.kept, input, "block {b}");
            let mut again = 0.0;
            for i in range.clone() {
                if i > range.start {
                    assert_eq!(ckpt[i].kept, 0.0, "segment {i} keeps nothing");
                }
                assert_eq!(ckpt[i].scores, 0.0, "segment {i}");
                assert_eq!(ckpt[i].skip, plain[i].skip, "skips are the blocks' outputs: held as before");
                again += scale * saved(&plain[i]);
                assert!(
                    (ckpt[i].recompute - again).abs() <= 1e-9 * again,
                    "segment {i}: the block up to it comes back"
                );
            }
        }
        let total = |segs: &[Seg]| segs.iter().map(saved).sum::<f64>();
        assert!(total(&ckpt) < 0.2 * total(&plain), "{} of {}", total(&ckpt), total(&plain));
    }
}
