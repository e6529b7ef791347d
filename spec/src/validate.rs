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
}

/// Every rule the config breaks (empty when it can run).
pub fn validate(cfg: &RunConfig) -> Vec<Invalid> {
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

fn transformer(
    dims: Result<crate::TransformerDims, Invalid>,
    patch: u32,
    sp: Spatial,
    out: &mut Vec<Invalid>,
) {
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
