//! Exact parameter counts from the architecture (not lookups). The worker's
//! Burn models must report the same `num_params()`; tests on both sides hold
//! the two together, and `tests/published_params.rs` holds them to the reports.

use crate::blocks;
use crate::mamba::{MambaPart, MambaSpec, TransitionKind, SCAN_DIRECTIONS};
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
        ModelSpec::Mamba(m) => {
            // One grid per downsample, and the first.
            halve(sp.div(m.patch_size.max(1)), m.stages().saturating_sub(m.skip as usize) + 1)
        }
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
        ModelSpec::Mamba(m) => mamba(m, input, cin, cout),
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

/// SS2D at stage width `c`, d_inner `e`, dt_rank `r`, state `n`, `k` = 6
/// scan directions (`mamba_blocks.py@0d7f625:123-157`): in_proj Linear(c, 2e)
/// without bias, the depthwise Conv3d(e, e, 3, groups e) with bias, x_proj
/// Linear(e, r + 2n) without bias, dt_projs Linear(r, k·e) without bias, A_log
/// (k·e x n), D and dt_bias (k·e each), out_proj Linear(e, c) without bias,
/// out_norm LayerNorm(e) affine.
pub fn mamba_ssm(m: &MambaSpec, c: u64) -> u64 {
    let i = m.inner(c as u32);
    let (e, r, n, k) = (i.ssm as u64, i.dt_rank as u64, m.ssm_d_state as u64, SCAN_DIRECTIONS as u64);
    c * 2 * e + (27 * e + e) + e * (r + 2 * n) + r * k * e + k * e * n + 2 * k * e + e * c + 2 * e
}

/// Window attention (`mamba_blocks.py@0d7f625:454-465`): qkv Linear(c, 3c)
/// and proj Linear(c, c) with bias, the relative position bias table
/// ((2w - 1)³ x heads); the position index is a buffer, not a parameter.
pub fn mamba_attention(c: u64, heads: u64, window: u64) -> u64 {
    linear(c, 3 * c) + linear(c, c) + (2 * window).saturating_sub(1).pow(3) * heads
}

/// One MambaDiff block at width `c` under the conditioning width `cond`
/// (`mamba_diff.py@0d7f625:90-118`): cond_proj Linear(cond, c) where the
/// widths differ, adaLN Linear(c, 9c), SS2D, window attention, the FFN
/// (`Mlp`: fc1, fc2 with bias, `dit_blocks.py@0d7f625:262-264`); its three
/// LayerNorms carry no affine weights.
pub fn mamba_block(m: &MambaSpec, c: u64, cond: u64, heads: u64) -> u64 {
    let hidden = m.inner(c as u32).mlp as u64;
    let cond_proj = if cond != c { linear(cond, c) } else { 0 };
    cond_proj
        + linear(c, 9 * c)
        + mamba_ssm(m, c)
        + mamba_attention(c, heads, m.window_size as u64)
        + linear(c, hidden)
        + linear(hidden, c)
}

/// A change of width between stages, each with an affine LayerNorm of the
/// output width (`mamba_diff.py@0d7f625:161-206`, the projection `@59f34b0:161-171`).
pub fn mamba_transition(kind: TransitionKind, from: u64, to: u64) -> u64 {
    2 * to
        + match kind {
            TransitionKind::Down => 8 * from * to + to,
            TransitionKind::Project => linear(from, to),
            TransitionKind::Up => linear(from, 8 * to),
        }
}

/// MambaDiff (`mamba_diff.py@0d7f625:325-422`): the timestep MLP to the
/// last width, the patch embed Conv3d, the sin-cos position table of the
/// stage-0 grid (trained: `requires_grad=True`, `:353-356`), the blocks and
/// transitions of [`MambaSpec::layout`], the final adaLN Linear(cond, 2·d0) and
/// Linear(d0, p³·out); `final_norm` has no affine weights.
fn mamba(m: &MambaSpec, input: &Input, cin: u64, cout: u64) -> Result<u64, Invalid> {
    let d = m.dims()?;
    let (p, heads) = (m.patch_size as u64, d.heads as u64);
    let d0 = d.stage_dims[0] as u64;
    let cond = *d.stage_dims.last().unwrap_or(&0) as u64;
    let mut total = time_mlp(cond) + conv(cin, d0, p) + tokens(input.spatial, m.patch_size) * d0;
    for part in m.layout(input)? {
        total += match part {
            MambaPart::Blocks { dim, blocks, .. } => blocks as u64 * mamba_block(m, dim as u64, cond, heads),
            MambaPart::Transition { kind, from, to, .. } => mamba_transition(kind, from as u64, to as u64),
        };
    }
    Ok(total + linear(cond, 2 * d0) + linear(d0, p.pow(3) * cout))
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

    /// MambaDiff-L of exp34 (the records' `model`), 2 channels in at
    /// 160x256x256, 1 out: every layer counted by hand.
    #[test]
    fn mamba_l_of_exp34_counts_every_layer() {
        let m: crate::MambaSpec = serde_json::from_value(serde_json::json!({
            "variant": "L", "embed_dim": 256, "stage_dims": [256, 512, 1024, 1024], "num_heads": 16,
            "patch_size": 4, "depths": [2, 2, 2, 2], "bottleneck_depth": 2, "skip": 2, "window_size": 8,
            "ssm_d_state": 1, "ssm_ratio": 2.0, "mlp_ratio": 4.0, "conditioning": "concat"
        }))
        .unwrap();
        // Block at c = 256 (cond 1024, d_inner e = 512, dt_rank 16, state 1, 6 directions,
        // window 8, 16 heads, FFN 1024), `mamba_blocks.py@0d7f625:123-157,454-465`, `mamba_diff.py@0d7f625:90-118`:
        let ssm_256 = 256 * 1024 // in_proj
            + (27 * 512 + 512) // depthwise conv
            + 512 * (16 + 2) // x_proj
            + 16 * 6 * 512 // dt_projs
            + 6 * 512 // A_log
            + 2 * 6 * 512 // D, dt_bias
            + 512 * 256 // out_proj
            + 2 * 512; // out_norm
        assert_eq!(ssm_256, 476_160);
        let attn_256 = (256 * 768 + 768) + (256 * 256 + 256) + 15 * 15 * 15 * 16; // qkv, proj, bias table
        assert_eq!(attn_256, 317_168);
        let ffn_256 = (256 * 1024 + 1024) + (1024 * 256 + 256);
        let block_256 = (1024 * 256 + 256) + (256 * 2304 + 2304) + ssm_256 + attn_256 + ffn_256; // cond_proj, adaLN
        assert_eq!(block_256, 2_173_424);
        assert_eq!(mamba_block(&m, 256, 1024, 16), block_256);
        // c = 512: e = 1024, dt_rank 32, FFN 2048.
        let ssm_512 = 512 * 2048
            + (27 * 1024 + 1024)
            + 1024 * 34
            + 32 * 6 * 1024
            + 6 * 1024
            + 2 * 6 * 1024
            + 1024 * 512
            + 2 * 1024;
        let attn_512 = (512 * 1536 + 1536) + (512 * 512 + 512) + 3375 * 16;
        let ffn_512 = (512 * 2048 + 2048) + (2048 * 512 + 512);
        let block_512 = (1024 * 512 + 512) + (512 * 4608 + 4608) + ssm_512 + attn_512 + ffn_512;
        assert_eq!(block_512, 7_946_480);
        assert_eq!(mamba_block(&m, 512, 1024, 16), block_512);
        // c = 1024 = cond: no cond_proj; e = 2048, dt_rank 64, FFN 4096.
        let ssm_1024 = 1024 * 4096
            + (27 * 2048 + 2048)
            + 2048 * 66
            + 64 * 6 * 2048
            + 6 * 2048
            + 2 * 6 * 2048
            + 2048 * 1024
            + 2 * 2048;
        let attn_1024 = (1024 * 3072 + 3072) + (1024 * 1024 + 1024) + 3375 * 16;
        let ffn_1024 = (1024 * 4096 + 4096) + (4096 * 1024 + 1024);
        let block_1024 = (1024 * 9216 + 9216) + ssm_1024 + attn_1024 + ffn_1024;
        assert_eq!(block_1024, 29_403_888);
        // Blocks: width 256 and 512 two in the encoder, three in the decoder; width 1024
        // two in each of encoder stages 2 and 3, two in the bottleneck, three in each decoder stage.
        let blocks = 5 * block_256 + 5 * block_512 + 12 * block_1024;
        let rest = (256 * 1024 + 1024) + (1024 * 1024 + 1024) // timestep MLP 256 → 1024 → 1024
            + (2 * 64 * 256 + 256) // patch embed Conv3d(2, 256, 4, stride 4)
            + 40 * 64 * 64 * 256 // position table of the 40x64x64 grid
            + (8 * 256 * 512 + 512 + 2 * 512) // downsample 0: Conv3d k2 + LayerNorm(512)
            + (8 * 512 * 1024 + 1024 + 2 * 1024) // downsample 1
            + (1024 * 4096 + 4096 + 2 * 512) // upsample 1024 → 512: Linear(1024, 8·512) + LayerNorm
            + (512 * 2048 + 2048 + 2 * 256) // upsample 512 → 256
            + (1024 * 512 + 512) // final adaLN
            + (256 * 64 + 64); // final Linear(256, 4³ x 1)
        let input = Input { channels: 2, spatial: Spatial::new(160, 256, 256) };
        assert_eq!(count(&ModelSpec::Mamba(m), &input, 1).unwrap(), blocks + rest);
        assert_eq!(blocks + rest, 457_774_304);
    }
}
