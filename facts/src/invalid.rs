//! Why a config cannot run: the shape rules' error, one variant per rule, and the
//! size limits beyond which nothing is planned.

use crate::family::{Family, Variant};

/// Why a config cannot run. Each message names the rule and the numbers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum Invalid {
    #[error("{field} must be positive")]
    Zero { field: String },
    #[error("{field} has {got} entries, expected {expected} (one per level)")]
    ListLength { field: String, expected: usize, got: usize },
    #[error("a {levels}-level UNet needs every spatial dim divisible by 2^{} = {factor}; D,H,W = {d},{h},{w}", levels - 1)]
    UnetDivisibility { levels: usize, factor: u32, d: u32, h: u32, w: u32 },
    #[error("patch {patch} does not divide D,H,W = {d},{h},{w}")]
    PatchNotDividing { patch: u32, d: u32, h: u32, w: u32 },
    #[error("HDiT level {level} merges 2x2x2 tokens but its token grid D,H,W = {d},{h},{w} is not even")]
    HditMerge { level: usize, d: u32, h: u32, w: u32 },
    #[error("level_depths {level_depths} must have odd length (down, bottleneck, up)")]
    HditEvenDepths { level_depths: String },
    #[error("GroupNorm({groups}) does not divide width {width} at level {level}")]
    GroupNorm { groups: u32, width: u32, level: usize },
    #[error("num_head_channels {head_channels} does not divide width {width} at attention level {level}")]
    HeadChannels { head_channels: u32, width: u32, level: usize },
    #[error("{heads} heads do not divide hidden {hidden}")]
    HeadsNotDividing { heads: u32, hidden: u32 },
    #[error("{family} has no variant {variant}")]
    UnknownVariant { family: Family, variant: Variant },
    #[error("{field} is missing: give a variant or the size explicitly")]
    MissingSize { field: String },
    #[error(
        "skip {skip} must be from 1 to the {stages} stages (the last `skip` stages of a MambaDiff do not downsample)"
    )]
    MambaSkip { skip: u32, stages: usize },
    #[error("MambaDiff builds a square in-plane token grid (H = W), got D,H,W = {d},{h},{w}")]
    MambaSquare { d: u32, h: u32, w: u32 },
    #[error("MambaDiff stage {stage} downsamples 2x2x2 but its token grid D,H,W = {d},{h},{w} is not even")]
    MambaDownsample { stage: usize, d: u32, h: u32, w: u32 },
    #[error("{field} is {value}, above the limit of {limit} (a typo? nothing that large can be planned)")]
    TooLarge { field: String, value: u64, limit: u64 },
}

/// Sizes beyond any GPU of the foreseeable future. Planning is linear in the
/// number of blocks and constant in the input's size, but a typo (a depth of
/// 2000000, an input 1000x too big) must be refused, not walked or multiplied out.
pub mod limits {
    /// Input voxels (D x H x W): 2^34, about 1700x a 160x256x256 brain MRI.
    pub const VOXELS: u64 = 1 << 34;
    /// Blocks of one model (transformer depth, HDiT level depths, UNet res blocks).
    pub const BLOCKS: u64 = 10_000;
    /// Levels of a UNet or an HDiT (list lengths).
    pub const LEVELS: u64 = 64;
    /// Channels, hidden size, heads, patch, batch, steps.
    pub const WIDTH: u64 = 1 << 20;
}
