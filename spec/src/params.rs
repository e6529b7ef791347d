//! Exact parameter counts from the architecture (not lookups). The worker's
//! Burn models must report the same `num_params()`; tests on both sides hold
//! the two together, and `tests/published_params.rs` holds them to the reports.

use crate::blocks;
use crate::model::{DitSpec, HditSpec, ModelSpec, UnetSpec, UvitSpec};
use crate::{Input, Invalid, Spatial};

/// Frequency width of the sinusoidal timestep embedding fed to the DiT-style MLPs.
pub const TIME_FREQ_DIM: u64 = 256;

fn conv(cin: u64, cout: u64, k: u64) -> u64 {
    k * k * k * cin * cout + cout
}
fn linear(i: u64, o: u64) -> u64 {
    i * o + o
}
fn group_norm(c: u64) -> u64 {
    2 * c
}
/// MONAI ResnetBlock: norm, conv, time projection, norm, conv, 1x1x1 skip
/// when widths differ. Counted from the block's layers in [`blocks::unet`].
pub fn unet_res_block(cin: u64, cout: u64, temb: u64) -> u64 {
    blocks::unet::RES_BLOCK.params(cin, cout, temb)
}
/// MONAI spatial attention: GroupNorm, q/k/v and output projections with
/// bias. Counted from the block's layers in [`blocks::unet`].
pub fn unet_attention(c: u64) -> u64 {
    blocks::unet::ATTENTION.params(c, c, 0)
}
/// The group's DiT block (DiT and HDiT) with adaLN-Zero: 18h² + 15h, plus
/// qk-norm's affine `LayerNorm(head_dim)` on q and on k, 4·head_dim
/// (`src/medgen/models/dit_blocks.py@3140d97:135-137` in `ModeS7/AIS4900_master`).
/// Counted from the block's layers in [`crate::blocks`].
pub fn dit_block(h: u64, heads: u64) -> u64 {
    blocks::GROUP_DIT.params(h, heads)
}
/// Timestep MLP: sinusoidal(256) → h → h.
fn time_mlp(h: u64) -> u64 {
    linear(TIME_FREQ_DIM, h) + linear(h, h)
}
/// DiT final layer: adaLN (2h) and the patch projection.
fn dit_final(h: u64, patch: u64, out: u64) -> u64 {
    linear(h, 2 * h) + linear(h, patch.pow(3) * out)
}

/// Spatial grid at each level where the model works: UNet voxels per level,
/// transformer token grids (one for DiT/U-ViT, one per level for HDiT).
pub fn level_grids(model: &ModelSpec, input: &Input) -> Vec<Spatial> {
    let sp = input.spatial;
    let halve = |g: Spatial, n: usize| {
        (0..n)
            .scan(g, |g, i| {
                let cur = *g;
                if i + 1 < n {
                    *g = g.div(2);
                }
                Some(cur)
            })
            .collect()
    };
    match model {
        ModelSpec::Unet(u) => halve(sp, u.levels()),
        ModelSpec::Dit(m) => vec![sp.div(m.patch.max(1))],
        ModelSpec::Uvit(m) => vec![sp.div(m.patch.max(1))],
        ModelSpec::Hdit(m) => halve(sp.div(m.patch.max(1)), m.levels()),
    }
}

/// Exact parameter count of `model` on `input` (position tables depend on tokens).
pub fn count(model: &ModelSpec, input: &Input, out_channels: u32) -> Result<u64, Invalid> {
    let cin = input.channels as u64;
    let cout = out_channels as u64;
    match model {
        ModelSpec::Unet(u) => Ok(unet(u, cin, cout)),
        ModelSpec::Dit(m) => dit(m, input, cin, cout),
        ModelSpec::Hdit(m) => hdit(m, input, cin, cout),
        ModelSpec::Uvit(m) => uvit(m, input, cin),
    }
}

fn unet(u: &UnetSpec, cin: u64, cout: u64) -> u64 {
    let ch: Vec<u64> = u.channels.iter().map(|&c| c as u64).collect();
    let levels = ch.len();
    if levels == 0 {
        return 0;
    }
    let res: Vec<u64> = u.res_blocks().iter().map(|&r| r as u64).collect();
    let attn = |l: usize| u.attention_levels.get(l).copied().unwrap_or(false);
    let c0 = ch[0];
    let temb = 4 * c0;
    let mut p = conv(cin, c0, 3) + linear(c0, temb) + linear(temb, temb);

    // Down path: r ResBlocks per level (+ attention), stride-2 conv between levels.
    let mut width = c0;
    for l in 0..levels {
        let input_width = width;
        width = ch[l];
        for j in 0..res[l] {
            p += unet_res_block(if j == 0 { input_width } else { width }, width, temb);
            if attn(l) {
                p += unet_attention(width);
            }
        }
        if l + 1 < levels {
            p += conv(width, width, 3);
        }
    }
    // Middle: ResBlock, attention (always), ResBlock.
    let last = ch[levels - 1];
    p += 2 * unet_res_block(last, last, temb) + unet_attention(last);

    // Up path: r+1 ResBlocks per level on concatenated skips, upsample conv between.
    for up in u.up_path() {
        let width = up.width as u64;
        for cin in up.block_inputs {
            p += unet_res_block(cin as u64, width, temb);
            if attn(up.level) {
                p += unet_attention(width);
            }
        }
        if up.level > 0 {
            p += conv(width, width, 3);
        }
    }
    p + group_norm(c0) + conv(c0, cout, 3)
}

fn tokens(sp: Spatial, patch: u32) -> u64 {
    sp.div(patch.max(1)).voxels()
}

fn dit(m: &DitSpec, input: &Input, cin: u64, cout: u64) -> Result<u64, Invalid> {
    let d = m.dims()?;
    let (h, p) = (d.hidden as u64, m.patch as u64);
    // Sin-cos initialised and trained (`src/medgen/models/dit.py@3140d97:109`).
    let pos = tokens(input.spatial, m.patch) * h;
    let blocks = d.depth as u64 * dit_block(h, d.heads as u64);
    Ok(conv(cin, h, p) + time_mlp(h) + pos + blocks + dit_final(h, p, cout))
}

fn hdit(m: &HditSpec, input: &Input, cin: u64, cout: u64) -> Result<u64, Invalid> {
    let d = m.dims()?;
    let (h, p) = (d.hidden as u64, m.patch as u64);
    let grids = level_grids(&ModelSpec::Hdit(m.clone()), input);
    let pos: u64 = grids.iter().map(|g| g.voxels() * h).sum(); // learned, one table per level
                                                               // Per level transition: merge Linear(8h→h), split Linear(h→8h), skip Linear(2h→h).
    let transitions = grids.len().saturating_sub(1) as u64;
    let per_transition = linear(8 * h, h) + linear(h, 8 * h) + linear(2 * h, h);
    Ok(conv(cin, h, p)
        + time_mlp(h)
        + pos
        + d.depth as u64 * dit_block(h, d.heads as u64)
        + transitions * per_transition
        + dit_final(h, p, cout))
}

/// U-ViT block: pre-LN attention (qkv without bias, as upstream) and MLP,
/// 12h² + 10h, counted from the block's layers in [`crate::blocks`] (no
/// qk-norm: the head count does not enter).
pub fn uvit_block(h: u64) -> u64 {
    blocks::UVIT.params(h, 1)
}

fn uvit(m: &UvitSpec, input: &Input, cin: u64) -> Result<u64, Invalid> {
    let d = m.dims()?;
    let (h, p, depth) = (d.hidden as u64, m.patch as u64, d.depth as u64);
    let pos = (1 + tokens(input.spatial, m.patch)) * h; // time token + patches
    let skips = (depth / 2) * linear(2 * h, h);
    let head = 2 * h + linear(h, p.pow(3) * cin) + conv(cin, cin, 3); // norm, predictor, conv
    Ok(conv(cin, h, p) + time_mlp(h) + pos + depth * uvit_block(h) + skips + head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PerLevel, Variant};

    fn unet_4l_large() -> ModelSpec {
        ModelSpec::Unet(UnetSpec {
            channels: vec![256, 512, 1024, 2048],
            attention_levels: vec![false, false, true, true],
            num_res_blocks: PerLevel::All(2),
            num_head_channels: PerLevel::All(64),
            norm_num_groups: 32,
        })
    }

    #[test]
    fn unet_4l_large_matches_report() {
        let input = Input { channels: 8, spatial: Spatial::new(40, 64, 64) };
        let n = count(&unet_4l_large(), &input, 4).unwrap();
        assert_eq!((n as f64 / 1e5).round() / 10.0, 2664.6);
    }

    #[test]
    fn dit_s_block_formula() {
        let m = ModelSpec::Dit(DitSpec { variant: Some(Variant::S), hidden: None, heads: None, depth: None, patch: 2 });
        let input = Input { channels: 1, spatial: Spatial::new(10, 16, 16) };
        // 12 blocks of 18h² + 15h + 4·64 (qk-norm), h = 384.
        assert_eq!(count(&m, &input, 1).unwrap(), 32_591_240 + 12 * 4 * 64);
    }

    #[test]
    fn level_grids_halve() {
        let input = Input { channels: 8, spatial: Spatial::new(40, 64, 64) };
        let g = level_grids(&unet_4l_large(), &input);
        assert_eq!(g.last(), Some(&Spatial::new(5, 8, 8)));
    }
}
