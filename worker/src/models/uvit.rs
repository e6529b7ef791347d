//! U-ViT (Bao et al., CVPR 2023) in 3D: Conv3d patch embed, the timestep as an
//! extra token (through a 256 → h → h MLP, which the group's counts imply),
//! learned positions for 1 + tokens, pre-LN blocks with qkv without bias, long
//! skips Linear(2h → h) from the first half into the second, final LayerNorm,
//! Linear(h, p³·in), unpatchify and a Conv3d(in, in, 3). Predicts `in` channels,
//! as upstream does. Matches `facts::params::count` exactly.

use burn::module::Param;
use burn::nn::conv::{Conv3d, Conv3dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig3d};
use burn::prelude::*;
use burn::tensor::activation::gelu;
use facts::{Input, UvitSpec};

use super::amp::{self, AutocastForward};
use super::attention::{AttentionKernel, Heads};
use super::checkpoint::Tape;
use super::{linear, self_attention, table, to_tokens, unpatchify, BuildError, Grid, Norm, TimeMlp};

/// The group's U-ViT LayerNorms: `LayerNorm(h, eps=1e-6)` (`src/medgen/models/uvit.py@ff513e0`).
const UVIT_EPS: f64 = 1e-6;

/// Pre-LN transformer block: attention (qkv without bias, no qk-norm) and a 4h MLP.
#[derive(Module, Debug)]
pub struct UvitBlock {
    norm1: Norm,
    qkv: Linear,
    proj: Linear,
    norm2: Norm,
    fc1: Linear,
    fc2: Linear,
    #[module(skip)]
    heads: Heads,
}

impl UvitBlock {
    /// A block of width `h` (its tests measure one alone: `tests/block_facts.rs`).
    pub fn new(h: usize, heads: Heads, device: &Device) -> Self {
        Self {
            norm1: Norm::new(h, UVIT_EPS, device),
            qkv: LinearConfig::new(h, 3 * h).with_bias(false).init(device),
            proj: linear(h, h, device),
            norm2: Norm::new(h, UVIT_EPS, device),
            fc1: linear(h, 4 * h, device),
            fc2: linear(4 * h, h, device),
            heads,
        }
    }

    /// `[1, tokens, h]` through the block.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let a = self.proj.amp(self_attention(self.qkv.amp(self.norm1.forward(x.clone())), self.heads, None));
        let x = amp::add(x, a);
        let m = self.fc2.amp(gelu(self.fc1.amp(self.norm2.forward(x.clone()))));
        amp::add(x, m)
    }
}

/// A second-half block with its long-skip projection.
#[derive(Module, Debug)]
pub struct SkipBlock {
    skip: Linear,
    block: UvitBlock,
}

#[derive(Module, Debug)]
pub struct Uvit {
    patch_embed: Conv3d,
    time: TimeMlp,
    pos: Param<Tensor<2>>,
    in_blocks: Vec<UvitBlock>,
    /// One middle block for odd depths, none for even ones (depth blocks in all).
    mid: Vec<UvitBlock>,
    out_blocks: Vec<SkipBlock>,
    norm: Norm,
    pred: Linear,
    final_conv: Conv3d,
    patch: usize,
    channels: usize,
    #[module(skip)]
    attention: AttentionKernel,
}

impl Uvit {
    pub fn new(m: &UvitSpec, input: &Input, attention: AttentionKernel, device: &Device) -> Result<Self, BuildError> {
        let d = m.dims()?;
        let (h, heads, p, depth) = (d.hidden as usize, d.heads as usize, m.patch as usize, d.depth as usize);
        if heads == 0 || h % heads != 0 {
            return Err(BuildError::Shape(format!("{heads} heads do not divide hidden {h}")));
        }
        let grid = Grid::of(input, m.patch)?;
        let cin = input.channels as usize;
        let half = depth / 2;
        let heads = Heads { count: heads, kernel: attention };
        Ok(Self {
            patch_embed: Conv3dConfig::new([cin, h], [p; 3]).with_stride([p; 3]).init(device),
            time: TimeMlp::new(h, device),
            pos: table(1 + grid.tokens(), h, device),
            in_blocks: (0..half).map(|_| UvitBlock::new(h, heads, device)).collect(),
            mid: (0..depth - 2 * half).map(|_| UvitBlock::new(h, heads, device)).collect(),
            out_blocks: (0..half)
                .map(|_| SkipBlock { skip: linear(2 * h, h, device), block: UvitBlock::new(h, heads, device) })
                .collect(),
            norm: Norm::new(h, UVIT_EPS, device),
            pred: linear(h, p.pow(3) * cin, device),
            final_conv: Conv3dConfig::new([cin, cin], [3, 3, 3])
                .with_padding(PaddingConfig3d::Explicit(1, 1, 1))
                .init(device),
            patch: p,
            channels: cin,
            attention,
        })
    }

    pub fn attention(&self) -> AttentionKernel {
        self.attention
    }

    /// The noise prediction; each block (with its skip projection, as
    /// upstream's `Block`) is checkpointed on `tape` when it is on.
    pub fn forward<'a>(&'a self, x: Tensor<5>, t: &[f32], tape: &mut Tape<'a>) -> Tensor<5> {
        let device = x.device();
        let [_, _, d, h, w] = x.dims();
        let grid = Grid { d: d / self.patch, h: h / self.patch, w: w / self.patch };
        let tokens = to_tokens(self.patch_embed.amp(x));
        let time = self.time.forward(t, &device).unsqueeze_dim::<3>(1);
        let mut x = tape.value(amp::add(amp::cat(vec![time, tokens], 1), self.pos.val().unsqueeze::<3>()));
        let mut skips = Vec::with_capacity(self.in_blocks.len());
        for b in &self.in_blocks {
            x = tape.block(b, [x], |b, [x]| b.forward(x));
            skips.push(x.clone());
        }
        for b in &self.mid {
            x = tape.block(b, [x], |b, [x]| b.forward(x));
        }
        for b in &self.out_blocks {
            let skip = skips.pop().expect("one skip per in-block");
            x = tape.block(b, [x, skip], |b, [x, skip]| b.block.forward(b.skip.amp(amp::cat(vec![x, skip], 2))));
        }
        let x = self.pred.amp(self.norm.forward(x.tensor()));
        let n = x.dims()[1];
        let x = x.narrow(1, 1, n - 1); // drop the time token
        self.final_conv.amp(unpatchify(x, grid, self.patch, self.channels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::test_util::device;
    use burn::module::Module;
    use facts::{ModelSpec, Spatial};

    fn check(m: UvitSpec, input: Input) -> Uvit {
        let device = device();
        let expected = facts::params::count(&ModelSpec::Uvit(m.clone()), &input, input.channels).unwrap();
        let model = Uvit::new(&m, &input, AttentionKernel::MemoryEfficient, &device).unwrap();
        assert_eq!(model.num_params() as u64, expected, "{m:?}");
        model
    }

    #[test]
    fn params_match_spec_odd_and_even_depth() {
        let input = Input { channels: 2, spatial: Spatial::new(8, 8, 8) };
        check(UvitSpec { variant: None, hidden: Some(32), heads: Some(4), depth: Some(3), patch: 2 }, input);
        let input = Input { channels: 1, spatial: Spatial::new(8, 4, 8) };
        check(UvitSpec { variant: None, hidden: Some(24), heads: Some(2), depth: Some(4), patch: 4 }, input);
    }

    #[test]
    fn forward_shape() {
        let device = device();
        let input = Input { channels: 2, spatial: Spatial::new(8, 8, 8) };
        let model =
            check(UvitSpec { variant: None, hidden: Some(16), heads: Some(2), depth: Some(3), patch: 4 }, input);
        let x = Tensor::<5>::random([1, 2, 8, 8, 8], burn::tensor::Distribution::Default, &device);
        assert_eq!(model.forward(x, &[1.0], &mut Tape::new(false)).dims(), [1, 2, 8, 8, 8]);
    }
}
