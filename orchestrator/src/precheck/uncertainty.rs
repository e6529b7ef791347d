//! How far a prediction can be trusted.
//!
//! A verdict decides whether a job is submitted, so its band must be as honest
//! as the mean. Two things set it:
//!
//! * the calibration's **cross-validated** error of the config's family in the
//!   regime that sets its peak (activations of forward/backward, or the
//!   optimizer step, which is ~20 B/param and nearly exact): each source table
//!   is held out in turn, the runtime refitted on the rest and the held-out
//!   table predicted, so the error is what a config from a new table sees;
//! * the config's **distance** from what was measured: an input volume or a
//!   token count beyond the largest measured at a level, widths outside the
//!   measured range, a variant or a batch never measured. Each doubling beyond
//!   the data adds half the base band.
//!
//! Both are computed by `calibrate` and shipped in the calibration file next to
//! the coefficients; [`Uncertainty::assess`] applies them to one config.

use std::fmt;

use facts::model::{Family, Variant};
use facts::{ModelSpec, RunConfig};
use serde::{Deserialize, Serialize};

use super::PeakPhase;

/// Which part of the run sets the peak; the two are predicted with very
/// different accuracy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Regime {
    /// Forward/backward: activations held for backward.
    Activation,
    /// The optimizer step: weights, gradients, moments.
    Optimizer,
}

impl Regime {
    pub fn of(phase: PeakPhase) -> Self {
        match phase {
            PeakPhase::FwdBwd => Regime::Activation,
            PeakPhase::Step => Regime::Optimizer,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Regime::Activation => "activation",
            Regime::Optimizer => "optimizer",
        }
    }
}

/// The band of one family in one regime: p90 of the absolute relative error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Band {
    pub family: Family,
    pub regime: Regime,
    pub p90: f64,
    /// Held-out records behind it.
    pub n: usize,
}

/// A family's held-out error over every regime: p90 of the absolute relative
/// error of all its held-out records. A config whose own band (its family's in
/// its regime) is narrower is held to this too ([`super::judge_held_out`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FamilyError {
    pub family: Family,
    pub p90: f64,
    /// Held-out records behind it.
    pub n: usize,
}

/// What the calibration records of one family covered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Coverage {
    pub family: Family,
    /// Largest voxels (UNet) or tokens (transformers) measured at each level.
    pub max_per_level: Vec<u64>,
    /// Range of widths measured (UNet channels, transformer hidden size).
    pub width: (u32, u32),
    /// Named transformer variants measured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<Variant>,
    pub max_batch: u32,
}

/// Bands and coverage of one runtime, as `calibrate` computed them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Uncertainty {
    /// How the bands were obtained, for people reading the file.
    pub method: String,
    /// Records the runtime was calibrated on.
    #[serde(default)]
    pub records: usize,
    pub bands: Vec<Band>,
    /// Per family, its held-out error over every regime (files from before it: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub family_errors: Vec<FamilyError>,
    pub coverage: Vec<Coverage>,
}

/// Fewer held-out records than this in a family/regime: use the family's pooled band.
const MIN_BAND_RECORDS: usize = 5;
/// No band is narrower than this (the measurement's own resolution).
const FLOOR: f64 = 0.01;
/// Nor wider: beyond it the prediction says little, and the verdict says why.
const CEILING: f64 = 1.0;

/// Why a config's band is wider than its family's.
#[derive(Debug, Clone, PartialEq)]
pub enum Distance {
    /// Voxels or tokens at a level beyond the largest measured there.
    Size {
        level: usize,
        tokens: bool,
        ratio: f64,
    },
    /// A width outside the measured range.
    Width {
        width: u32,
        measured: (u32, u32),
    },
    Variant(Variant),
    Batch {
        batch: u32,
        measured: u32,
    },
    /// No record of the family at all for this runtime.
    Family(Family),
    /// The sweep's own runs of the family and regime, as the calibration
    /// predicted them: `error` is the largest `|measured / predicted - 1|`
    /// (`active::Refit` sets the band from them, where a sweep measures as it goes).
    Observed {
        runs: usize,
        error: f64,
    },
}

impl Distance {
    /// How many times the base band this distance stands for.
    fn factor(&self) -> f64 {
        let doublings = |r: f64| 1.0 + 0.5 * r.max(1.0).log2();
        match self {
            Distance::Size { ratio, .. } => doublings(*ratio),
            Distance::Width { width, measured: (lo, hi) } => {
                let w = (*width).max(1) as f64;
                doublings((w / *hi as f64).max(*lo as f64 / w))
            }
            // Twice the band: the walk is physics, not a lookup, and a fit
            // without a whole family predicts it within its own band (HDiT
            // 0.8 %, U-ViT 2.2 % p90 with its one table held out since the
            // walks follow the group's code, issue 52; 10.6 % and 18.8 % before:
            // tests/precheck_accuracy.rs, `evidence --held-out`).
            Distance::Variant(_) | Distance::Family(_) => 2.0,
            Distance::Batch { batch, measured } => doublings(*batch as f64 / (*measured).max(1) as f64),
            // Never assessed from the data's extent: active::Refit sets the band itself.
            Distance::Observed { .. } => 1.0,
        }
    }
}

/// Serialised as the sentence a verdict gives (`explain --json`).
impl Serialize for Distance {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl fmt::Display for Distance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Distance::Size { level, tokens: false, ratio } => {
                write!(f, "level-{level} volume {ratio:.1}x the largest measured")
            }
            Distance::Size { level, tokens: true, ratio } => {
                write!(f, "level-{level} tokens {ratio:.1}x the largest measured")
            }
            Distance::Width { width, measured: (lo, hi) } => {
                write!(f, "width {width} outside the measured {lo}..{hi}")
            }
            Distance::Variant(v) => write!(f, "variant {v} never measured"),
            Distance::Batch { batch, measured } => write!(f, "batch {batch}, largest measured {measured}"),
            Distance::Family(fam) => write!(f, "no {fam} config measured for this runtime"),
            Distance::Observed { runs: 1, error } => {
                write!(f, "this sweep's run measured {:.1}% off this calibration", 100.0 * error)
            }
            Distance::Observed { runs, error } => {
                write!(f, "this sweep's {runs} runs measured up to {:.1}% off this calibration", 100.0 * error)
            }
        }
    }
}

/// The band of one config and the distance that widened it.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    /// Relative band of the peak: the measured peak lies within
    /// `[p/(1+rel), p/(1-rel)]` nine times in ten.
    pub rel: f64,
    /// The family's cross-validated band before widening.
    pub base: f64,
    pub distance: Option<Distance>,
    /// The family's held-out error where it is wider than `rel`.
    pub family_error: Option<f64>,
}

/// What a config looks like to the coverage check (borrowed: this runs with
/// every prediction, inside the advisor's searches too).
struct Shape<'a> {
    family: Family,
    /// The grid at each level (voxels: UNet; tokens: transformers).
    per_level: Vec<facts::Spatial>,
    /// UNet channels; transformers have the one hidden size.
    channels: &'a [u32],
    hidden: Option<u32>,
    variant: Option<Variant>,
    batch: u32,
}

impl<'a> Shape<'a> {
    fn of(cfg: &'a RunConfig) -> Self {
        let per_level = facts::params::level_grids(&cfg.model, &cfg.input);
        let hidden = || cfg.model.transformer_dims().and_then(|d| d.ok()).map(|d| d.hidden);
        let (channels, hidden, variant) = match &cfg.model {
            ModelSpec::Unet(u) => (u.channels.as_slice(), None, None),
            ModelSpec::Dit(m) => (&[][..], hidden(), m.variant),
            ModelSpec::Uvit(m) => (&[][..], hidden(), m.variant),
            ModelSpec::Hdit(m) => (&[][..], hidden(), m.variant),
            // Its widest stage stands for its width (stage widths are not borrowable when resolved from a variant).
            ModelSpec::Mamba(m) => (
                m.stage_dims.as_deref().unwrap_or(&[]),
                m.dims().ok().and_then(|d| d.stage_dims.last().copied()),
                m.variant,
            ),
        };
        Shape { family: cfg.model.family(), per_level, channels, hidden, variant, batch: cfg.batch.max(1) }
    }
    fn widths(&self) -> impl Iterator<Item = u32> + '_ {
        self.channels.iter().copied().chain(self.hidden)
    }
    fn tokens(&self) -> bool {
        self.family != Family::Unet
    }
}

impl Uncertainty {
    /// Bands from held-out residuals (`(config, regime, |relative error|)`) and
    /// coverage from every config the runtime was calibrated on.
    pub fn estimate<'a>(
        method: String,
        residuals: &[(Family, Regime, f64)],
        calibrated: impl IntoIterator<Item = &'a RunConfig>,
    ) -> Self {
        let mut bands = Vec::new();
        let mut family_errors = Vec::new();
        for family in Family::ALL {
            for regime in [Regime::Activation, Regime::Optimizer] {
                let errs: Vec<f64> = residuals.iter().filter(|r| r.0 == family && r.1 == regime).map(|r| r.2).collect();
                if !errs.is_empty() {
                    bands.push(Band { family, regime, p90: p90(errs.clone()), n: errs.len() });
                }
            }
            let errs: Vec<f64> = residuals.iter().filter(|r| r.0 == family).map(|r| r.2).collect();
            if !errs.is_empty() {
                family_errors.push(FamilyError { family, n: errs.len(), p90: p90(errs) });
            }
        }
        let mut coverage: Vec<Coverage> = Vec::new();
        let mut records = 0;
        for cfg in calibrated {
            records += 1;
            include(&mut coverage, &Coverage::of(&Shape::of(cfg)));
        }
        Uncertainty { method, records, bands, family_errors, coverage }
    }

    /// These bands where enough records stand behind them, `shipped`'s
    /// elsewhere; coverage is what either covered (a local overlay is pulled
    /// towards the shipped fit, so the shipped data still stands behind it).
    pub fn with_fallback(mut self, shipped: Option<&Uncertainty>) -> Self {
        let Some(shipped) = shipped else { return self };
        self.records += shipped.records;
        self.bands.retain(|b| b.n >= MIN_BAND_RECORDS);
        for b in &shipped.bands {
            if !self.bands.iter().any(|o| o.family == b.family && o.regime == b.regime) {
                self.bands.push(b.clone());
            }
        }
        self.family_errors.retain(|e| e.n >= MIN_BAND_RECORDS);
        for e in &shipped.family_errors {
            if !self.family_errors.iter().any(|o| o.family == e.family) {
                self.family_errors.push(e.clone());
            }
        }
        for sc in &shipped.coverage {
            include(&mut self.coverage, sc);
        }
        self
    }

    /// The band of the family in a regime: its own where enough records stand
    /// behind it, else the family's records pooled, else the widest band known.
    fn base(&self, family: Family, regime: Regime) -> f64 {
        let own = self.bands.iter().find(|b| b.family == family && b.regime == regime);
        let family_bands = || self.bands.iter().filter(|b| b.family == family);
        let band = match own {
            Some(b) if b.n >= MIN_BAND_RECORDS => b.p90,
            _ if family_bands().map(|b| b.n).sum::<usize>() >= MIN_BAND_RECORDS || own.is_some() => {
                family_bands().map(|b| b.p90).fold(FLOOR, f64::max)
            }
            _ => self.bands.iter().map(|b| b.p90).fold(FLOOR, f64::max),
        };
        band.clamp(FLOOR, CEILING)
    }

    /// The band of `cfg` predicted with its peak set in `phase`.
    pub fn assess(&self, cfg: &RunConfig, phase: PeakPhase) -> Assessment {
        let s = Shape::of(cfg);
        let base = self.base(s.family, Regime::of(phase));
        let distance = self.distance(&s);
        let factor = distance.as_ref().map(Distance::factor).unwrap_or(1.0);
        let rel = (base * factor).clamp(FLOOR, CEILING);
        let family_error =
            self.family_errors.iter().find(|e| e.family == s.family).map(|e| e.p90.min(CEILING)).filter(|&e| e > rel);
        Assessment { rel, base, distance, family_error }
    }

    /// The farthest the config lies from the measured data, if outside it.
    fn distance(&self, s: &Shape) -> Option<Distance> {
        let Some(c) = self.coverage.iter().find(|c| c.family == s.family) else {
            return Some(Distance::Family(s.family));
        };
        // The farthest wins; the first of equals (level 0 before the levels below it).
        let mut best: Option<(f64, Distance)> = None;
        let mut consider = |d: Distance| {
            let f = d.factor();
            if best.as_ref().is_none_or(|(bf, _)| f > *bf) {
                best = Some((f, d));
            }
        };
        for (level, g) in s.per_level.iter().enumerate() {
            // A level deeper than any measured is compared with the deepest measured.
            let Some(m) = c.max_per_level.get(level).or(c.max_per_level.last()).filter(|m| **m > 0) else { continue };
            let v = &g.voxels();
            if v > m {
                consider(Distance::Size { level, tokens: s.tokens(), ratio: *v as f64 / *m as f64 });
            }
        }
        for w in s.widths() {
            if w < c.width.0 || w > c.width.1 {
                consider(Distance::Width { width: w, measured: c.width });
            }
        }
        if let Some(v) = s.variant.filter(|v| !c.variants.is_empty() && !c.variants.contains(v)) {
            consider(Distance::Variant(v));
        }
        if s.batch > c.max_batch {
            consider(Distance::Batch { batch: s.batch, measured: c.max_batch });
        }
        best.map(|(_, d)| d)
    }
}

impl Coverage {
    /// What one config covers.
    fn of(s: &Shape) -> Self {
        Coverage {
            family: s.family,
            max_per_level: s.per_level.iter().map(|g| g.voxels()).collect(),
            width: s.widths().fold((u32::MAX, 0), |(lo, hi), w| (lo.min(w), hi.max(w))),
            variants: s.variant.into_iter().collect(),
            max_batch: s.batch,
        }
    }

    /// Widens this coverage to include `other`'s (same family).
    fn merge(&mut self, other: &Coverage) {
        if self.max_per_level.len() < other.max_per_level.len() {
            self.max_per_level.resize(other.max_per_level.len(), 0);
        }
        for (m, v) in self.max_per_level.iter_mut().zip(&other.max_per_level) {
            *m = (*m).max(*v);
        }
        self.width = (self.width.0.min(other.width.0), self.width.1.max(other.width.1));
        for v in &other.variants {
            if !self.variants.contains(v) {
                self.variants.push(*v);
            }
        }
        self.max_batch = self.max_batch.max(other.max_batch);
    }
}

/// Adds `c` to the coverage of its family in `list`.
fn include(list: &mut Vec<Coverage>, c: &Coverage) {
    match list.iter_mut().find(|o| o.family == c.family) {
        Some(o) => o.merge(c),
        None => list.push(c.clone()),
    }
}

/// Nearest-rank 90th percentile.
fn p90(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((0.9 * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use facts::{Input, Spatial, UnetSpec};

    fn unet(channels: Vec<u32>, spatial: Spatial, batch: u32) -> RunConfig {
        let n = channels.len();
        RunConfig {
            experiment: "t".into(),
            name: "t".into(),
            model: ModelSpec::Unet(UnetSpec {
                channels,
                attention_levels: vec![false; n],
                num_res_blocks: facts::PerLevel::All(2),
                num_head_channels: facts::PerLevel::All(32),
                norm_num_groups: 16,
            }),
            input: Input { channels: 16, spatial },
            out_channels: 8,
            batch,
            precision: facts::Precision::Bf16Amp,
            grad_ckpt: true,
            mode: facts::Mode::Profile,
            steps: 1,
            gpu: facts::Gpu::H100_80,
            training: None,
        }
    }

    fn measured() -> Uncertainty {
        let cfgs = [
            unet(vec![32, 64, 256], Spatial::new(80, 64, 64), 1),
            unet(vec![64, 128, 512], Spatial::new(80, 64, 64), 1),
        ];
        let residuals: Vec<(Family, Regime, f64)> =
            (1..=10).map(|i| (Family::Unet, Regime::Activation, i as f64 / 100.0)).collect();
        Uncertainty::estimate("test".into(), &residuals, cfgs.iter())
    }

    #[test]
    fn a_config_beside_the_data_gets_the_family_band() {
        let u = measured();
        let a = u.assess(&unet(vec![64, 128, 256], Spatial::new(80, 64, 64), 1), PeakPhase::FwdBwd);
        assert_eq!((a.rel, a.distance, a.family_error), (0.09, None, None));
    }

    /// The optimizer step predicted to 1 % and the forward/backward to 30 %:
    /// a step-bound config's band is its regime's, and the family's held-out
    /// error over both regimes rides with it for the verdict.
    #[test]
    fn a_regime_band_narrower_than_its_familys_held_out_error_carries_that_error() {
        let cfgs = [unet(vec![32, 64, 256], Spatial::new(80, 64, 64), 1)];
        let mut residuals: Vec<(Family, Regime, f64)> =
            (1..=10).map(|i| (Family::Unet, Regime::Optimizer, i as f64 / 1000.0)).collect();
        residuals.extend((1..=10).map(|i| (Family::Unet, Regime::Activation, 0.03 * i as f64)));
        let u = Uncertainty::estimate("test".into(), &residuals, cfgs.iter());
        let step = u.assess(&cfgs[0], PeakPhase::Step);
        assert_eq!(step.rel, 0.01);
        let e = step.family_error.expect("wider than the step's band");
        assert!((e - 0.24).abs() < 1e-12, "p90 of all twenty: the 18th, 0.24: {e}");
        let fwd = u.assess(&cfgs[0], PeakPhase::FwdBwd);
        assert!((fwd.rel - 0.27).abs() < 1e-12 && fwd.family_error.is_none(), "its own band is wider: {fwd:?}");
    }

    #[test]
    fn a_larger_input_widens_the_band_per_doubling_and_says_why() {
        let u = measured();
        let a = u.assess(&unet(vec![64, 128, 256], Spatial::new(80, 128, 128), 1), PeakPhase::FwdBwd);
        assert!((a.rel - 0.09 * 2.0).abs() < 1e-9, "4x volume = two doublings, half a band each: {}", a.rel);
        assert_eq!(a.distance.unwrap().to_string(), "level-0 volume 4.0x the largest measured");
    }

    #[test]
    fn widths_batch_and_unmeasured_families_widen_too() {
        let u = measured();
        let wide = u.assess(&unet(vec![64, 128, 2048], Spatial::new(80, 64, 64), 1), PeakPhase::FwdBwd);
        assert_eq!(wide.distance.unwrap().to_string(), "width 2048 outside the measured 32..512");
        assert!((wide.rel - 0.09 * 2.0).abs() < 1e-9);
        let batch = u.assess(&unet(vec![64, 128, 256], Spatial::new(80, 64, 64), 2), PeakPhase::FwdBwd);
        assert_eq!(batch.distance.unwrap().to_string(), "batch 2, largest measured 1");
        let mut dit = unet(vec![64], Spatial::new(16, 16, 16), 1);
        dit.model = ModelSpec::Dit(facts::DitSpec {
            variant: Some(Variant::S),
            hidden: None,
            heads: None,
            depth: None,
            patch: 2,
        });
        let other = u.assess(&dit, PeakPhase::FwdBwd);
        assert_eq!(other.distance.unwrap().to_string(), "no dit config measured for this runtime");
        assert!((other.rel - 0.09 * 2.0).abs() < 1e-9, "twice the widest band: {}", other.rel);
        // The optimizer regime has no band of its own: the family's is used.
        assert_eq!(u.assess(&unet(vec![64, 128, 256], Spatial::new(80, 64, 64), 1), PeakPhase::Step).rel, 0.09);
    }
}
