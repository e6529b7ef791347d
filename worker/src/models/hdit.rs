//! Hourglass DiT: adaLN-Zero DiT blocks at several token resolutions. Each level
//! down merges 2x2x2 tokens (Linear 8h → h), the way up splits them (Linear
//! h → 8h) and joins the level's skip (Linear 2h → h); every level has its own
//! learned position table. Layout exactly as `facts::params::count` counts it.

use burn::module::Param;
use burn::nn::conv::{Conv3d, Conv3dConfig};
use burn::nn::Linear;
use burn::prelude::*;
use facts::{HditSpec, Input};

use super::amp::{self, AutocastForward};
use super::attention::{AttentionKernel, Heads};
use super::checkpoint::{Tape, Value};
use super::{
    linear, merge_tokens, split_tokens, table, to_tokens, unpatchify, BuildError, DitBlock, FinalLayer, Grid, TimeMlp,
};

/// The merge / split / skip projections between level `l` and `l + 1`.
#[derive(Module, Debug)]
pub struct Transition {
    merge: Linear,
    split: Linear,
    skip: Linear,
}

#[derive(Module, Debug)]
pub struct Hdit {
    patch_embed: Conv3d,
    pos: Vec<Param<Tensor<2>>>,
    time: TimeMlp,
    down: Vec<Vec<DitBlock>>,
    mid: Vec<DitBlock>,
    up: Vec<Vec<DitBlock>>,
    transitions: Vec<Transition>,
    final_layer: FinalLayer,
    patch: usize,
    out_channels: usize,
    #[module(skip)]
    attention: AttentionKernel,
}

impl Hdit {
    pub fn new(
        m: &HditSpec,
        input: &Input,
        out_channels: u32,
        attention: AttentionKernel,
        device: &Device,
    ) -> Result<Self, BuildError> {
        let d = m.dims()?;
        let (h, heads, p) = (d.hidden as usize, d.heads as usize, m.patch as usize);
        if heads == 0 || !h.is_multiple_of(heads) {
            return Err(BuildError::Shape(format!("{heads} heads do not divide hidden {h}")));
        }
        let depths = &m.level_depths;
        if depths.len().is_multiple_of(2) {
            return Err(BuildError::Shape(format!(
                "level_depths must have odd length (U-shaped), got {}",
                depths.len()
            )));
        }
        let levels = m.levels();
        let mut grids = vec![Grid::of(input, m.patch)?];
        for _ in 1..levels {
            let next = grids.last().expect("level 0").halve()?;
            grids.push(next);
        }
        let blocks = |n: u32| {
            (0..n).map(|_| DitBlock::new(h, Heads { count: heads, kernel: attention }, device)).collect::<Vec<_>>()
        };
        let cin = input.channels as usize;
        Ok(Self {
            patch_embed: Conv3dConfig::new([cin, h], [p; 3]).with_stride([p; 3]).init(device),
            pos: grids.iter().map(|g| table(g.tokens(), h, device)).collect(),
            time: TimeMlp::new(h, device),
            down: depths[..levels - 1].iter().map(|&n| blocks(n)).collect(),
            mid: blocks(depths[levels - 1]),
            // `up[l]` serves level l (stored in level order; the forward walks it backwards).
            up: depths[levels..].iter().rev().map(|&n| blocks(n)).collect(),
            transitions: (0..levels - 1)
                .map(|_| Transition {
                    merge: linear(8 * h, h, device),
                    split: linear(h, 8 * h, device),
                    skip: linear(2 * h, h, device),
                })
                .collect(),
            final_layer: FinalLayer::new(h, p, out_channels as usize, device),
            patch: p,
            out_channels: out_channels as usize,
            attention,
        })
    }

    pub fn attention(&self) -> AttentionKernel {
        self.attention
    }

    /// The noise prediction; each block is checkpointed on `tape` when it is
    /// on (the merges, splits and skip projections are not, as in the group's runs).
    pub fn forward<'a>(&'a self, x: Tensor<5>, t: &[f32], tape: &mut Tape<'a>) -> Tensor<5> {
        let device = x.device();
        let [_, _, d, h, w] = x.dims();
        let mut grids = vec![Grid { d: d / self.patch, h: h / self.patch, w: w / self.patch }];
        for _ in 1..self.pos.len() {
            let g = *grids.last().expect("level 0");
            grids.push(Grid { d: g.d / 2, h: g.h / 2, w: g.w / 2 });
        }
        // c: [B, h], handed to the blocks as [B, 1, h].
        let c = tape.value(self.time.forward(t, &device).unsqueeze_dim(1));
        let blocks = |tape: &mut Tape<'a>, blocks: &'a [DitBlock], mut x: Value| {
            for b in blocks {
                x = tape.block(b, [x, c.clone()], |b, [x, c]| b.forward(x, c.squeeze_dim(1)));
            }
            x
        };
        let mut x = tape.value(amp::add(to_tokens(self.patch_embed.amp(x)), self.pos[0].val().unsqueeze::<3>()));
        let mut skips = Vec::with_capacity(self.down.len());
        for (l, level) in self.down.iter().enumerate() {
            x = blocks(tape, level, x);
            skips.push(x.clone());
            let merged = self.transitions[l].merge.amp(merge_tokens(x.tensor(), grids[l]));
            x = tape.value(amp::add(merged, self.pos[l + 1].val().unsqueeze::<3>()));
        }
        x = blocks(tape, &self.mid, x);
        for l in (0..self.up.len()).rev() {
            let tr = &self.transitions[l];
            let up = split_tokens(tr.split.amp(x.tensor()), grids[l]);
            let skip = skips.pop().expect("one skip per level").tensor();
            let joined = tape.value(tr.skip.amp(amp::cat(vec![up, skip], 2)));
            x = blocks(tape, &self.up[l], joined);
        }
        let x = self.final_layer.forward(x.tensor(), c.tensor().squeeze_dim(1));
        unpatchify(x, grids[0], self.patch, self.out_channels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::test_util::device;
    use burn::module::Module;
    use facts::{ModelSpec, Spatial};

    fn check(m: HditSpec, input: Input, out: u32) -> Hdit {
        let device = device();
        let expected = facts::params::count(&ModelSpec::Hdit(m.clone()), &input, out).unwrap();
        let model = Hdit::new(&m, &input, out, AttentionKernel::MemoryEfficient, &device).unwrap();
        assert_eq!(model.num_params() as u64, expected, "{m:?}");
        model
    }

    #[test]
    fn params_match_spec_three_levels() {
        let input = Input { channels: 2, spatial: Spatial::new(8, 8, 8) };
        check(
            HditSpec { variant: None, hidden: Some(32), heads: Some(2), patch: 2, level_depths: vec![1, 2, 1, 2, 1] },
            input,
            1,
        );
    }

    #[test]
    fn params_match_spec_two_levels_uneven_depths() {
        let input = Input { channels: 1, spatial: Spatial::new(8, 16, 8) };
        check(
            HditSpec { variant: None, hidden: Some(24), heads: Some(3), patch: 4, level_depths: vec![2, 1, 1] },
            input,
            2,
        );
    }

    #[test]
    fn forward_shape() {
        let device = device();
        let input = Input { channels: 2, spatial: Spatial::new(8, 8, 8) };
        let model = check(
            HditSpec { variant: None, hidden: Some(16), heads: Some(2), patch: 2, level_depths: vec![1, 1, 1] },
            input,
            1,
        );
        let x = Tensor::<5>::random([1, 2, 8, 8, 8], burn::tensor::Distribution::Default, &device);
        assert_eq!(model.forward(x, &[5.0], &mut Tape::new(false)).dims(), [1, 1, 8, 8, 8]);
    }
}
