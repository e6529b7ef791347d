//! MambaDiff (LaMamba-Diff): the group's Mamba + local-attention U-Net, the
//! fifth family. Facts from `ModeS7/AIS4900_master`, the code of the two
//! training runs' commits (`0d7f625` and `59f34b0`); line numbers are `0d7f625`'s
//! unless marked.
//!
//! - Stages of widths `stage_dims`, explicit, or from `embed_dim`: stage i is
//!   `embed_dim x min(2^i, 2^(stages - skip))` (`mamba_diff.py@0d7f625:318-321`),
//!   so `[256, 512, 1024, 1024]` for L with 4 stages and skip 2.
//! - Variants set `embed_dim` and `num_heads` only: S 128/4, B 192/8,
//!   L 256/16, XL 320/16 (`mamba_diff.py@0d7f625:48-53`).
//! - The encoder: stage i's blocks, then a 2x2x2 downsample (Conv3d k2 s2 and
//!   an affine LayerNorm, `:161-182`) for the first `stages - skip` stages; the
//!   last `skip` stages keep the grid. From `59f34b0` (`mamba_diff.py@59f34b0:161-171,385-387`)
//!   a non-downsampling stage whose next width differs gets a channel
//!   projection (Linear + LayerNorm); `0d7f625` had none and could not run
//!   such a config, so one layout covers both commits.
//! - A bottleneck of `bottleneck_depth` blocks at the last width (`:375-380`).
//! - The decoder, deepest stage first: a pre-upsample (Linear to 8x the
//!   narrower width, voxel shuffle, LayerNorm, `:185-206`) where the encoder
//!   downsampled, the channel projection back where it projected; the skip is
//!   *added* (`:514`), then `depths[i] + 1` blocks (`:391`).
//! - Conditioning is the timestep alone (`TimestepEmbedder` to the last
//!   width, `:325-329`); the segmentation is concatenated to the input
//!   channels (`conditioning: concat`, the only one `factory.py@0d7f625:276-320`
//!   builds a MambaDiff with).

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use std::fmt;

use crate::family::{Family, Variant};
use crate::invalid::Invalid;
use crate::shape::{Input, Spatial};

/// A ratio in thousandths (`mlp_ratio: 4.0` is 4000), so that the model stays
/// `Eq` and `Hash` and a config hashes alike however the number is written
/// (`4`, `4.0`). Written and read as the plain number; a ratio that is not a
/// whole number of thousandths is refused when read. The group's code takes
/// `int(ratio * width)` (`mamba_blocks.py@0d7f625:118`, `mamba_diff.py@0d7f625:118`):
/// [`Ratio::of`] is that floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ratio(u32);

impl Ratio {
    pub const fn per_mille(thousandths: u32) -> Ratio {
        Ratio(thousandths)
    }
    pub fn thousandths(self) -> u32 {
        self.0
    }
    /// `int(self x width)` as the group's code computes an inner width.
    pub fn of(self, width: u32) -> u32 {
        (width as u64 * self.0 as u64 / 1000).min(u32::MAX as u64) as u32
    }
    fn as_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }
}

impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.as_f64())
    }
}

impl Serialize for Ratio {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.as_f64())
    }
}

impl<'de> Deserialize<'de> for Ratio {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Ratio;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a positive number with at most three decimals (4.0, 2.5)")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Ratio, E> {
                let milli = (v * 1000.0).round();
                if !(0.0..=u32::MAX as f64).contains(&milli) || (v * 1000.0 - milli).abs() > 1e-6 {
                    return Err(E::invalid_value(de::Unexpected::Float(v), &self));
                }
                Ok(Ratio(milli as u32))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Ratio, E> {
                self.visit_f64(v as f64)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Ratio, E> {
                self.visit_f64(v as f64)
            }
        }
        d.deserialize_any(V)
    }
}

/// How the segmentation reaches the model: concatenated to the input channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MambaConditioning {
    #[default]
    Concat,
}

/// MambaDiff in 3D, field names as the group's Hydra config
/// (`configs/model/mamba_3d.yaml@0d7f625:22-43`) and the training records write them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MambaSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<Variant>,
    /// Width of stage 0; the others follow the schedule (module docs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embed_dim: Option<u32>,
    /// Explicit widths, one per stage (the group's `dims`): `embed_dim` is then not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_dims: Option<Vec<u32>>,
    /// Heads of the window attention, at every stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_heads: Option<u32>,
    pub patch_size: u32,
    /// Blocks per encoder stage (the decoder has one more a stage).
    #[serde(default = "default_depths")]
    pub depths: Vec<u32>,
    #[serde(default = "two")]
    pub bottleneck_depth: u32,
    /// The last `skip` encoder stages do not downsample.
    #[serde(default = "two")]
    pub skip: u32,
    /// Cubic attention window, in tokens a side.
    #[serde(default = "default_window")]
    pub window_size: u32,
    #[serde(default = "one")]
    pub ssm_d_state: u32,
    /// SS2D's inner width over the stage width.
    #[serde(default = "default_ssm_ratio")]
    pub ssm_ratio: Ratio,
    /// FFN hidden width over the stage width.
    #[serde(default = "default_mlp_ratio")]
    pub mlp_ratio: Ratio,
    #[serde(default)]
    pub conditioning: MambaConditioning,
}

// Defaults of `configs/model/mamba_3d.yaml@0d7f625:30-40`.
fn default_depths() -> Vec<u32> {
    vec![2, 2, 2, 2]
}
fn two() -> u32 {
    2
}
fn one() -> u32 {
    1
}
fn default_window() -> u32 {
    8
}
fn default_ssm_ratio() -> Ratio {
    Ratio(2000)
}
fn default_mlp_ratio() -> Ratio {
    Ratio(4000)
}

/// Stage widths and heads once variant and overrides are resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MambaDims {
    pub stage_dims: Vec<u32>,
    pub heads: u32,
}

/// One part of the forward pass, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MambaPart {
    /// `blocks` MambaDiff blocks of width `dim` on `grid`; `stage` is the
    /// encoder index the part belongs to (the bottleneck: the last).
    Blocks { role: Role, stage: usize, dim: u32, blocks: u32, grid: Spatial },
    /// A change of width (and grid) between stages; `grid` is the input's.
    Transition { kind: TransitionKind, stage: usize, from: u32, to: u32, grid: Spatial },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Encoder,
    Bottleneck,
    /// Adds the encoder stage's output (the skip) before its blocks.
    Decoder,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransitionKind {
    /// Conv3d(from, to, k2, s2) + LayerNorm(to): the grid halves.
    Down,
    /// Linear(from, to) + LayerNorm(to): the grid stays.
    Project,
    /// Linear(from, 8 to), voxel shuffle, LayerNorm(to): the grid doubles.
    Up,
}

impl Variant {
    /// (embed_dim, num_heads) of a MambaDiff variant (`mamba_diff.py@0d7f625:48-53`).
    pub fn mamba_sizes(self) -> Option<(u32, u32)> {
        match self {
            Variant::S => Some((128, 4)),
            Variant::B => Some((192, 8)),
            Variant::L => Some((256, 16)),
            Variant::XL => Some((320, 16)),
            Variant::SDeep | Variant::M => None,
        }
    }
}

impl MambaSpec {
    pub fn stages(&self) -> usize {
        self.depths.len()
    }

    /// Stage widths from `embed_dim` by the group's schedule; `None` when
    /// `skip` is not within 1..=stages (the schedule has no value there).
    pub fn schedule(embed_dim: u32, stages: usize, skip: u32) -> Option<Vec<u32>> {
        let skip = skip as usize;
        (1..=stages)
            .contains(&skip)
            .then(|| (0..stages).map(|i| embed_dim.saturating_mul(1 << i.min(stages - skip).min(31))).collect())
    }

    /// Resolved widths and heads.
    pub fn dims(&self) -> Result<MambaDims, Invalid> {
        let base = match self.variant {
            Some(v) => Some(v.mamba_sizes().ok_or(Invalid::UnknownVariant { family: Family::Mamba, variant: v })?),
            None => None,
        };
        let missing = |field: &str| Invalid::MissingSize { field: field.to_string() };
        let heads = self.num_heads.or(base.map(|b| b.1)).ok_or_else(|| missing("num_heads"))?;
        let n = self.stages();
        if n == 0 {
            return Err(Invalid::Zero { field: "model.depths (stages)".into() });
        }
        if self.skip == 0 || self.skip as usize > n {
            return Err(Invalid::MambaSkip { skip: self.skip, stages: n });
        }
        let stage_dims = match &self.stage_dims {
            Some(d) if d.len() != n => {
                return Err(Invalid::ListLength { field: "model.stage_dims".into(), expected: n, got: d.len() })
            }
            Some(d) => d.clone(),
            None => {
                let e = self.embed_dim.or(base.map(|b| b.0)).ok_or_else(|| missing("embed_dim"))?;
                Self::schedule(e, n, self.skip).unwrap_or_default()
            }
        };
        Ok(MambaDims { stage_dims, heads })
    }

    /// The forward pass part by part on `input` (grids after the patch embed).
    pub fn layout(&self, input: &Input) -> Result<Vec<MambaPart>, Invalid> {
        let dims = self.dims()?.stage_dims;
        let n = dims.len();
        let downs = n - self.skip as usize;
        let mut grid = input.spatial.div(self.patch_size.max(1));
        let mut grids = Vec::with_capacity(n);
        let mut parts = Vec::with_capacity(4 * n + 1);
        for (i, &dim) in dims.iter().enumerate() {
            grids.push(grid);
            parts.push(MambaPart::Blocks { role: Role::Encoder, stage: i, dim, blocks: self.depths[i], grid });
            let kind = if i < downs {
                Some(TransitionKind::Down)
            } else {
                (i + 1 < n && dims[i + 1] != dim).then_some(TransitionKind::Project)
            };
            if let Some(kind) = kind {
                parts.push(MambaPart::Transition { kind, stage: i, from: dim, to: dims[i + 1], grid });
            }
            if i < downs {
                grid = grid.div(2);
            }
        }
        let last = n - 1;
        parts.push(MambaPart::Blocks {
            role: Role::Bottleneck,
            stage: last,
            dim: dims[last],
            blocks: self.bottleneck_depth,
            grid,
        });
        for e in (0..n).rev() {
            if e < last {
                let kind = if e < downs {
                    Some(TransitionKind::Up)
                } else {
                    (dims[e] != dims[e + 1]).then_some(TransitionKind::Project)
                };
                if let Some(kind) = kind {
                    parts.push(MambaPart::Transition { kind, stage: e, from: dims[e + 1], to: dims[e], grid });
                }
            }
            grid = grids[e];
            parts.push(MambaPart::Blocks {
                role: Role::Decoder,
                stage: e,
                dim: dims[e],
                blocks: self.depths[e] + 1,
                grid,
            });
        }
        Ok(parts)
    }

    /// The widths of a block's inner layers at stage width `dim`.
    pub fn inner(&self, dim: u32) -> MambaInner {
        MambaInner {
            ssm: self.ssm_ratio.of(dim),
            dt_rank: dim.div_ceil(16),
            mlp: self.mlp_ratio.of(dim),
            window_tokens: self.window_size.saturating_pow(3),
        }
    }
}

/// Inner widths of one block (`mamba_blocks.py@0d7f625:118-119`, `mamba_diff.py@0d7f625:118`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MambaInner {
    /// SS2D's `d_inner = int(ssm_ratio x dim)`.
    pub ssm: u32,
    /// `dt_rank = ceil(dim / 16)`.
    pub dt_rank: u32,
    /// The FFN's hidden width, `int(dim x mlp_ratio)`.
    pub mlp: u32,
    /// Tokens of one attention window, `window_size³`.
    pub window_tokens: u32,
}

/// SS2D scans six directions in 3D (±D, ±H, ±W: `mamba_blocks.py@0d7f625:121`).
pub const SCAN_DIRECTIONS: u32 = 6;

#[cfg(test)]
mod tests {
    use super::*;

    fn l() -> MambaSpec {
        serde_json::from_value(serde_json::json!({
            "bottleneck_depth": 2, "conditioning": "concat", "depths": [2, 2, 2, 2], "embed_dim": 256,
            "mlp_ratio": 4.0, "num_heads": 16, "patch_size": 4, "skip": 2, "ssm_d_state": 1,
            "ssm_ratio": 2.0, "stage_dims": [256, 512, 1024, 1024], "variant": "L", "window_size": 8
        }))
        .expect("the records' Mamba-L")
    }

    #[test]
    fn ratios_are_thousandths_read_from_the_plain_number() {
        let r: Ratio = serde_json::from_str("2.5").unwrap();
        assert_eq!((r.thousandths(), r.of(256), r.to_string()), (2500, 640, "2.5".to_string()));
        assert_eq!(serde_json::from_str::<Ratio>("4").unwrap(), serde_json::from_str::<Ratio>("4.0").unwrap());
        assert!(serde_json::from_str::<Ratio>("1.0005").is_err());
        assert!(serde_json::from_str::<Ratio>("-1").is_err());
        assert_eq!(serde_json::to_string(&Ratio::per_mille(4000)).unwrap(), "4.0");
    }

    #[test]
    fn the_schedule_doubles_until_the_skip_stages() {
        assert_eq!(MambaSpec::schedule(256, 4, 2), Some(vec![256, 512, 1024, 1024]));
        assert_eq!(MambaSpec::schedule(128, 5, 1), Some(vec![128, 256, 512, 1024, 2048]));
        assert_eq!(MambaSpec::schedule(128, 4, 0), None);
        assert_eq!(l().dims().unwrap(), MambaDims { stage_dims: vec![256, 512, 1024, 1024], heads: 16 });
    }

    #[test]
    fn the_l_layout_downsamples_twice_and_upsamples_twice() {
        let input = Input { channels: 2, spatial: Spatial::new(160, 256, 256) };
        let parts = l().layout(&input).unwrap();
        let g = |d, h, w| Spatial::new(d, h, w);
        let blocks = |role, stage, dim, blocks, grid| MambaPart::Blocks { role, stage, dim, blocks, grid };
        let t = |kind, stage, from, to, grid| MambaPart::Transition { kind, stage, from, to, grid };
        use Role::*;
        use TransitionKind::*;
        assert_eq!(
            parts,
            vec![
                blocks(Encoder, 0, 256, 2, g(40, 64, 64)),
                t(Down, 0, 256, 512, g(40, 64, 64)),
                blocks(Encoder, 1, 512, 2, g(20, 32, 32)),
                t(Down, 1, 512, 1024, g(20, 32, 32)),
                blocks(Encoder, 2, 1024, 2, g(10, 16, 16)),
                blocks(Encoder, 3, 1024, 2, g(10, 16, 16)),
                blocks(Bottleneck, 3, 1024, 2, g(10, 16, 16)),
                blocks(Decoder, 3, 1024, 3, g(10, 16, 16)),
                blocks(Decoder, 2, 1024, 3, g(10, 16, 16)),
                t(Up, 1, 1024, 512, g(10, 16, 16)),
                blocks(Decoder, 1, 512, 3, g(20, 32, 32)),
                t(Up, 0, 512, 256, g(20, 32, 32)),
                blocks(Decoder, 0, 256, 3, g(40, 64, 64)),
            ]
        );
    }
}
