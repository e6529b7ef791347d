//! Levers: the predicted peak after each single change the family allows, so
//! the user sees which knob buys the most memory for the fewest parameters.
//! Changes that break a shape rule (`facts::validate`) are not offered.

use facts::{ModelSpec, PerLevel, Precision, RunConfig, UnetSpec};
use serde::Serialize;

use super::{mode_peak_gib, params_of, AdvisorError};
use crate::precheck::Predictor;
use crate::util::table::render_table;

/// One single change and what it does to the peak and the parameter count.
#[derive(Debug, Clone, Serialize)]
pub struct Lever {
    /// The change in words (`drop attention at level 2`).
    pub change: String,
    pub peak_gib: f64,
    /// New peak minus the current peak (negative: saves memory).
    pub delta_gib: f64,
    pub params: u64,
    /// New parameters minus current (negative: a smaller model).
    pub delta_params: i64,
    #[serde(skip)]
    pub config: RunConfig,
}

/// Every single change the family allows, as (description, changed config).
pub fn candidates(cfg: &RunConfig) -> Vec<(String, RunConfig)> {
    let mut out: Vec<(String, RunConfig)> = Vec::new();
    let mut with = |change: String, f: &dyn Fn(&mut RunConfig)| {
        let mut c = cfg.clone();
        f(&mut c);
        if c != *cfg {
            out.push((change, c));
        }
    };
    with(format!("gradient checkpointing {}", if cfg.grad_ckpt { "off" } else { "on" }), &|c| {
        c.grad_ckpt = !c.grad_ckpt
    });
    if cfg.batch >= 2 {
        with(format!("batch {} → {}", cfg.batch, cfg.batch / 2), &|c| c.batch /= 2);
    }
    match cfg.precision {
        Precision::Fp32 => with("bf16 autocast instead of fp32".into(), &|c| c.precision = Precision::Bf16Amp),
        p => {
            with(format!("fp32 instead of {p}"), &|c| c.precision = Precision::Fp32);
            if p != Precision::Bf16 {
                with(format!("pure bf16 (weights too) instead of {p}"), &|c| c.precision = Precision::Bf16);
            }
        }
    }
    match &cfg.model {
        ModelSpec::Unet(u) => unet_candidates(u, &mut with),
        ModelSpec::Dit(m) => {
            let p = m.patch;
            with(format!("patch {p} → {}", p * 2), &|c| set_patch(c, p * 2));
        }
        ModelSpec::Uvit(m) => {
            let p = m.patch;
            with(format!("patch {p} → {}", p * 2), &|c| set_patch(c, p * 2));
        }
        ModelSpec::Hdit(m) => {
            let p = m.patch;
            with(format!("patch {p} → {}", p * 2), &|c| set_patch(c, p * 2));
        }
        ModelSpec::Mamba(m) => {
            let p = m.patch_size;
            with(format!("patch {p} → {}", p * 2), &|c| set_patch(c, p * 2));
        }
    }
    out
}

fn set_patch(c: &mut RunConfig, p: u32) {
    match &mut c.model {
        ModelSpec::Dit(m) => m.patch = p,
        ModelSpec::Uvit(m) => m.patch = p,
        ModelSpec::Hdit(m) => m.patch = p,
        ModelSpec::Mamba(m) => m.patch_size = p,
        ModelSpec::Unet(_) => {}
    }
}

fn unet_mut(c: &mut RunConfig) -> Option<&mut UnetSpec> {
    match &mut c.model {
        ModelSpec::Unet(u) => Some(u),
        _ => None,
    }
}

/// A change to a config, applied to a copy of it.
type Edit<'a> = &'a dyn Fn(&mut RunConfig);

fn unet_candidates(u: &UnetSpec, with: &mut dyn FnMut(String, Edit)) {
    let levels = u.levels();
    for l in 0..levels {
        if u.attention_levels.get(l).copied().unwrap_or(false) {
            with(format!("drop attention at level {l}"), &|c| {
                if let Some(u) = unet_mut(c) {
                    u.attention_levels[l] = false;
                }
            });
        }
    }
    let doubled = match &u.num_head_channels {
        PerLevel::All(v) => PerLevel::All(v * 2),
        PerLevel::Each(v) => PerLevel::Each(v.iter().map(|x| x * 2).collect()),
    };
    with(format!("num_head_channels {} → {doubled}", u.num_head_channels), &|c| {
        if let Some(u) = unet_mut(c) {
            u.num_head_channels = doubled.clone();
        }
    });
    let res = u.res_blocks();
    for l in 0..levels {
        if res[l] > 1 {
            with(format!("one fewer res block at level {l} ({} → {})", res[l], res[l] - 1), &|c| {
                if let Some(u) = unet_mut(c) {
                    let mut r = u.res_blocks();
                    r[l] -= 1;
                    u.num_res_blocks = PerLevel::Each(r);
                }
            });
        }
    }
    if let Some(&widest) = u.channels.iter().max() {
        let at: Vec<usize> = (0..levels).filter(|&l| u.channels[l] == widest).collect();
        let names: Vec<String> = at.iter().map(|l| l.to_string()).collect();
        with(
            format!(
                "halve the widest level{} {} ({widest} → {})",
                if at.len() > 1 { "s" } else { "" },
                names.join(","),
                widest / 2
            ),
            &|c| {
                if let Some(u) = unet_mut(c) {
                    for &l in &at {
                        u.channels[l] = widest / 2;
                    }
                }
            },
        );
    }
    // One more level at the bottom: same width as the deepest, with attention
    // (the deepest levels carry it), per-level lists extended by their last value.
    if let Some(&last) = u.channels.last() {
        with(format!("one more level (width {last}, attention)"), &|c| {
            if let Some(u) = unet_mut(c) {
                u.channels.push(last);
                u.attention_levels.push(true);
                for p in [&mut u.num_res_blocks, &mut u.num_head_channels] {
                    if let PerLevel::Each(v) = p {
                        let x = v.last().copied().unwrap_or(1);
                        v.push(x);
                    }
                }
            }
        });
    }
}

/// The levers of `cfg`, biggest saving first; invalid changes left out.
pub fn levers(predictor: &Predictor, cfg: &RunConfig) -> Result<Vec<Lever>, AdvisorError> {
    let base = predictor.predict_peak(cfg)?;
    let base_gib = mode_peak_gib(&base, cfg.mode);
    let mut out = Vec::new();
    for (change, c) in candidates(cfg) {
        if !facts::validate::validate(&c).is_empty() {
            continue;
        }
        let (Ok(p), Some(params)) = (predictor.predict_peak(&c), params_of(&c)) else { continue };
        let peak_gib = mode_peak_gib(&p, c.mode);
        out.push(Lever {
            change,
            peak_gib,
            delta_gib: peak_gib - base_gib,
            params,
            delta_params: params as i64 - base.params as i64,
            config: c,
        });
    }
    out.sort_by(|a, b| a.delta_gib.total_cmp(&b.delta_gib));
    Ok(out)
}

/// The levers as a table.
pub fn render(levers: &[Lever]) -> String {
    let mut cells = vec![vec!["Change".to_string(), "Peak".into(), "Saves".into(), "Params".into(), "Δ params".into()]];
    for l in levers {
        cells.push(vec![
            l.change.clone(),
            crate::precheck::memory(l.peak_gib),
            format!("{:+.1}G", -l.delta_gib),
            crate::util::table::millions(l.params),
            format!("{:+.1}M", l.delta_params as f64 / 1e6),
        ]);
    }
    render_table(&cells)
}

#[cfg(test)]
mod tests {
    use super::*;
    use facts::{Gpu, Input, Spatial};

    fn exp9_3l(spatial: Spatial) -> RunConfig {
        RunConfig {
            experiment: "t".into(),
            name: "t".into(),
            model: ModelSpec::Unet(UnetSpec {
                channels: vec![128, 256, 512],
                attention_levels: vec![false, true, true],
                num_res_blocks: PerLevel::All(2),
                num_head_channels: PerLevel::All(64),
                norm_num_groups: 32,
            }),
            input: Input { channels: 8, spatial },
            out_channels: 4,
            batch: 1,
            precision: Precision::Bf16Amp,
            grad_ckpt: false,
            mode: facts::Mode::Profile,
            steps: 1,
            gpu: Gpu::A100Sxm80,
            training: None,
        }
    }

    #[test]
    fn invalid_changes_are_not_offered() {
        // D = 20 is divisible by 4 but not 8: a fourth level is a shape error.
        let ls = levers(&Predictor::pytorch(), &exp9_3l(Spatial::new(20, 32, 32))).unwrap();
        assert!(!ls.iter().any(|l| l.change.starts_with("one more level")));
        assert!(ls.iter().all(|l| facts::validate::validate(&l.config).is_empty()));
        // On D = 40 it is allowed.
        let ls = levers(&Predictor::pytorch(), &exp9_3l(Spatial::new(40, 64, 64))).unwrap();
        assert!(ls.iter().any(|l| l.change.starts_with("one more level")));
    }

    #[test]
    fn sorted_by_saving_and_attention_at_level_1_saves_most() {
        let ls = levers(&Predictor::pytorch(), &exp9_3l(Spatial::new(40, 64, 64))).unwrap();
        assert!(ls.windows(2).all(|w| w[0].delta_gib <= w[1].delta_gib));
        assert_eq!(ls[0].change, "drop attention at level 1", "{:?}", ls.iter().map(|l| &l.change).collect::<Vec<_>>());
        assert!(ls[0].delta_gib < 0.0 && ls[0].delta_params < 0);
        // Attention-bound at level 1: fp32 keeps 4 B a score (the f32 softmax)
        // where bf16 autocast keeps 6 (and its half copy), so fp32 saves here.
        let fp32 = ls.iter().find(|l| l.change.starts_with("fp32")).unwrap();
        assert!(fp32.delta_gib < 0.0, "fp32 keeps fewer score bytes: {}", fp32.delta_gib);
    }
}
