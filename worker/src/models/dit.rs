//! The group's DiT in 3D: Conv3d patch embed, a sin-cos initialised position
//! table that is trained (`src/medgen/models/dit.py@3140d97:109,143` in
//! `ModeS7/AIS4900_master`: an `nn.Parameter` given to AdamW), timestep MLP
//! 256 → h → h, adaLN-Zero blocks with qk-norm, final adaLN layer. Matches
//! `facts::params::count` exactly.

use burn::module::Param;
use burn::nn::conv::{Conv3d, Conv3dConfig};
use burn::prelude::*;
use facts::{DitSpec, Input};

use super::amp::{self, AutocastForward};
use super::attention::{AttentionKernel, Heads};
use super::checkpoint::Tape;
use super::{sincos_table, to_tokens, unpatchify, BuildError, DitBlock, FinalLayer, Grid, TimeMlp};

#[derive(Module, Debug)]
pub struct Dit {
    patch_embed: Conv3d,
    /// Trained, as the group's (its gradient and AdamW state count).
    pos: Param<Tensor<2>>,
    time: TimeMlp,
    blocks: Vec<DitBlock>,
    final_layer: FinalLayer,
    patch: usize,
    out_channels: usize,
    #[module(skip)]
    attention: AttentionKernel,
}

impl Dit {
    pub fn new(
        m: &DitSpec,
        input: &Input,
        out_channels: u32,
        attention: AttentionKernel,
        device: &Device,
    ) -> Result<Self, BuildError> {
        let d = m.dims()?;
        let (h, heads, p) = (d.hidden as usize, d.heads as usize, m.patch as usize);
        if heads == 0 || h % heads != 0 {
            return Err(BuildError::Shape(format!("{heads} heads do not divide hidden {h}")));
        }
        let grid = Grid::of(input, m.patch)?;
        let cin = input.channels as usize;
        Ok(Self {
            patch_embed: Conv3dConfig::new([cin, h], [p; 3]).with_stride([p; 3]).init(device),
            pos: Param::from_tensor(sincos_table(grid, h, device)),
            time: TimeMlp::new(h, device),
            blocks: (0..d.depth).map(|_| DitBlock::new(h, Heads { count: heads, kernel: attention }, device)).collect(),
            final_layer: FinalLayer::new(h, p, out_channels as usize, device),
            patch: p,
            out_channels: out_channels as usize,
            attention,
        })
    }

    pub fn attention(&self) -> AttentionKernel {
        self.attention
    }

    /// The noise prediction; each block is checkpointed on `tape` when it is on.
    pub fn forward<'a>(&'a self, x: Tensor<5>, t: &[f32], tape: &mut Tape<'a>) -> Tensor<5> {
        let device = x.device();
        let [_, _, d, h, w] = x.dims();
        let grid = Grid { d: d / self.patch, h: h / self.patch, w: w / self.patch };
        let x = amp::add(to_tokens(self.patch_embed.amp(x)), self.pos.val().unsqueeze::<3>());
        // c: [B, h], handed to the blocks as [B, 1, h].
        let c = tape.value(self.time.forward(t, &device).unsqueeze_dim(1));
        let mut x = tape.value(x);
        for block in &self.blocks {
            x = tape.block(block, [x, c.clone()], |b, [x, c]| b.forward(x, c.squeeze_dim(1)));
        }
        let x = self.final_layer.forward(x.tensor(), c.tensor().squeeze_dim(1));
        unpatchify(x, grid, self.patch, self.out_channels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::test_util::device;
    use burn::module::Module;
    use facts::{ModelSpec, Spatial, Variant};

    fn check(m: DitSpec, input: Input, out: u32) -> Dit {
        let device = device();
        let expected = facts::params::count(&ModelSpec::Dit(m.clone()), &input, out).unwrap();
        let model = Dit::new(&m, &input, out, AttentionKernel::MemoryEfficient, &device).unwrap();
        assert_eq!(model.num_params() as u64, expected, "{m:?}");
        model
    }

    #[test]
    fn params_match_spec_small_explicit_sizes() {
        let input = Input { channels: 1, spatial: Spatial::new(8, 8, 8) };
        check(DitSpec { variant: None, hidden: Some(32), heads: Some(4), depth: Some(2), patch: 2 }, input, 1);
        let input = Input { channels: 2, spatial: Spatial::new(8, 8, 4) };
        check(DitSpec { variant: None, hidden: Some(48), heads: Some(3), depth: Some(3), patch: 4 }, input, 3);
    }

    #[test]
    fn params_match_spec_variant_s() {
        // DiT-S at the spec's own reference shape (the count test in facts/src/params.rs).
        let input = Input { channels: 1, spatial: Spatial::new(10, 16, 16) };
        let m = DitSpec { variant: Some(Variant::S), hidden: None, heads: None, depth: None, patch: 2 };
        check(m, input, 1);
    }

    /// The group's position table is an `nn.Parameter` given to AdamW
    /// (`src/medgen/models/dit.py@3140d97:109`): it gets a gradient, as large
    /// as itself, which AdamW then keeps two moments of.
    #[test]
    fn the_position_table_is_trained() {
        let device = Device::flex().autodiff();
        let input = Input { channels: 1, spatial: Spatial::new(8, 8, 8) };
        let m = DitSpec { variant: None, hidden: Some(32), heads: Some(4), depth: Some(1), patch: 2 };
        let model = Dit::new(&m, &input, 1, AttentionKernel::MemoryEfficient, &device).unwrap();
        let x = Tensor::<5>::random([1, 1, 8, 8, 8], burn::tensor::Distribution::Default, &device);
        let grads = model.forward(x, &[3.0], &mut Tape::new(false)).sum().backward();
        let grad = model.pos.val().grad(&grads).expect("the position table has a gradient");
        assert_eq!(grad.dims(), [64, 32], "one row a token (4x4x4), one column a channel");
    }

    #[test]
    fn forward_shape() {
        let device = device();
        let input = Input { channels: 2, spatial: Spatial::new(8, 8, 8) };
        let m = DitSpec { variant: None, hidden: Some(32), heads: Some(2), depth: Some(1), patch: 4 };
        let model = check(m, input, 1);
        let x = Tensor::<5>::random([1, 2, 8, 8, 8], burn::tensor::Distribution::Default, &device);
        assert_eq!(model.forward(x, &[3.0], &mut Tape::new(false)).dims(), [1, 1, 8, 8, 8]);
    }
}
