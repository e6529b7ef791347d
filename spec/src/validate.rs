//! Shape rules: configs that cannot run at all (a dimension error at build or
//! first forward), reported before anything is submitted. Never an OOM.

use crate::model::{join, Family, ModelSpec, Variant};
use crate::{RunConfig, Spatial};

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

/// The first size of `cfg` above its [`limits`], if any.
pub fn too_large(cfg: &RunConfig) -> Option<Invalid> {
    let over = |field: &str, value: u64, limit: u64| {
        (value > limit).then(|| Invalid::TooLarge { field: field.into(), value, limit })
    };
    let sp = cfg.input.spatial;
    let voxels = sp.d as u128 * sp.h as u128 * sp.w as u128;
    let mut checks: Vec<Option<Invalid>> = vec![
        over("input voxels (D x H x W)", voxels.min(u64::MAX as u128) as u64, limits::VOXELS),
        over("input.channels", cfg.input.channels as u64, limits::WIDTH),
        over("output_channels", cfg.out_channels as u64, limits::WIDTH),
        over("batch", cfg.batch as u64, limits::WIDTH),
        over("steps", cfg.steps as u64, limits::WIDTH),
    ];
    match &cfg.model {
        ModelSpec::Unet(u) => {
            checks.push(over("model.channels (levels)", u.levels() as u64, limits::LEVELS));
            checks.push(over("model.channels", u.channels.iter().copied().max().unwrap_or(0) as u64, limits::WIDTH));
            if u.levels() as u64 <= limits::LEVELS {
                checks.push(over(
                    "model.num_res_blocks (all levels)",
                    u.res_blocks().iter().map(|&r| r as u64).sum(),
                    limits::BLOCKS,
                ));
            }
        }
        ModelSpec::Dit(m) => checks.push(transformer_limits(m.dims(), m.patch)),
        ModelSpec::Uvit(m) => checks.push(transformer_limits(m.dims(), m.patch)),
        ModelSpec::Hdit(m) => {
            checks.push(over("model.level_depths (levels)", m.level_depths.len() as u64, limits::LEVELS));
            checks.push(over(
                "model.level_depths (blocks)",
                m.level_depths.iter().map(|&d| d as u64).sum(),
                limits::BLOCKS,
            ));
            checks.push(transformer_limits(m.dims(), m.patch));
        }
    }
    checks.into_iter().flatten().next()
}

fn transformer_limits(dims: Result<crate::TransformerDims, Invalid>, patch: u32) -> Option<Invalid> {
    let over = |field: &str, value: u64, limit: u64| {
        (value > limit).then(|| Invalid::TooLarge { field: field.into(), value, limit })
    };
    let d = dims.ok();
    [
        over("model.patch", patch as u64, limits::WIDTH),
        d.and_then(|d| over("model.hidden", d.hidden as u64, limits::WIDTH)),
        d.and_then(|d| over("model.heads", d.heads as u64, limits::WIDTH)),
        d.and_then(|d| over("model.depth", d.depth as u64, limits::BLOCKS)),
    ]
    .into_iter()
    .flatten()
    .next()
}

/// Every rule the config breaks (empty when it can run).
pub fn validate(cfg: &RunConfig) -> Vec<Invalid> {
    // Too large is the only answer for a typo'd size: the other rules would
    // multiply it out (and the walks would run it block by block).
    if let Some(e) = too_large(cfg) {
        return vec![e];
    }
    let mut out = Vec::new();
    let sp = cfg.input.spatial;
    for (field, v) in [
        ("input.channels", cfg.input.channels),
        ("input.spatial.d", sp.d),
        ("input.spatial.h", sp.h),
        ("input.spatial.w", sp.w),
        ("output_channels", cfg.out_channels),
        ("batch", cfg.batch),
    ] {
        if v == 0 {
            out.push(Invalid::Zero { field: field.into() });
        }
    }
    match &cfg.model {
        ModelSpec::Unet(u) => unet(u, sp, &mut out),
        ModelSpec::Dit(m) => transformer(m.dims(), m.patch, sp, &mut out),
        ModelSpec::Uvit(m) => transformer(m.dims(), m.patch, sp, &mut out),
        ModelSpec::Hdit(m) => {
            if m.level_depths.is_empty() || m.level_depths.len() % 2 == 0 {
                out.push(Invalid::HditEvenDepths { level_depths: join(&m.level_depths) });
            }
            transformer(m.dims(), m.patch, sp, &mut out);
            if m.patch > 0 && sp.divisible_by(m.patch) {
                let mut grid = sp.div(m.patch);
                for level in 0..m.levels().saturating_sub(1) {
                    if !grid.divisible_by(2) {
                        let [d, h, w] = grid.dims();
                        out.push(Invalid::HditMerge { level, d, h, w });
                        break;
                    }
                    grid = grid.div(2);
                }
            }
        }
    }
    out
}

fn unet(u: &crate::UnetSpec, sp: Spatial, out: &mut Vec<Invalid>) {
    let levels = u.levels();
    if levels == 0 {
        out.push(Invalid::ListLength { field: "model.channels".into(), expected: 1, got: 0 });
        return;
    }
    let mut lists = vec![("model.attention_levels", u.attention_levels.len())];
    if let crate::PerLevel::Each(v) = &u.num_res_blocks {
        lists.push(("model.num_res_blocks", v.len()));
    }
    if let crate::PerLevel::Each(v) = &u.num_head_channels {
        lists.push(("model.num_head_channels", v.len()));
    }
    for (field, got) in lists {
        if got != levels {
            out.push(Invalid::ListLength { field: field.into(), expected: levels, got });
        }
    }
    if u.norm_num_groups == 0 {
        out.push(Invalid::Zero { field: "model.norm_num_groups".into() });
    }
    let factor = 1u32 << (levels - 1).min(31);
    if !sp.divisible_by(factor) {
        out.push(Invalid::UnetDivisibility { levels, factor, d: sp.d, h: sp.h, w: sp.w });
    }
    let heads = u.head_channels();
    for (level, &width) in u.channels.iter().enumerate() {
        if width == 0 {
            out.push(Invalid::Zero { field: format!("model.channels[{level}]") });
            continue;
        }
        if u.norm_num_groups > 0 && width % u.norm_num_groups != 0 {
            out.push(Invalid::GroupNorm { groups: u.norm_num_groups, width, level });
        }
        // The middle block always has attention at the last width.
        let attends = u.attention_levels.get(level).copied().unwrap_or(false) || level + 1 == levels;
        let hc = heads[level];
        if attends && (hc == 0 || width % hc != 0) {
            out.push(Invalid::HeadChannels { head_channels: hc, width, level });
        }
    }
}

fn transformer(dims: Result<crate::TransformerDims, Invalid>, patch: u32, sp: Spatial, out: &mut Vec<Invalid>) {
    match dims {
        Err(e) => out.push(e),
        Ok(d) => {
            if d.hidden == 0 || d.heads == 0 {
                out.push(Invalid::Zero { field: "model.hidden / model.heads".into() });
            } else if d.hidden % d.heads != 0 {
                out.push(Invalid::HeadsNotDividing { heads: d.heads, hidden: d.hidden });
            }
        }
    }
    if patch == 0 {
        out.push(Invalid::Zero { field: "model.patch".into() });
    } else if !sp.divisible_by(patch) {
        out.push(Invalid::PatchNotDividing { patch, d: sp.d, h: sp.h, w: sp.w });
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;
    use crate::{Input, Precision, Spatial};

    fn cfg(model: serde_json::Value, spatial: [u32; 3]) -> RunConfig {
        RunConfig {
            experiment: "t".into(),
            name: "t".into(),
            model: serde_json::from_value(model).expect("model"),
            input: Input { channels: 1, spatial: Spatial::new(spatial[0], spatial[1], spatial[2]) },
            out_channels: 1,
            batch: 1,
            precision: Precision::Bf16Amp,
            grad_ckpt: false,
            mode: Default::default(),
            steps: 1,
            gpu: crate::Gpu::A100Sxm80,
            training: None,
        }
    }

    #[test]
    fn absurd_sizes_are_refused_with_the_limit_named() {
        let dit = serde_json::json!({"family": "dit", "hidden": 64, "heads": 4, "depth": 2, "patch": 2});
        assert!(validate(&cfg(dit.clone(), [160, 256, 256])).is_empty());
        // 1000x the brain MRI still plans; 4e9 per side would overflow u64.
        assert!(validate(&cfg(dit.clone(), [160, 256, 256_000])).is_empty());
        let huge = validate(&cfg(dit, [4_000_000_000, 4_000_000_000, 4_000_000_000]));
        assert_eq!(huge.len(), 1);
        assert_eq!(
            huge[0].to_string(),
            format!(
                "input voxels (D x H x W) is {}, above the limit of {} (a typo? nothing that large can be planned)",
                u64::MAX,
                limits::VOXELS
            )
        );
        let deep = cfg(
            serde_json::json!({"family": "hdit", "hidden": 64, "heads": 4, "patch": 2, "level_depths": [0, 0, 6, 4, 2_000_000_000u32, 3_000_000_000u32, 1]}),
            [16, 16, 16],
        );
        let e = validate(&deep);
        assert!(
            matches!(&e[..], [Invalid::TooLarge { field, limit: limits::BLOCKS, .. }] if field == "model.level_depths (blocks)"),
            "{e:?}"
        );
        let res = cfg(
            serde_json::json!({"family": "unet", "channels": [32, 64], "attention_levels": [false, false], "num_res_blocks": 100_000, "num_head_channels": 32}),
            [16, 16, 16],
        );
        assert!(matches!(&validate(&res)[..], [Invalid::TooLarge { limit: limits::BLOCKS, .. }]));
    }
}
