//! One notation per model: what a config's content hash is computed over
//! ([`crate::RunConfig::hash`]), so that one model written two ways
//! (`num_res_blocks: 2` or `[2, 2, 2, 2]`; `variant: S` or `hidden: 384,
//! heads: 6, depth: 12`) is one config: one run directory, one replay answer,
//! one row of a sweep.
//!
//! The canonical form is the notation the experiment files use, so a config
//! already written that way keeps the hash it had before this form existed:
//!
//! - a per-level list (`num_res_blocks`, `num_head_channels`) of one value per
//!   level, all equal, is that value (`[2, 2, 2, 2]` → `2`);
//! - head channels at a level where no attention runs (neither the level's
//!   own nor the middle block's, which attends at the last level) are never
//!   read: they take the value of the next level down that attends, so
//!   `[0, 0, 32, 32]` with attention at levels 2 and 3 is `32`;
//! - a transformer is its resolved width, heads and depth: written as the
//!   family's variant when one has exactly those (`variant: S` alone), else as
//!   the three numbers without a variant;
//! - a MambaDiff is its resolved stage widths and heads, written as its
//!   variant when one gives exactly those, else `num_heads` with `embed_dim`
//!   (widths on the schedule) or `stage_dims`; its ratios are thousandths
//!   (`4` and `4.0` are one value);
//! - a profile run's `steps` is 1 (it runs one step whatever it says).
//!
//! A model that does not resolve (a list of the wrong length, an unknown
//! variant) keeps its notation: it is invalid and never runs, and its hash
//! only has to be stable. Defaults are filled by deserialisation already
//! (`num_res_blocks` 2, `norm_num_groups` 32): a written default and an
//! omitted one hash alike.

use crate::family::{resolve_variant, Family};
use crate::model::{PerLevel, UnetSpec};
use crate::{MambaSpec, ModelSpec, TransformerDims, Variant};

impl ModelSpec {
    /// This model in its one notation (see the module docs).
    pub fn canonical(&self) -> ModelSpec {
        match self {
            ModelSpec::Unet(u) => ModelSpec::Unet(canonical_unet(u)),
            ModelSpec::Dit(m) => {
                let mut c = m.clone();
                if let Ok(d) = m.dims() {
                    (c.variant, c.hidden, c.heads, c.depth) = written(Family::Dit, d, true);
                }
                ModelSpec::Dit(c)
            }
            ModelSpec::Uvit(m) => {
                let mut c = m.clone();
                if let Ok(d) = m.dims() {
                    (c.variant, c.hidden, c.heads, c.depth) = written(Family::Uvit, d, true);
                }
                ModelSpec::Uvit(c)
            }
            ModelSpec::Hdit(m) => {
                let mut c = m.clone();
                // Depth comes from `level_depths`, never from the variant.
                if let Ok(d) = m.dims() {
                    (c.variant, c.hidden, c.heads, _) = written(Family::Hdit, d, false);
                }
                ModelSpec::Hdit(c)
            }
            ModelSpec::Mamba(m) => ModelSpec::Mamba(canonical_mamba(m)),
        }
    }
}

/// A MambaDiff is its resolved stage widths and heads: the variant whose
/// sizes give exactly those, else `num_heads` and `embed_dim` (when the
/// widths follow the schedule from it) or `stage_dims`.
fn canonical_mamba(m: &MambaSpec) -> MambaSpec {
    let mut c = m.clone();
    let Ok(d) = m.dims() else { return c };
    let (n, skip) = (m.stages(), m.skip);
    let scheduled = |embed: u32| MambaSpec::schedule(embed, n, skip).as_ref() == Some(&d.stage_dims);
    let variant = [Variant::S, Variant::B, Variant::L, Variant::XL]
        .into_iter()
        .find(|v| v.mamba_sizes().is_some_and(|(embed, heads)| heads == d.heads && scheduled(embed)));
    (c.variant, c.embed_dim, c.stage_dims, c.num_heads) = match variant {
        Some(v) => (Some(v), None, None, None),
        None if scheduled(d.stage_dims[0]) => (None, Some(d.stage_dims[0]), None, Some(d.heads)),
        None => (None, None, Some(d.stage_dims), Some(d.heads)),
    };
    c
}

/// (variant, hidden, heads, depth) as the canonical form writes `d`: the
/// family's variant with exactly these sizes (depth compared only when
/// `with_depth`), else the numbers.
fn written(
    family: Family,
    d: TransformerDims,
    with_depth: bool,
) -> (Option<Variant>, Option<u32>, Option<u32>, Option<u32>) {
    match resolve_variant(family, d, with_depth) {
        Some(v) => (Some(v), None, None, None),
        None => (None, Some(d.hidden), Some(d.heads), with_depth.then_some(d.depth)),
    }
}

fn canonical_unet(u: &UnetSpec) -> UnetSpec {
    let levels = u.levels();
    let mut c = u.clone();
    c.num_res_blocks = collapse(&u.num_res_blocks, levels, |_| true);
    let attends = |l: usize| u.attention_levels.get(l).copied().unwrap_or(false) || l + 1 == levels;
    // Only a head-channel list of the right length is read per level; another
    // length is invalid and keeps its notation.
    if u.attention_levels.len() == levels {
        c.num_head_channels = collapse(&u.num_head_channels, levels, attends);
    }
    c
}

/// `values` per level, each level that is not `read` taking the value of the
/// next level down that is (the last level is always read), then one value
/// when all are equal. A list of the wrong length is returned as written.
fn collapse(values: &PerLevel, levels: usize, read: impl Fn(usize) -> bool) -> PerLevel {
    let list = match values {
        PerLevel::All(v) => return PerLevel::All(*v),
        PerLevel::Each(list) if list.len() != levels || levels == 0 => return values.clone(),
        PerLevel::Each(list) => list,
    };
    let mut out = list.clone();
    for l in (0..levels.saturating_sub(1)).rev() {
        if !read(l) {
            out[l] = out[l + 1];
        }
    }
    match out.split_first() {
        Some((first, rest)) if rest.iter().all(|v| v == first) => PerLevel::All(*first),
        _ => PerLevel::Each(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(v: serde_json::Value) -> ModelSpec {
        serde_json::from_value(v).expect("a model")
    }

    fn unet(res: serde_json::Value, heads: serde_json::Value, attn: [bool; 4]) -> ModelSpec {
        model(serde_json::json!({
            "family": "unet", "channels": [64, 128, 256, 512], "attention_levels": attn,
            "num_res_blocks": res, "num_head_channels": heads
        }))
    }

    #[test]
    fn equal_per_level_lists_are_one_value() {
        let scalar = unet(2.into(), 64.into(), [false, false, true, true]);
        assert_eq!(scalar.canonical(), scalar, "the scalar notation is the canonical one");
        let lists =
            unet(serde_json::json!([2, 2, 2, 2]), serde_json::json!([64, 64, 64, 64]), [false, false, true, true]);
        assert_eq!(lists.canonical(), scalar);
        let deeper = unet(serde_json::json!([2, 2, 3, 3]), 64.into(), [false, false, true, true]);
        assert_eq!(deeper.canonical(), deeper, "a list of different values stays a list");
    }

    #[test]
    fn head_channels_where_no_attention_runs_are_not_read() {
        let maisi = unet(2.into(), serde_json::json!([0, 0, 32, 32]), [false, false, true, true]);
        assert_eq!(maisi.canonical(), unet(2.into(), 32.into(), [false, false, true, true]));
        // Attention at level 0 reads its head channels: they stay.
        let all = unet(2.into(), serde_json::json!([16, 32, 32, 32]), [true, true, true, true]);
        assert_eq!(all.canonical(), all);
        // The last level is read by the middle block, with or without its own attention.
        let mid = unet(2.into(), serde_json::json!([32, 32, 32, 64]), [false, false, false, false]);
        assert_eq!(mid.canonical(), unet(2.into(), 64.into(), [false, false, false, false]));
        // A list of the wrong length is invalid and keeps its notation.
        let short = unet(2.into(), serde_json::json!([32, 32]), [false, false, true, true]);
        assert_eq!(short.canonical(), short);
    }

    #[test]
    fn a_transformer_is_its_sizes_named_by_its_variant() {
        let named = model(serde_json::json!({"family": "dit", "variant": "S", "patch": 2}));
        assert_eq!(named.canonical(), named);
        for same in [
            serde_json::json!({"family": "dit", "variant": "S", "hidden": 384, "heads": 6, "depth": 12, "patch": 2}),
            serde_json::json!({"family": "dit", "hidden": 384, "heads": 6, "depth": 12, "patch": 2}),
            serde_json::json!({"family": "dit", "variant": "B", "hidden": 384, "heads": 6, "patch": 2}),
        ] {
            assert_eq!(model(same).canonical(), named);
        }
        let custom = model(serde_json::json!({"family": "dit", "variant": "S", "hidden": 512, "patch": 2}));
        let numbers = model(serde_json::json!({"family": "dit", "hidden": 512, "heads": 6, "depth": 12, "patch": 2}));
        assert_eq!(custom.canonical(), numbers);
        let uvit = model(serde_json::json!({"family": "uvit", "hidden": 512, "heads": 8, "depth": 17, "patch": 4}));
        let deep = model(serde_json::json!({"family": "uvit", "variant": "S-Deep", "patch": 4}));
        assert_eq!(uvit.canonical(), deep);
        let hdit = model(
            serde_json::json!({"family": "hdit", "variant": "S", "hidden": 384, "heads": 6, "patch": 4, "level_depths": [2, 4, 6, 4, 2]}),
        );
        let hdit_s =
            model(serde_json::json!({"family": "hdit", "variant": "S", "patch": 4, "level_depths": [2, 4, 6, 4, 2]}));
        assert_eq!(hdit.canonical(), hdit_s);
        let unknown = model(serde_json::json!({"family": "dit", "variant": "M", "patch": 2}));
        assert_eq!(unknown.canonical(), unknown, "an unknown variant keeps its notation");
    }

    #[test]
    fn a_mamba_is_its_widths_and_heads_named_by_its_variant() {
        let records = model(serde_json::json!({
            "family": "mamba", "variant": "L", "embed_dim": 256, "stage_dims": [256, 512, 1024, 1024],
            "num_heads": 16, "patch_size": 4, "mlp_ratio": 4.0, "ssm_ratio": 2, "conditioning": "concat"
        }));
        let named = model(serde_json::json!({"family": "mamba", "variant": "L", "patch_size": 4}));
        assert_eq!(records.canonical(), named);
        assert_eq!(named.canonical(), named);
        // L's heads at XL's width is XL; at a width no variant has, the numbers.
        let xl = model(serde_json::json!({"family": "mamba", "variant": "L", "embed_dim": 320, "patch_size": 4}));
        assert_eq!(xl.canonical(), model(serde_json::json!({"family": "mamba", "variant": "XL", "patch_size": 4})));
        let wider = model(serde_json::json!({"family": "mamba", "variant": "L", "embed_dim": 384, "patch_size": 4}));
        let numbers = model(serde_json::json!({"family": "mamba", "embed_dim": 384, "num_heads": 16, "patch_size": 4}));
        assert_eq!(wider.canonical(), numbers);
        let custom = model(
            serde_json::json!({"family": "mamba", "stage_dims": [64, 64, 128, 128], "num_heads": 4, "patch_size": 2}),
        );
        assert_eq!(custom.canonical(), custom, "widths off the schedule stay a list");
    }
}
