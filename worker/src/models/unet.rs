//! MONAI `DiffusionModelUNet` (spatial_dims=3) as the group profiled it.
//!
//! conv_in → sinusoidal time embedding → Linear(c0, 4c0) → SiLU → Linear(4c0, 4c0);
//! per level `r` ResBlocks (+ spatial attention where enabled), stride-2 conv between
//! levels; middle ResBlock + attention (always) + ResBlock; up path of `r+1`
//! ResBlocks per level on the concatenated skips, nearest x2 upsample + conv;
//! GroupNorm, SiLU, conv out. Matches `facts::params::count` exactly.
//!
//! With the tape on (`grad_ckpt`), each level block is checkpointed as the
//! group's pixel scripts wrap MONAI's UNet from outside
//! (`misc/profiling/profile_pixel_3d_unet.py@b8e04ab:32-48`): every down level
//! (its stages and downsampler), the middle block and every up level (its
//! stages on the skips and upsampler) keeps only its inputs and runs again in
//! backward; conv_in, the time MLP and the output head are not wrapped. The
//! tape hands 3-D tensors on, so a volume `[B, C, D, H, W]` crosses a boundary
//! as `[B, C, D·H·W]` (a view) and the time embedding as `[B, 4·c0, 1]`.

use burn::nn::conv::{Conv3d, Conv3dConfig};
use burn::nn::{GroupNorm, GroupNormConfig, Linear, PaddingConfig3d};
use burn::prelude::*;
use facts::{Input, UnetSpec};

use super::amp::{self, silu, AutocastForward};
use super::checkpoint::Tape;
use super::{attention_qkv, linear, timestep_embedding, BuildError};

/// MONAI uses eps 1e-6 in its diffusion UNet norms.
const NORM_EPS: f64 = 1e-6;

fn conv3(cin: usize, cout: usize, stride: usize, device: &Device) -> Conv3d {
    Conv3dConfig::new([cin, cout], [3, 3, 3])
        .with_stride([stride; 3])
        .with_padding(PaddingConfig3d::Explicit(1, 1, 1))
        .init(device)
}

fn norm(groups: usize, c: usize, device: &Device) -> Result<GroupNorm, BuildError> {
    if groups == 0 || !c.is_multiple_of(groups) {
        return Err(BuildError::Shape(format!("GroupNorm: {groups} groups do not divide {c} channels")));
    }
    Ok(GroupNormConfig::new(groups, c).with_epsilon(NORM_EPS).init(device))
}

/// MONAI ResnetBlock: norm, SiLU, conv, + time projection, norm, SiLU, conv, skip.
#[derive(Module, Debug)]
pub struct ResBlock {
    norm1: GroupNorm,
    conv1: Conv3d,
    time_proj: Linear,
    norm2: GroupNorm,
    conv2: Conv3d,
    skip: Option<Conv3d>,
}

impl ResBlock {
    /// A ResBlock(`cin` → `cout`) with a `temb`-wide time embedding and `groups` norm groups.
    pub fn new(cin: usize, cout: usize, temb: usize, groups: usize, device: &Device) -> Result<Self, BuildError> {
        Ok(Self {
            norm1: norm(groups, cin, device)?,
            conv1: conv3(cin, cout, 1, device),
            time_proj: linear(temb, cout, device),
            norm2: norm(groups, cout, device)?,
            conv2: conv3(cout, cout, 1, device),
            skip: (cin != cout).then(|| Conv3dConfig::new([cin, cout], [1, 1, 1]).init(device)),
        })
    }

    /// The block on `x` `[B, cin, D, H, W]` and the time embedding `emb` `[B, temb]`.
    pub fn forward(&self, x: Tensor<5>, emb: Tensor<2>) -> Tensor<5> {
        let h = self.conv1.amp(silu(self.norm1.amp(x.clone())));
        let t: Tensor<5> = self.time_proj.amp(silu(emb)).unsqueeze_dims(&[2, 3, 4]);
        let h = self.conv2.amp(silu(self.norm2.amp(amp::add(h, t))));
        let skip = match &self.skip {
            Some(conv) => conv.amp(x),
            None => x,
        };
        amp::add(skip, h)
    }
}

/// MONAI SpatialAttentionBlock: GroupNorm, q/k/v/out Linear(C, C) with bias, residual.
#[derive(Module, Debug)]
pub struct AttnBlock {
    norm: GroupNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    heads: usize,
}

impl AttnBlock {
    fn new(c: usize, head_channels: usize, groups: usize, device: &Device) -> Result<Self, BuildError> {
        if head_channels == 0 || !c.is_multiple_of(head_channels) {
            return Err(BuildError::Shape(format!("attention: {head_channels} channels per head do not divide {c}")));
        }
        Ok(Self {
            norm: norm(groups, c, device)?,
            q: linear(c, c, device),
            k: linear(c, c, device),
            v: linear(c, c, device),
            out: linear(c, c, device),
            heads: c / head_channels,
        })
    }

    fn forward(&self, x: Tensor<5>) -> Tensor<5> {
        let [b, c, d, h, w] = x.dims();
        let n = d * h * w;
        let t = self.norm.amp(x.clone()).reshape([b, c, n]).swap_dims(1, 2);
        let a = attention_qkv(self.q.amp(t.clone()), self.k.amp(t.clone()), self.v.amp(t), self.heads);
        let a = self.out.amp(a).swap_dims(1, 2).reshape([b, c, d, h, w]);
        amp::add(x, a)
    }
}

/// A ResBlock with its optional attention.
#[derive(Module, Debug)]
pub struct Stage {
    res: ResBlock,
    attn: Option<AttnBlock>,
}

impl Stage {
    fn forward(&self, x: Tensor<5>, emb: Tensor<2>) -> Tensor<5> {
        let x = self.res.forward(x, emb);
        match &self.attn {
            Some(a) => a.forward(x),
            None => x,
        }
    }
}

/// One level of the down path.
#[derive(Module, Debug)]
pub struct Down {
    stages: Vec<Stage>,
    downsample: Option<Conv3d>,
}

/// One level of the up path.
#[derive(Module, Debug)]
pub struct Up {
    stages: Vec<Stage>,
    /// Conv after the nearest x2 upsample.
    upsample: Option<Conv3d>,
}

#[derive(Module, Debug)]
pub struct Unet {
    conv_in: Conv3d,
    time1: Linear,
    time2: Linear,
    down: Vec<Down>,
    middle: Middle,
    up: Vec<Up>,
    out_norm: GroupNorm,
    conv_out: Conv3d,
    c0: usize,
}

impl Unet {
    pub fn new(u: &UnetSpec, input: &Input, out_channels: u32, device: &Device) -> Result<Self, BuildError> {
        let ch: Vec<usize> = u.channels.iter().map(|&c| c as usize).collect();
        let levels = ch.len();
        if levels == 0 {
            return Err(BuildError::Shape("UNet needs at least one level".into()));
        }
        let res: Vec<usize> = u.res_blocks().iter().map(|&r| r as usize).collect();
        let heads: Vec<usize> = u.head_channels().iter().map(|&h| h as usize).collect();
        let attn = |l: usize| u.attention_levels.get(l).copied().unwrap_or(false);
        let groups = u.norm_num_groups as usize;
        let c0 = ch[0];
        let temb = 4 * c0;
        let stage = |cin: usize, cout: usize, l: usize, with_attn: bool| -> Result<Stage, BuildError> {
            Ok(Stage {
                res: ResBlock::new(cin, cout, temb, groups, device)?,
                attn: if with_attn { Some(AttnBlock::new(cout, heads[l], groups, device)?) } else { None },
            })
        };

        let mut down = Vec::with_capacity(levels);
        let mut width = c0;
        for l in 0..levels {
            let input_width = width;
            width = ch[l];
            let stages = (0..res[l])
                .map(|j| stage(if j == 0 { input_width } else { width }, width, l, attn(l)))
                .collect::<Result<Vec<_>, _>>()?;
            let downsample = (l + 1 < levels).then(|| conv3(width, width, 2, device));
            down.push(Down { stages, downsample });
        }

        let last = ch[levels - 1];
        let middle = Middle {
            res1: ResBlock::new(last, last, temb, groups, device)?,
            attn: AttnBlock::new(last, heads[levels - 1], groups, device)?,
            res2: ResBlock::new(last, last, temb, groups, device)?,
        };

        // Skip widths pushed on the way down, consumed from the top on the way up.
        let mut up = Vec::with_capacity(levels);
        for level in u.up_path() {
            let (l, out) = (level.level, level.width as usize);
            let stages = level
                .block_inputs
                .iter()
                .map(|&cin| stage(cin as usize, out, l, attn(l)))
                .collect::<Result<Vec<_>, _>>()?;
            let upsample = (l > 0).then(|| conv3(out, out, 1, device));
            up.push(Up { stages, upsample });
        }

        let _ = input; // The UNet's parameters do not depend on the volume size.
        Ok(Self {
            conv_in: conv3(input.channels as usize, c0, 1, device),
            time1: linear(c0, temb, device),
            time2: linear(temb, temb, device),
            down,
            middle,
            up,
            out_norm: norm(groups, c0, device)?,
            conv_out: conv3(c0, out_channels as usize, 1, device),
            c0,
        })
    }

    /// The noise prediction; each level block is checkpointed on `tape` when it is on.
    pub fn forward<'a>(&'a self, x: Tensor<5>, t: &[f32], tape: &mut Tape<'a>) -> Tensor<5> {
        let device = x.device();
        let emb = timestep_embedding(t, self.c0, &device);
        let emb = tape.value(self.time2.amp(silu(self.time1.amp(emb))).unsqueeze_dim(2));

        let h = self.conv_in.amp(x);
        let mut shape = h.dims();
        let mut h = tape.value(flat(h));
        // Skips pushed on the way down (with their shapes), consumed from the top on the way up.
        let mut skips = vec![(h.clone(), shape)];
        for level in &self.down {
            let dims = level.output_dims(shape);
            let outs = tape.blocks(level, vec![h, emb.clone()], move |level, x| level.forward(x, shape));
            skips.extend(outs.into_iter().zip(dims));
            (h, shape) = skips.last().cloned().expect("conv_in's output at least");
        }
        h = tape.blocks(&self.middle, vec![h, emb.clone()], move |m, x| m.forward(x, shape)).remove(0);
        for level in &self.up {
            let taken = skips.split_off(skips.len() - level.stages.len());
            let skip_shapes: Vec<[usize; 5]> = taken.iter().map(|(_, s)| *s).collect();
            let out_shape = level.output_dims(shape, skip_shapes[0]);
            let mut inputs = vec![h, emb.clone()];
            inputs.extend(taken.into_iter().map(|(v, _)| v));
            h = tape.blocks(level, inputs, move |level, x| level.forward(x, shape, &skip_shapes)).remove(0);
            shape = out_shape;
        }
        let h = unflat(h.tensor(), shape);
        self.conv_out.amp(silu(self.out_norm.amp(h)))
    }
}

/// A volume as the tape hands it on: `[B, C, D·H·W]`.
fn flat(x: Tensor<5>) -> Tensor<3> {
    let [b, c, d, h, w] = x.dims();
    x.reshape([b, c, d * h * w])
}

fn unflat(x: Tensor<3>, shape: [usize; 5]) -> Tensor<5> {
    x.reshape(shape)
}

/// The time embedding as the tape hands it on (`[B, 4·c0, 1]`), for a ResBlock.
fn embedding(e: Tensor<3>) -> Tensor<2> {
    e.squeeze_dim(2)
}

impl Down {
    /// Its stages, then its downsampler, on `x` (of `shape`) and the time
    /// embedding: every output is a skip, the last the next level's input.
    fn forward(&self, x: Vec<Tensor<3>>, shape: [usize; 5]) -> Vec<Tensor<3>> {
        let [x, emb]: [Tensor<3>; 2] = x.try_into().expect("the level's input and the time embedding");
        let emb = embedding(emb);
        let mut h = unflat(x, shape);
        let mut outs = Vec::with_capacity(self.stages.len() + 1);
        for s in &self.stages {
            h = s.forward(h, emb.clone());
            outs.push(flat(h.clone()));
        }
        if let Some(conv) = &self.downsample {
            outs.push(flat(conv.amp(h)));
        }
        outs
    }

    /// The shapes of [`Down::forward`]'s outputs for an input of `shape`.
    fn output_dims(&self, [b, _, d, h, w]: [usize; 5]) -> Vec<[usize; 5]> {
        let width = self.width();
        let mut dims = vec![[b, width, d, h, w]; self.stages.len()];
        if self.downsample.is_some() {
            // A stride-2 3x3x3 convolution with padding 1: ⌈s/2⌉.
            dims.push([b, width, d.div_ceil(2), h.div_ceil(2), w.div_ceil(2)]);
        }
        dims
    }

    fn width(&self) -> usize {
        let conv = &self.stages.last().expect("a level has a ResBlock").res.conv2;
        conv.weight.dims()[0]
    }
}

/// MONAI's middle block: ResBlock, attention (always), ResBlock.
#[derive(Module, Debug)]
pub struct Middle {
    res1: ResBlock,
    attn: AttnBlock,
    res2: ResBlock,
}

impl Middle {
    fn forward(&self, x: Vec<Tensor<3>>, shape: [usize; 5]) -> Vec<Tensor<3>> {
        let [x, emb]: [Tensor<3>; 2] = x.try_into().expect("the middle's input and the time embedding");
        let emb = embedding(emb);
        let h = self.res1.forward(unflat(x, shape), emb.clone());
        let h = self.res2.forward(self.attn.forward(h), emb);
        vec![flat(h)]
    }
}

impl Up {
    /// Its stages on `x` (of `shape`) and the skips they take (last pushed
    /// first), then the upsampler: the next level's input.
    fn forward(&self, x: Vec<Tensor<3>>, shape: [usize; 5], skip_shapes: &[[usize; 5]]) -> Vec<Tensor<3>> {
        let mut x = x.into_iter();
        let (h, emb) = (x.next().expect("the level's input"), x.next().expect("the time embedding"));
        let emb = embedding(emb);
        let skips: Vec<Tensor<3>> = x.collect();
        let mut h = unflat(h, shape);
        for (s, (skip, skip_shape)) in self.stages.iter().zip(skips.into_iter().zip(skip_shapes).rev()) {
            h = s.forward(amp::cat(vec![h, unflat(skip, *skip_shape)], 1), emb.clone());
        }
        if let Some(conv) = &self.upsample {
            h = conv.amp(upsample_nearest2(h));
        }
        vec![flat(h)]
    }

    /// The shape of [`Up::forward`]'s output for an input of `shape`, whose
    /// level's skips are of `skip` shape.
    fn output_dims(&self, [b, ..]: [usize; 5], [_, _, d, h, w]: [usize; 5]) -> [usize; 5] {
        let width = self.stages.last().expect("a level has a ResBlock").res.conv2.weight.dims()[0];
        match self.upsample {
            Some(_) => [b, width, 2 * d, 2 * h, 2 * w],
            None => [b, width, d, h, w],
        }
    }
}

/// Nearest-neighbour x2 upsample of `[B, C, D, H, W]` by reshape + expand (Burn
/// has no 5-D interpolate), keeping every intermediate at rank 6 or less.
pub fn upsample_nearest2(x: Tensor<5>) -> Tensor<5> {
    let [b, c, d, h, w] = x.dims();
    // Depth first: [B·C, D, 1, H·W] → [B·C, D, 2, H·W].
    let x = x.reshape([b * c, d, 1, h * w]).expand([b * c, d, 2, h * w]);
    // Then height and width: [B·C·2D, H, 1, W, 1] → [.., H, 2, W, 2].
    let x = x.reshape([b * c * d * 2, h, 1, w, 1]).expand([b * c * d * 2, h, 2, w, 2]);
    x.reshape([b, c, 2 * d, 2 * h, 2 * w])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::test_util::device;
    use burn::module::Module;
    use facts::{ModelSpec, PerLevel, Spatial};

    fn check(u: UnetSpec, input: Input, out: u32) {
        let device = device();
        let expected = facts::params::count(&ModelSpec::Unet(u.clone()), &input, out).unwrap();
        let model = Unet::new(&u, &input, out, &device).unwrap();
        assert_eq!(model.num_params() as u64, expected, "{u:?}");
    }

    fn input(c: u32) -> Input {
        Input { channels: c, spatial: Spatial::new(8, 8, 8) }
    }

    #[test]
    fn params_match_spec_two_levels_attention_last() {
        check(
            UnetSpec {
                channels: vec![32, 64],
                attention_levels: vec![false, true],
                num_res_blocks: PerLevel::All(1),
                num_head_channels: PerLevel::All(32),
                norm_num_groups: 8,
            },
            input(2),
            1,
        );
    }

    #[test]
    fn params_match_spec_per_level_res_blocks_and_heads() {
        check(
            UnetSpec {
                channels: vec![16, 32, 32],
                attention_levels: vec![true, false, true],
                num_res_blocks: PerLevel::Each(vec![1, 2, 3]),
                num_head_channels: PerLevel::Each(vec![8, 16, 32]),
                norm_num_groups: 8,
            },
            input(3),
            2,
        );
    }

    #[test]
    fn params_match_spec_no_attention() {
        check(
            UnetSpec {
                channels: vec![32, 32, 64],
                attention_levels: vec![false, false, false],
                num_res_blocks: PerLevel::All(2),
                num_head_channels: PerLevel::All(32),
                norm_num_groups: 32,
            },
            input(8),
            4,
        );
    }

    #[test]
    fn forward_keeps_the_volume_shape() {
        let device = device();
        let u = UnetSpec {
            channels: vec![16, 32],
            attention_levels: vec![false, true],
            num_res_blocks: PerLevel::All(1),
            num_head_channels: PerLevel::All(16),
            norm_num_groups: 8,
        };
        let model = Unet::new(&u, &input(2), 1, &device).unwrap();
        let x = Tensor::<5>::random([1, 2, 8, 8, 8], burn::tensor::Distribution::Default, &device);
        assert_eq!(model.forward(x, &[10.0], &mut Tape::new(false)).dims(), [1, 1, 8, 8, 8]);
    }

    /// Checkpointing each level block changes where activations live, not
    /// what backward computes: the same loss and parameter gradients.
    #[test]
    fn checkpointed_level_blocks_give_the_same_gradients() {
        let device = device().autodiff();
        let u = UnetSpec {
            channels: vec![8, 16, 16],
            attention_levels: vec![false, true, true],
            num_res_blocks: PerLevel::Each(vec![1, 2, 1]),
            num_head_channels: PerLevel::All(8),
            norm_num_groups: 4,
        };
        let model = Unet::new(&u, &input(2), 1, &device).unwrap();
        let x = Tensor::<5>::random([1, 2, 8, 8, 8], burn::tensor::Distribution::Default, &device);
        let run = |on: bool| {
            let mut tape = Tape::new(on);
            let loss = model.forward(x.clone(), &[10.0], &mut tape).square().mean();
            let value = loss.clone().into_data().iter::<f32>().next().expect("one value");
            let grads = tape.backward(loss, &model);
            let mut all = Vec::new();
            struct Get<'g>(&'g burn::optim::GradientsParams, &'g mut Vec<f32>);
            impl burn::module::ModuleVisitor for Get<'_> {
                fn visit_float<const D: usize>(&mut self, p: &burn::module::Param<Tensor<D>>) {
                    let g = self.0.get::<D>(p.id).expect("every parameter has a gradient");
                    self.1.extend(g.into_data().iter::<f32>());
                }
            }
            model.visit(&mut Get(&grads, &mut all));
            (value, all)
        };
        let ((plain_loss, plain), (ckpt_loss, ckpt)) = (run(false), run(true));
        assert!((plain_loss - ckpt_loss).abs() <= 1e-6 * plain_loss.abs(), "{plain_loss} vs {ckpt_loss}");
        assert_eq!(plain.len(), ckpt.len());
        assert!(plain.iter().any(|g| *g != 0.0));
        for (u, v) in plain.iter().zip(&ckpt) {
            assert!((u - v).abs() <= 1e-4 * (1.0 + u.abs()), "{u} vs {v}");
        }
    }

    #[test]
    fn upsample_repeats_each_voxel() {
        let device = device();
        let x = Tensor::<5>::from_data(TensorData::new(vec![1f32, 2.0], [1, 1, 1, 1, 2]), &device);
        let y = upsample_nearest2(x);
        assert_eq!(y.dims(), [1, 1, 2, 2, 4]);
        let v: Vec<f32> = y.into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(v, vec![1., 1., 2., 2., 1., 1., 2., 2., 1., 1., 2., 2., 1., 1., 2., 2.]);
    }
}
