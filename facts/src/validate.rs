//! Shape rules: configs that cannot run at all (a dimension error at build or
//! first forward), reported before anything is submitted. Never an OOM.

use crate::family::join;
pub use crate::invalid::{limits, Invalid};
use crate::model::ModelSpec;
use crate::{RunConfig, Spatial};

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
        ModelSpec::Mamba(m) => mamba_limits(m, &mut checks),
    }
    checks.into_iter().flatten().next()
}

fn mamba_limits(m: &crate::MambaSpec, checks: &mut Vec<Option<Invalid>>) {
    let over = |field: &str, value: u64, limit: u64| {
        (value > limit).then(|| Invalid::TooLarge { field: field.into(), value, limit })
    };
    let widest = |v: &Option<Vec<u32>>| v.iter().flatten().copied().max().unwrap_or(0) as u64;
    // Encoder d, decoder d + 1 a stage, and the bottleneck.
    let blocks = m.depths.iter().map(|&d| 2 * d as u64 + 1).sum::<u64>() + m.bottleneck_depth as u64;
    checks.extend([
        over("model.depths (stages)", m.depths.len() as u64, limits::LEVELS),
        over("model.depths (blocks)", blocks, limits::BLOCKS),
        over("model.patch_size", m.patch_size as u64, limits::WIDTH),
        over("model.embed_dim", m.embed_dim.unwrap_or(0) as u64, limits::WIDTH),
        over("model.stage_dims", widest(&m.stage_dims), limits::WIDTH),
        over("model.num_heads", m.num_heads.unwrap_or(0) as u64, limits::WIDTH),
        over("model.window_size", m.window_size as u64, limits::WIDTH),
        over("model.ssm_d_state", m.ssm_d_state as u64, limits::WIDTH),
        // Ratios of more than 1000x the width are typos (the group's are 2 and 4).
        over("model.ssm_ratio (thousandths)", m.ssm_ratio.thousandths() as u64, 1_000_000),
        over("model.mlp_ratio (thousandths)", m.mlp_ratio.thousandths() as u64, 1_000_000),
    ]);
    // The schedule doubles the width a stage: its widest is embed_dim x 2^(stages - skip).
    if let (Ok(d), true) = (m.dims(), m.depths.len() as u64 <= limits::LEVELS) {
        checks.push(over("model.stage_dims", d.stage_dims.iter().copied().max().unwrap_or(0) as u64, limits::WIDTH));
    }
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
        ModelSpec::Mamba(m) => mamba(m, sp, &mut out),
    }
    out
}

/// MambaDiff's rules: resolvable widths and heads, heads dividing every
/// stage's width, the patch dividing the input, a square in-plane grid (the
/// position table is `(D/p, H/p, H/p)`: `mamba_diff.py@0d7f625:346-351`), an
/// even grid wherever a stage downsamples (the decoder's 2x upsample must meet
/// the skip it is added to), positive window, state and inner widths.
fn mamba(m: &crate::MambaSpec, sp: Spatial, out: &mut Vec<Invalid>) {
    let dims = match m.dims() {
        Ok(d) => d,
        Err(e) => return out.push(e),
    };
    for (field, v) in [
        ("model.patch_size", m.patch_size),
        ("model.num_heads", dims.heads),
        ("model.window_size", m.window_size),
        ("model.ssm_d_state", m.ssm_d_state),
    ] {
        if v == 0 {
            out.push(Invalid::Zero { field: field.into() });
        }
    }
    for (stage, &width) in dims.stage_dims.iter().enumerate() {
        let inner = m.inner(width);
        if width == 0 || inner.ssm == 0 || inner.mlp == 0 {
            out.push(Invalid::Zero { field: format!("model.stage_dims[{stage}] (or its SSM/MLP inner width)") });
        } else if dims.heads > 0 && width % dims.heads != 0 {
            out.push(Invalid::HeadsNotDividing { heads: dims.heads, hidden: width });
        }
    }
    if sp.h != sp.w {
        out.push(Invalid::MambaSquare { d: sp.d, h: sp.h, w: sp.w });
    }
    if m.patch_size == 0 {
        return;
    }
    if !sp.divisible_by(m.patch_size) {
        return out.push(Invalid::PatchNotDividing { patch: m.patch_size, d: sp.d, h: sp.h, w: sp.w });
    }
    let mut grid = sp.div(m.patch_size);
    for stage in 0..dims.stage_dims.len() - m.skip as usize {
        if !grid.divisible_by(2) {
            let [d, h, w] = grid.dims();
            return out.push(Invalid::MambaDownsample { stage, d, h, w });
        }
        grid = grid.div(2);
    }
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
    use crate::family::{Family, Variant};
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

    #[test]
    fn mamba_rules_name_the_stage_and_the_grid() {
        let m = |extra: serde_json::Value| {
            let mut v = serde_json::json!({"family": "mamba", "variant": "L", "patch_size": 4});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            v
        };
        assert!(validate(&cfg(m(serde_json::json!({})), [160, 256, 256])).is_empty());
        // 40x64x64 tokens halve to 20x32x32, then 10x16x16: 152 deep gives 38, then 19, odd.
        assert_eq!(
            validate(&cfg(m(serde_json::json!({})), [152, 256, 256])),
            vec![Invalid::MambaDownsample { stage: 1, d: 19, h: 32, w: 32 }]
        );
        assert_eq!(
            validate(&cfg(m(serde_json::json!({})), [160, 256, 128])),
            vec![Invalid::MambaSquare { d: 160, h: 256, w: 128 }]
        );
        assert_eq!(
            validate(&cfg(m(serde_json::json!({"skip": 5})), [160, 256, 256])),
            vec![Invalid::MambaSkip { skip: 5, stages: 4 }]
        );
        assert_eq!(
            validate(&cfg(m(serde_json::json!({"num_heads": 24})), [160, 256, 256])),
            vec![
                Invalid::HeadsNotDividing { heads: 24, hidden: 256 },
                Invalid::HeadsNotDividing { heads: 24, hidden: 512 },
                Invalid::HeadsNotDividing { heads: 24, hidden: 1024 },
                Invalid::HeadsNotDividing { heads: 24, hidden: 1024 },
            ]
        );
        let m_variant = serde_json::json!({"family": "mamba", "variant": "M", "patch_size": 4});
        assert_eq!(
            validate(&cfg(m_variant, [160, 256, 256])),
            vec![Invalid::UnknownVariant { family: Family::Mamba, variant: Variant::M }]
        );
    }
}
