//! Model configs of the five families, as users write them in YAML and as the
//! worker receives them in the manifest.

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use std::fmt;

pub use crate::family::{join, Family, TransformerDims, Variant};
use crate::invalid::Invalid;
use crate::mamba::MambaSpec;

/// One value for every level, or one per level (`num_res_blocks: 2` or `[2, 2, 3]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PerLevel {
    All(u32),
    Each(Vec<u32>),
}

impl PerLevel {
    /// The value at `level`; `None` when a per-level list is too short.
    pub fn at(&self, level: usize) -> Option<u32> {
        match self {
            PerLevel::All(v) => Some(*v),
            PerLevel::Each(v) => v.get(level).copied(),
        }
    }
    /// Expanded to `levels` entries (a short list is padded with its last value;
    /// validation reports wrong lengths before anything uses this).
    pub fn expand(&self, levels: usize) -> Vec<u32> {
        match self {
            PerLevel::All(v) => vec![*v; levels],
            PerLevel::Each(v) => (0..levels).map(|i| v.get(i).or(v.last()).copied().unwrap_or(0)).collect(),
        }
    }
}

impl fmt::Display for PerLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PerLevel::All(v) => write!(f, "{v}"),
            PerLevel::Each(v) => write!(f, "{}", join(v)),
        }
    }
}

impl Serialize for PerLevel {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            PerLevel::All(v) => s.serialize_u32(*v),
            PerLevel::Each(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for PerLevel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PerLevel;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a non-negative integer or a list of them, one per level")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PerLevel, E> {
                u32::try_from(v).map(PerLevel::All).map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PerLevel, E> {
                u32::try_from(v).map(PerLevel::All).map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PerLevel, A::Error> {
                let mut out = Vec::new();
                while let Some(x) = seq.next_element::<u32>()? {
                    out.push(x);
                }
                Ok(PerLevel::Each(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// MONAI `DiffusionModelUNet` (spatial_dims=3). See domain.md for the block layout.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnetSpec {
    /// One width per level.
    pub channels: Vec<u32>,
    /// Spatial self-attention after every ResBlock of that level.
    pub attention_levels: Vec<bool>,
    /// ResBlocks per level on the way down (the up path has one more).
    #[serde(default = "default_res_blocks")]
    pub num_res_blocks: PerLevel,
    /// Channels per attention head: heads = width / num_head_channels.
    pub num_head_channels: PerLevel,
    #[serde(default = "default_groups")]
    pub norm_num_groups: u32,
}

fn default_res_blocks() -> PerLevel {
    PerLevel::All(2)
}
fn default_groups() -> u32 {
    32
}

impl UnetSpec {
    pub fn levels(&self) -> usize {
        self.channels.len()
    }
    pub fn res_blocks(&self) -> Vec<u32> {
        self.num_res_blocks.expand(self.levels())
    }
    pub fn head_channels(&self) -> Vec<u32> {
        self.num_head_channels.expand(self.levels())
    }

    /// The decoder, deepest level first, as MONAI builds it: `r + 1` ResBlocks a
    /// level, each fed its predecessor's output concatenated with an encoder
    /// skip; the first block's predecessor is the level below, and the last
    /// block's skip comes from one level up the encoder (`channels[l - 1]`,
    /// `channels[0]` at level 0). Parameter counts, the Burn model and the
    /// precheck's walk all follow this one layout.
    pub fn up_path(&self) -> Vec<UpLevel> {
        let (ch, res) = (&self.channels, self.res_blocks());
        let mut below = ch.last().copied().unwrap_or(0);
        (0..ch.len())
            .rev()
            .map(|level| {
                let width = ch[level];
                let last_skip = ch[level.saturating_sub(1)];
                let n = res[level] as usize + 1;
                let block_inputs = (0..n)
                    .map(|j| {
                        let prev = if j == 0 { below } else { width };
                        let skip = if j + 1 == n { last_skip } else { width };
                        prev + skip
                    })
                    .collect();
                below = width;
                UpLevel { level, width, block_inputs }
            })
            .collect()
    }
}

/// One decoder level of a UNet (see [`UnetSpec::up_path`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpLevel {
    pub level: usize,
    /// Output width of every ResBlock of the level.
    pub width: u32,
    /// Input width of each ResBlock: previous output + concatenated skip.
    pub block_inputs: Vec<u32>,
}

/// Resolve a variant and explicit overrides to concrete sizes.
fn resolve(
    family: Family,
    variant: Option<Variant>,
    hidden: Option<u32>,
    heads: Option<u32>,
    depth: Option<u32>,
) -> Result<TransformerDims, Invalid> {
    let base = match variant {
        Some(v) => Some(v.dims(family).ok_or(Invalid::UnknownVariant { family, variant: v })?),
        None => None,
    };
    let pick = |explicit: Option<u32>, from_variant: Option<u32>, field: &'static str| {
        explicit.or(from_variant).ok_or_else(|| Invalid::MissingSize { field: field.to_string() })
    };
    Ok(TransformerDims {
        hidden: pick(hidden, base.map(|b| b.0), "hidden")?,
        heads: pick(heads, base.map(|b| b.1), "heads")?,
        depth: pick(depth, base.map(|b| b.2), "depth")?,
    })
}

/// DiT (Peebles & Xie) in 3D: patch embed, fixed sin-cos positions, adaLN-Zero blocks.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DitSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<Variant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    pub patch: u32,
}

impl DitSpec {
    pub fn dims(&self) -> Result<TransformerDims, Invalid> {
        resolve(Family::Dit, self.variant, self.hidden, self.heads, self.depth)
    }
}

/// Hourglass DiT: DiT blocks at several token resolutions, 2x2x2 merges between.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HditSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<Variant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<u32>,
    pub patch: u32,
    /// U-shaped block counts, odd length: `[2, 4, 6, 4, 2]` is 3 levels.
    pub level_depths: Vec<u32>,
}

impl HditSpec {
    /// Token resolutions (levels); the middle entry of `level_depths` is the bottleneck.
    pub fn levels(&self) -> usize {
        self.level_depths.len().div_ceil(2)
    }
    pub fn dims(&self) -> Result<TransformerDims, Invalid> {
        // Saturating: a typo'd depth is refused by validate, not an overflow.
        let depth = self.level_depths.iter().fold(0u32, |a, &d| a.saturating_add(d));
        resolve(Family::Hdit, self.variant, self.hidden, self.heads, Some(depth))
    }
}

/// U-ViT (Bao et al.): flat transformer, time as a token, long skips.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UvitSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<Variant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    pub patch: u32,
}

impl UvitSpec {
    pub fn dims(&self) -> Result<TransformerDims, Invalid> {
        resolve(Family::Uvit, self.variant, self.hidden, self.heads, self.depth)
    }
}

/// A model of one of the five families; `family` is the YAML tag.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "family", rename_all = "lowercase")]
pub enum ModelSpec {
    Unet(UnetSpec),
    Dit(DitSpec),
    Hdit(HditSpec),
    Uvit(UvitSpec),
    Mamba(MambaSpec),
}

impl ModelSpec {
    pub fn family(&self) -> Family {
        match self {
            ModelSpec::Unet(_) => Family::Unet,
            ModelSpec::Dit(_) => Family::Dit,
            ModelSpec::Hdit(_) => Family::Hdit,
            ModelSpec::Uvit(_) => Family::Uvit,
            ModelSpec::Mamba(_) => Family::Mamba,
        }
    }

    /// Transformer sizes; `None` for the UNet and MambaDiff (stages of
    /// several widths: [`MambaSpec::dims`]).
    pub fn transformer_dims(&self) -> Option<Result<TransformerDims, Invalid>> {
        match self {
            ModelSpec::Unet(_) | ModelSpec::Mamba(_) => None,
            ModelSpec::Dit(m) => Some(m.dims()),
            ModelSpec::Hdit(m) => Some(m.dims()),
            ModelSpec::Uvit(m) => Some(m.dims()),
        }
    }

    /// Patch size of the transformer families and MambaDiff.
    pub fn patch(&self) -> Option<u32> {
        match self {
            ModelSpec::Unet(_) => None,
            ModelSpec::Mamba(m) => Some(m.patch_size),
            ModelSpec::Dit(m) => Some(m.patch),
            ModelSpec::Hdit(m) => Some(m.patch),
            ModelSpec::Uvit(m) => Some(m.patch),
        }
    }

    /// A short human description of the key dimensions, as the reports label rows.
    pub fn summary(&self) -> String {
        match self {
            ModelSpec::Unet(u) => {
                let attn: Vec<String> =
                    u.attention_levels.iter().map(|a| if *a { "T" } else { "F" }.to_string()).collect();
                format!(
                    "{} attn[{}] r={} h={}",
                    join(&u.channels),
                    attn.join(""),
                    u.num_res_blocks,
                    u.num_head_channels
                )
            }
            ModelSpec::Dit(m) => transformer_summary(m.variant, m.dims(), m.patch, None),
            ModelSpec::Hdit(m) => transformer_summary(m.variant, m.dims(), m.patch, Some(&m.level_depths)),
            ModelSpec::Uvit(m) => transformer_summary(m.variant, m.dims(), m.patch, None),
            ModelSpec::Mamba(m) => mamba_summary(m),
        }
    }
}

/// `L (dims [256, 512, 1024, 1024] x16 d[2, 2, 2, 2]+2) p4`.
fn mamba_summary(m: &MambaSpec) -> String {
    let name = m.variant.map(|v| v.name().to_string()).unwrap_or_else(|| "custom".into());
    let sizes = match m.dims() {
        Ok(d) => format!("dims {} x{}", join(&d.stage_dims), d.heads),
        Err(_) => "?".into(),
    };
    format!("{name} ({sizes} d{}+{}) p{}", join(&m.depths), m.bottleneck_depth, m.patch_size)
}

fn transformer_summary(
    variant: Option<Variant>,
    dims: Result<TransformerDims, Invalid>,
    patch: u32,
    level_depths: Option<&[u32]>,
) -> String {
    let name = variant.map(|v| v.name().to_string()).unwrap_or_else(|| "custom".into());
    let sizes = match dims {
        Ok(d) => format!("h{} x{} d{}", d.hidden, d.heads, d.depth),
        Err(_) => "?".into(),
    };
    let levels = level_depths.map(|l| format!(" {}", join(l))).unwrap_or_default();
    format!("{name} ({sizes}) p{patch}{levels}")
}
