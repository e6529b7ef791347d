//! MONAI `DiffusionModelUNet` (3D): activations saved for backward, block by block.
//!
//! What a ResBlock and an attention block keep a voxel, and the column
//! buffers their convolutions unfold, is `facts::blocks::unet`'s description
//! (a ResBlock(cin → cout) makes 10·cin + 10·cout bytes a voxel under bf16
//! autocast; attention 18·C bytes and 6 bytes a score of heads x N x N under
//! bf16 autocast, 24·C and 4 B in fp32: MONAI runs attention without flash,
//! so scores are materialised). The walk counts every entry but the block's
//! input itself (`Of::Input`: the skip conv's, in the down path a skip held
//! already), which it counts in the up path, where the input is the
//! concatenation made for the block. In fp32 norm1 keeps the block's input
//! itself (`Of::InputUpcast`), a tensor the skip (down path, the middle's
//! first ResBlock) or the skip conv's entry (up path) counts already: the
//! walk counts it only where nothing else holds it (the middle's second
//! ResBlock, after attention; the output head).
//! The scores weigh the runtime's fitted bytes a score element, scaled from
//! bf16 autocast by the description's score entries.
//! Encoder outputs are held for the decoder's concatenations (skip tensors)
//! until the backward pass reaches the encoder block that made them.
//!
//! Every 3x3x3 convolution also unfolds its input into a column buffer while
//! it runs, forward and backward: 27·cin elements a voxel
//! (`facts::blocks::unet::COLUMNS`). The group's runs convolved so (PyTorch's
//! native 3D convolution, not cuDNN's kernels: with cuDNN off PyTorch
//! reproduces their UNet records, with it 48 of 64 read low;
//! data/gpu-check/2026-11-27-h100/RUN.md), so the walk holds the largest
//! buffer of a block as one of its transients.
//!
//! With `grad_ckpt`, each level block runs under `torch.utils.checkpoint` as
//! the group's pixel scripts wrap MONAI's UNet from outside
//! (`misc/profiling/profile_pixel_3d_unet.py@b8e04ab:32-48`): every
//! `down_blocks[i]` (a level's ResBlocks, attention and downsampler), the
//! `middle_block` and every `up_blocks[i]` (ResBlocks on the skips, attention,
//! upsampler); the stem and the output head are not wrapped. See [`checkpoint`].

use super::{Coefficients, Dtypes, Seg, Walk};
use facts::blocks::unet::{Of, ATTENTION, COLUMNS, KERNEL, RES_BLOCK};
use facts::params::{unet_attention, unet_res_block};
use facts::{Input, Precision, UnetSpec};

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

/// Who else holds a ResBlock's input (what its norm1 and skip conv keep).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// A skip held for the decoder (the down path, the middle's first ResBlock).
    Skip,
    /// The up path's concatenation, made for the block: the block counts it.
    Made,
    /// Nothing else (the middle's second ResBlock, after attention; the head).
    Nowhere,
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
    /// Width of the time embedding.
    temb: u64,
}

/// Per-level values as `PerLevel::expand` gives them, without allocating.
fn per_level(p: &facts::PerLevel, l: usize) -> u32 {
    match p {
        facts::PerLevel::All(v) => *v,
        facts::PerLevel::Each(v) => v.get(l).or(v.last()).copied().unwrap_or(0),
    }
}

impl<'a> Net<'a> {
    fn new(u: &'a UnetSpec, input: &'a Input, w: &Walk) -> Self {
        let (mm, wide) = (w.dt.mm, w.dt.wide);
        let c = *w.c;
        Net { u, input, c, mm, wide, batch: w.batch, temb: 4 * u.channels[0] as u64 }
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
        w.exact(COLUMNS as f64 * self.mm * cin * v)
    }

    /// Saved bytes a voxel of a ResBlock(`cin` → `cout`) whose input is `input`.
    fn res_saved(&self, cin: u64, cout: u64, input: Held) -> f64 {
        let autocast = facts::blocks::unet::autocast((self.wide, self.mm));
        RES_BLOCK.channel_bytes((cin, cout), (self.wide, self.mm), |s| match s.of {
            Of::Block => true,
            // The skip conv's entry: the input itself, counted where it is made for the block.
            Of::Input => input == Held::Made,
            // Autocast's f32 copy is the norm's own; without autocast it is the input itself.
            Of::InputUpcast => autocast || input == Held::Nowhere,
        })
    }

    /// The largest column buffer of a ResBlock(`cin` → `cout`) at `v` voxels.
    fn res_columns(&self, w: &Walk, cin: u64, cout: u64, v: f64) -> f64 {
        let largest = RES_BLOCK.largest_transient(cin, cout);
        largest.map_or(0.0, |(elems, storage)| w.exact(storage.bytes((self.wide, self.mm)) * elems * v))
    }

    fn heads(&self, l: usize, width: f64) -> f64 {
        let hc = per_level(&self.u.num_head_channels, l).max(1) as f64;
        (width / hc).max(1.0)
    }

    /// Saved bytes of an attention block of `width` at `v` voxels, scores apart.
    fn attn_full(&self, width: u64, v: f64) -> f64 {
        ATTENTION.channel_bytes((width, width), (self.wide, self.mm), |_| true) * v
    }

    /// A block at `level` with `full` saved bytes (walk) and `score_elems`
    /// materialised scores.
    fn block(&self, w: &Walk, (name, l): (&'static str, usize), full: f64, score_elems: f64, params: u64) -> Seg {
        let c = &self.c;
        let mut s = Seg::new(name, Some(l));
        let full_b = w.act(full);
        s.kept = full_b;
        let scale = score_scale(w.dt);
        s.scores = self.batch * c.score_saved_bytes * scale * score_elems;
        s.transient = c.bwd_transient * full_b + self.batch * c.score_transient_bytes * scale * score_elems;
        s.params = params as f64;
        s
    }

    /// The attention block at `level`, `width` channels (the level's width).
    fn attention(&self, w: &Walk, l: usize, width: u64) -> Seg {
        let v = self.vox(l);
        let name = ("attention projections", l);
        let scores = self.heads(l, width as f64) * v * v;
        self.block(w, name, self.attn_full(width, v), scores, unet_attention(width))
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
                // The input is the last skip: held already.
                let full = self.res_saved(cin, width, Held::Skip) * v;
                let params = unet_res_block(cin, width, self.temb);
                let mut s = self.block(w, ("resblocks (norms, convs)", l), full, 0.0, params);
                s.transient += self.res_columns(w, cin, width, v);
                if self.attn_at(l) {
                    w.push(s);
                    s = self.attention(w, l, width);
                }
                s.skip = w.exact(mm * cw * v);
                skips.push((w.segs.len(), s.skip));
                w.push(s);
            }
            if l + 1 < levels {
                let mut s = Seg::new("downsample convs", Some(l));
                s.skip = w.exact(mm * cw * self.vox(l + 1));
                s.transient = self.columns(w, cw, self.vox(l + 1));
                s.params = (KERNEL as u64 * width * width + width) as f64;
                skips.push((w.segs.len(), s.skip));
                w.push(s);
            }
            checkpoint(w, first, 0.0);
        }
    }

    /// Middle: ResBlock, attention (always), ResBlock at the last level. Its
    /// input is the last skip.
    fn middle(&self, w: &mut Walk, last: usize) {
        let (vl, wl) = (self.vox(last), self.chu(last));
        let params = unet_res_block(wl, wl, self.temb);
        let name = ("resblocks (norms, convs)", last);
        let mut rb = self.block(w, name, self.res_saved(wl, wl, Held::Skip) * vl, 0.0, params);
        rb.transient += self.res_columns(w, wl, wl, vl);
        let first = w.segs.len();
        w.push(rb);
        let at = self.attention(w, last, wl);
        w.push(at);
        // Its input is attention's output, which nothing else keeps.
        let mut rb2 = self.block(w, name, self.res_saved(wl, wl, Held::Nowhere) * vl, 0.0, params);
        rb2.transient += self.res_columns(w, wl, wl, vl);
        w.push(rb2);
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
                // The input is the concatenation made for the block, kept by its skip conv.
                let full = self.res_saved(cin, out, Held::Made) * v;
                let params = unet_res_block(cin, out, self.temb);
                let mut s = self.block(w, ("resblocks (norms, convs)", l), full, 0.0, params);
                s.transient += self.res_columns(w, cin, out, v);
                if let Some((producer, bytes)) = skips.pop() {
                    s.bwd_alloc = bytes;
                    w.segs[producer].bwd_free += bytes;
                }
                w.push(s);
                if self.attn_at(l) {
                    let at = self.attention(w, l, out);
                    w.push(at);
                }
            }
            if l > 0 {
                // Nearest upsample output, saved by the following conv, at level l-1.
                let up = mm * co * self.vox(l - 1);
                let mut s = self.block(w, ("upsample convs", l - 1), up, 0.0, KERNEL as u64 * out * out + out);
                s.transient += self.columns(w, co, self.vox(l - 1));
                w.push(s);
            }
            checkpoint(w, first, held);
            input = co;
        }
    }

    /// Output head: GroupNorm, SiLU, conv at full resolution (what a
    /// ResBlock keeps of its input channels: norm1, SiLU, conv1).
    fn head(&self, w: &mut Walk, out_channels: u32) {
        let nsc = self.res_saved(self.chu(0), 0, Held::Nowhere);
        let head = nsc * self.vox(0) + self.mm * out_channels as f64 * self.vox(0);
        let mut s = Seg::new("output head", Some(0));
        s.kept = w.act(head);
        s.transient = self.c.bwd_transient * w.act(head) + self.columns(w, self.ch(0), self.vox(0));
        w.push(s);
    }
}

/// Materialised-score bytes at `dt` relative to bf16 autocast, where the
/// fitted bytes a score element come from: the attention description's score
/// entries (the scores, their f32 softmax and its half copy), as
/// `Dtypes::score_scale` has them.
fn score_scale(dt: Dtypes) -> f64 {
    let fit = Dtypes::of(Precision::Bf16Amp);
    ATTENTION.score_bytes((dt.wide, dt.mm)) / ATTENTION.score_bytes((fit.wide, fit.mm))
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
    use crate::precheck::Calibration;
    use facts::{PerLevel, Spatial};

    #[test]
    fn a_res_block_counts_what_spec_describes_and_its_wider_convolutions_columns() {
        let u = UnetSpec {
            channels: vec![32],
            attention_levels: vec![false],
            num_res_blocks: PerLevel::All(1),
            num_head_channels: PerLevel::All(32),
            norm_num_groups: 16,
        };
        let input = Input { channels: 2, spatial: Spatial::new(8, 8, 8) };
        let c = Calibration::builtin().coefficients("pytorch", Precision::Bf16Amp).expect("pytorch fit");
        // Bytes a channel of the norm-SiLU-conv entries, of the input (the skip
        // conv's), and of norm1's input where it is the block's input itself (fp32).
        for (precision, nsc, input_bytes, norm1_input) in
            [(Precision::Bf16Amp, 10.0, 2.0, 0.0), (Precision::Fp32, 12.0, 4.0, 4.0)]
        {
            let mut segs = Vec::new();
            let w = Walk { c: &c, dt: Dtypes::of(precision), batch: 1.0, ckpt: false, segs: &mut segs };
            let net = Net::new(&u, &input, &w);
            let down = nsc * (96.0 + 32.0) - norm1_input * 96.0;
            assert_eq!(net.res_saved(96, 32, Held::Skip), down, "{precision:?}: down path, norm1's input is the skip");
            let up = down + input_bytes * 96.0;
            assert_eq!(net.res_saved(96, 32, Held::Made), up, "{precision:?}: up path, the concatenation once");
            let alone = nsc * 64.0;
            assert_eq!(net.res_saved(32, 32, Held::Nowhere), alone, "{precision:?}: after the middle's attention");
            assert_eq!(net.res_saved(32, 32, Held::Made), alone - norm1_input * 32.0, "{precision:?}: no skip conv");
            let columns = |cin| net.res_columns(&w, cin, 64, 1000.0);
            assert_eq!(
                (columns(32), columns(96)),
                (27.0 * 64.0 * input_bytes * 1000.0, 27.0 * 96.0 * input_bytes * 1000.0)
            );
            // What MONAI's attention keeps (facts::blocks::unet): 18·C under bf16 autocast, 24·C in fp32.
            assert_eq!(net.attn_full(64, 1.0), if precision == Precision::Fp32 { 24.0 * 64.0 } else { 18.0 * 64.0 });
        }
    }

    /// The fitted bytes a score (bf16 autocast) scale by what MONAI's
    /// attention keeps at each precision: 6 B a score under autocast, 4 B in
    /// fp32 (the f32 softmax only), 2 B in pure bf16.
    #[test]
    fn the_score_entries_scale_from_bf16_autocast_as_the_attention_keeps_them() {
        let scales = [
            (Precision::Bf16Amp, 1.0),
            (Precision::Fp16Amp, 1.0),
            (Precision::Fp32, 4.0 / 6.0),
            (Precision::Bf16, 2.0 / 6.0),
        ];
        for (p, want) in scales {
            assert_eq!(score_scale(Dtypes::of(p)), want, "{p:?}");
        }
    }

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
