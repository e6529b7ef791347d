//! The precheck's call on one config: `fits`, `risky`, `oom` or `invalid`,
//! from a predicted peak, the memory available and the prediction's band.

use serde::{Deserialize, Serialize};
use std::fmt;

use super::uncertainty::Distance;

/// The share of a device's memory a caching allocator may hold in pieces it
/// cannot hand out whole: a run whose allocated peak comes within it of the
/// capacity can run out of memory with bytes to spare. The group's latent
/// script (no expandable segments) ran `3L_small` at 65.9 GiB allocated and
/// failed `3L_medium`, which allocates 67.9 GiB at its peak
/// (data/gpu-check/2026-11-27-h100/RUN.md), on 79.2 GiB cards: 83 % ran,
/// 86 % did not.
pub const FRAGMENTATION_MARGIN: f64 = 0.15;

/// Classify a predicted peak against a capacity and an optional budget.
///
/// With a relative band `u`, the measured peak lies in `[p/(1+u), p/(1-u)]`:
/// `oom` when even its low end exceeds the capacity; `risky` when the capacity
/// lies inside the band, on either side of the prediction, or the prediction
/// is within [`FRAGMENTATION_MARGIN`] of it, or the budget lies inside the band
/// (or the prediction is over the budget but under the capacity); `fits`
/// otherwise. `why` is the distance from the data that widened the band.
pub fn judge(
    predicted_gib: f64,
    capacity_gib: f64,
    budget_gib: Option<f64>,
    band: f64,
    why: Option<&Distance>,
) -> Verdict {
    let u = band.clamp(0.0, 1.0);
    let low = predicted_gib / (1.0 + u);
    let high = if u < 1.0 { predicted_gib / (1.0 - u) } else { f64::INFINITY };
    let risky = |limit_gib, reason| Verdict::Risky {
        predicted_gib,
        limit_gib,
        reason,
        band: u,
        why: why.map(|d| d.to_string()),
    };
    if low > capacity_gib {
        return Verdict::Oom { predicted_gib, available_gib: capacity_gib };
    }
    if predicted_gib > capacity_gib {
        return risky(capacity_gib, RiskReason::AboveCapacity);
    }
    if high > capacity_gib {
        return risky(capacity_gib, RiskReason::NearCapacity);
    }
    if predicted_gib > capacity_gib * (1.0 - FRAGMENTATION_MARGIN) {
        return risky(capacity_gib, RiskReason::Fragmentation);
    }
    if let Some(b) = budget_gib {
        if predicted_gib > b {
            return risky(b, RiskReason::OverBudget);
        }
        if high > b {
            return risky(b, RiskReason::NearBudget);
        }
    }
    Verdict::Fits { predicted_gib, available_gib: capacity_gib }
}

/// [`judge`], held also to the family's held-out error where that is wider
/// than the config's own band: a config that fits by its band but whose
/// limit lies within the family's error of it is `risky`
/// ([`RiskReason::FamilyError`]), never `fits`. The band of one family and
/// regime can be narrower than what the family as a whole missed by on tables
/// it was not fitted on; a verdict of `fits` must hold against both.
pub fn judge_held_out(
    predicted_gib: f64,
    capacity_gib: f64,
    budget_gib: Option<f64>,
    band: f64,
    why: Option<&Distance>,
    family_error: Option<f64>,
) -> Verdict {
    let own = judge(predicted_gib, capacity_gib, budget_gib, band, why);
    let Some(error) = family_error.filter(|&e| e > band) else { return own };
    if !matches!(own, Verdict::Fits { .. }) {
        return own;
    }
    let limit_gib = match judge(predicted_gib, capacity_gib, budget_gib, error, None) {
        Verdict::Fits { .. } => return own,
        Verdict::Risky { limit_gib, .. } => limit_gib,
        Verdict::Oom { .. } | Verdict::Invalid { .. } => capacity_gib,
    };
    let words =
        format!("its family's held-out error, {:.1}%, is wider than its own band, {:.1}%", 100.0 * error, 100.0 * band);
    Verdict::Risky {
        predicted_gib,
        limit_gib,
        reason: RiskReason::FamilyError,
        band: error.clamp(0.0, 1.0),
        why: Some(match why {
            Some(d) => format!("{words}; {d}"),
            None => words,
        }),
    }
}

/// Why a config is `risky`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RiskReason {
    /// Predicted above the GPU's capacity, but within the band of it.
    AboveCapacity,
    /// Predicted below the GPU's capacity, but within the band of it.
    NearCapacity,
    /// Predicted within the allocator's fragmentation margin of the capacity.
    Fragmentation,
    /// Within the uncertainty of the budget.
    NearBudget,
    /// Predicted above the budget (runs, but over the group's policy).
    OverBudget,
    /// Fits by its own band, but a limit lies within its family's held-out
    /// error (wider than that band) of the prediction.
    FamilyError,
}

/// The precheck's call on one config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    Fits {
        predicted_gib: f64,
        available_gib: f64,
    },
    Risky {
        predicted_gib: f64,
        limit_gib: f64,
        reason: RiskReason,
        /// The relative band the verdict used.
        #[serde(default)]
        band: f64,
        /// Why the band is wider than the family's (distance from the calibration data).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        why: Option<String>,
    },
    Oom {
        predicted_gib: f64,
        available_gib: f64,
    },
    Invalid {
        reasons: Vec<String>,
    },
}

/// Which of the four verdicts, without its figures: what the state
/// directory keeps per config (`"verdict": "fits"`) and what decides whether
/// `submit` sends a config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    Fits,
    Risky,
    Oom,
    Invalid,
}

impl VerdictKind {
    /// `fits`, `risky`, `oom`, `invalid`.
    pub fn name(self) -> &'static str {
        match self {
            VerdictKind::Fits => "fits",
            VerdictKind::Risky => "risky",
            VerdictKind::Oom => "oom",
            VerdictKind::Invalid => "invalid",
        }
    }

    /// Predicted to run (fits, or risky: within the band of a limit).
    pub fn may_run(self) -> bool {
        matches!(self, VerdictKind::Fits | VerdictKind::Risky)
    }
}

impl RiskReason {
    /// Why, in words: `near capacity`.
    pub fn words(self) -> &'static str {
        match self {
            RiskReason::AboveCapacity => "above capacity",
            RiskReason::NearCapacity => "near capacity",
            RiskReason::Fragmentation => "within the allocator's fragmentation margin of capacity",
            RiskReason::NearBudget => "near budget",
            RiskReason::OverBudget => "over budget",
            RiskReason::FamilyError => "within its family's held-out error of",
        }
    }
}

impl fmt::Display for VerdictKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl PartialEq<&str> for VerdictKind {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}

impl Verdict {
    pub fn kind(&self) -> VerdictKind {
        match self {
            Verdict::Fits { .. } => VerdictKind::Fits,
            Verdict::Risky { .. } => VerdictKind::Risky,
            Verdict::Oom { .. } => VerdictKind::Oom,
            Verdict::Invalid { .. } => VerdictKind::Invalid,
        }
    }

    /// `fits`, `risky`, `oom`, `invalid`.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }
    /// Predicted (at its mean) to run on the GPU without running out of memory.
    pub fn fits_gpu(&self) -> bool {
        match self {
            Verdict::Fits { .. } => true,
            Verdict::Risky { reason, .. } => *reason != RiskReason::AboveCapacity,
            Verdict::Oom { .. } | Verdict::Invalid { .. } => false,
        }
    }
    pub fn predicted_gib(&self) -> Option<f64> {
        match self {
            Verdict::Fits { predicted_gib, .. }
            | Verdict::Risky { predicted_gib, .. }
            | Verdict::Oom { predicted_gib, .. } => Some(*predicted_gib),
            Verdict::Invalid { .. } => None,
        }
    }
}

/// Memory for people, always in GiB (`G`, as the reports write it): `49.8G`
/// with one decimal, two significant digits below one GiB (`0.070G`,
/// `0.0035G`) so small configs do not all read `0.0G`. Never `M`: the
/// parameter counts beside it are millions.
pub fn memory(gib: f64) -> String {
    let decimals = match gib {
        g if g >= 1.0 => 1,
        g if g >= 0.1 => 2,
        g if g >= 0.01 => 3,
        _ => 4,
    };
    format!("{gib:.decimals$}G")
}

/// `79.2 GiB`, `0.062 GiB`: [`memory`]'s digits, the unit spelt out.
pub fn gib(x: f64) -> String {
    format!("{} GiB", memory(x).trim_end_matches('G'))
}

/// Where a measured peak is expected to lie for a prediction `p` with the
/// relative band `u`: `[p/(1+u), p/(1-u)]`, said as that interval, not as
/// `±u` (asymmetric, and without an upper end once `u` reaches 100%).
pub fn interval(predicted_gib: f64, band: f64) -> String {
    let u = band.clamp(0.0, 1.0);
    let low = memory(predicted_gib / (1.0 + u));
    if u >= 1.0 {
        format!("likely {low} or more, no upper bound")
    } else {
        format!("likely {low}–{}", memory(predicted_gib / (1.0 - u)))
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Fits { predicted_gib, available_gib } => {
                write!(f, "fits ({} of {})", memory(*predicted_gib), gib(*available_gib))
            }
            Verdict::Risky { predicted_gib, limit_gib, reason, band, why } => {
                let what = reason.words();
                write!(
                    f,
                    "risky ({}, {}, {what} {}",
                    memory(*predicted_gib),
                    interval(*predicted_gib, *band),
                    gib(*limit_gib)
                )?;
                match why {
                    Some(w) => write!(f, "; {w})"),
                    None => write!(f, ")"),
                }
            }
            Verdict::Oom { predicted_gib, available_gib } => {
                write!(f, "oom (needs {}, {} available)", gib(*predicted_gib), gib(*available_gib))
            }
            Verdict::Invalid { reasons } => write!(f, "invalid ({})", reasons.join("; ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judge_bands() {
        assert_eq!(judge(90.0, 79.2, None, 0.05, None).name(), "oom");
        assert_eq!(judge(77.0, 79.2, None, 0.05, None).name(), "risky");
        assert_eq!(judge(40.0, 79.2, Some(60.0), 0.05, None).name(), "fits");
        assert_eq!(judge(58.0, 79.2, Some(60.0), 0.05, None).name(), "risky");
        assert_eq!(judge(65.0, 79.2, Some(60.0), 0.05, None).name(), "risky");
        assert!(judge(65.0, 79.2, Some(60.0), 0.05, None).fits_gpu());
    }

    /// The group's 3L_medium failed at 67.9 GiB allocated on a 79.2 GiB card,
    /// 3L_small ran at 65.9: with a 1 % band the first is risky, the second fits.
    #[test]
    fn a_peak_within_the_fragmentation_margin_is_risky() {
        let v = judge(67.9, 79.2, None, 0.01, None);
        assert!(matches!(v, Verdict::Risky { reason: RiskReason::Fragmentation, .. }), "{v}");
        assert!(v.fits_gpu(), "predicted to fit at its mean");
        assert_eq!(
            v.to_string(),
            "risky (67.9G, likely 67.2G–68.6G, within the allocator's fragmentation margin of capacity 79.2 GiB)"
        );
        assert_eq!(judge(65.9, 79.2, None, 0.01, None).name(), "fits");
    }

    #[test]
    fn risky_on_both_sides_of_the_capacity() {
        // 81 GiB on a 79.2 GiB card with a 5% band: the measured peak may be 77.1 GiB.
        let above = judge(81.0, 79.2, None, 0.05, None);
        assert!(matches!(above, Verdict::Risky { reason: RiskReason::AboveCapacity, .. }), "{above}");
        assert_eq!(above.to_string(), "risky (81.0G, likely 77.1G–85.3G, above capacity 79.2 GiB)");
        assert!(!above.fits_gpu(), "predicted above the card");
        // Beyond the band on the far side: oom.
        assert_eq!(judge(83.5, 79.2, None, 0.05, None).name(), "oom");
        // A wide band from extrapolation keeps a prediction well above the card risky, and says why.
        let d = Distance::Size { level: 0, tokens: false, ratio: 4.0 };
        let far = judge(90.0, 79.2, None, 0.2, Some(&d));
        assert_eq!(
            far.to_string(),
            "risky (90.0G, likely 75.0G–112.5G, above capacity 79.2 GiB; level-0 volume 4.0x the largest measured)"
        );
    }

    /// DiT's optimizer-step band is 1.4 %, its held-out error over every
    /// regime 3.9 %: 58 GiB against a 60 GiB budget fits by the first and
    /// not by the second, so it is `risky` and says why; far from every
    /// limit, or with no wider family error, it fits.
    #[test]
    fn a_family_error_wider_than_the_band_makes_a_near_limit_config_risky() {
        let v = judge_held_out(58.0, 79.2, Some(60.0), 0.014, None, Some(0.039));
        assert!(matches!(v, Verdict::Risky { reason: RiskReason::FamilyError, .. }), "{v}");
        assert_eq!(
            v.to_string(),
            "risky (58.0G, likely 55.8G–60.4G, within its family's held-out error of 60.0 GiB; \
             its family's held-out error, 3.9%, is wider than its own band, 1.4%)"
        );
        assert_eq!(judge(58.0, 79.2, Some(60.0), 0.014, None).name(), "fits", "its own band alone");
        assert_eq!(judge_held_out(58.0, 79.2, Some(60.0), 0.014, None, None).name(), "fits");
        assert_eq!(judge_held_out(58.0, 79.2, Some(60.0), 0.05, None, Some(0.039)).name(), "risky");
        assert_eq!(judge_held_out(40.0, 79.2, Some(60.0), 0.014, None, Some(0.039)).name(), "fits");
        // Against the capacity: U-ViT under Burn's CPU runtime, 15 % in one regime, 60 % in the family.
        let v = judge_held_out(60.0, 79.2, None, 0.15, None, Some(0.6));
        assert!(matches!(v, Verdict::Risky { reason: RiskReason::FamilyError, limit_gib, .. } if limit_gib == 79.2));
        // A verdict its own band already makes is kept as it is.
        let own = judge_held_out(77.0, 79.2, None, 0.05, None, Some(0.5));
        assert_eq!(own, judge(77.0, 79.2, None, 0.05, None));
    }

    /// A band of 100% has no upper end: said so, not printed as `±100%`. A
    /// 2.1 GiB prediction is risky on an 80 GiB card then because nothing
    /// bounds it, and the words say that rather than "near capacity" alone.
    #[test]
    fn an_unbounded_band_is_called_what_it_is() {
        let v = judge(2.1, 79.2, None, 1.0, None);
        assert_eq!(v.to_string(), "risky (2.1G, likely 1.1G or more, no upper bound, near capacity 79.2 GiB)");
        // A 39% band around 53.3 GiB reaches 87.4 GiB: the capacity is inside it, as the interval shows.
        let v = judge(53.3, 79.2, None, 0.39, None);
        assert_eq!(v.to_string(), "risky (53.3G, likely 38.3G–87.4G, near capacity 79.2 GiB)");
    }
}
