//! Active profiling: measure only the configs whose measurement decides
//! something, predict the rest with a stated band, and say which is which.
//!
//! One round: refit the calibration on what the sweep has measured so far
//! (the overlay's fit, pulled towards the prior calibration: shipped, or any
//! other), judge every config not yet measured, and choose the next configs
//! to measure ([`choose`]). A config is *settled* when it is measured, or
//! when its interval lies entirely below or above its GPU's capacity and its
//! band is within the target error. The loop stops when every config is
//! settled or the run budget is spent. This module is the pure part of the
//! loop; submitting, collecting and recording rounds belong to its callers.

mod choose;

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use sha2::{Digest, Sha256};
use spec::record::{MeasuredStatus, MeasurementRecord};
use spec::RunConfig;

use crate::precheck::overlay::Overlay;
use crate::precheck::{runtime_key, Calibration, Predictor, Verdict, VerdictKind};

pub use choose::{choose, Choice, Stop};

/// What the user asks of an active sweep.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The runtime the sweep's configs are predicted for (`pytorch`, `burn-flex`).
    pub framework: String,
    /// Largest band (relative, p90) an unmeasured config may keep.
    pub target_error: f64,
    /// Runs at most, all rounds together (`None`: no limit).
    pub max_runs: Option<usize>,
    /// Configs per round at most (`None`: a tenth of the sweep, at least 2).
    pub round_size: Option<usize>,
}

/// A target error as given on the command line: `5%` or `0.05`.
pub fn parse_share(s: &str) -> Result<f64, String> {
    let (num, scale) = match s.trim().strip_suffix('%') {
        Some(n) => (n, 0.01),
        None => (s.trim(), 1.0),
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v * scale > 0.0 && v * scale < 1.0 => Ok(v * scale),
        _ => Err(format!("`{s}` is not a share between 0 and 1 (write `5%` or `0.05`)")),
    }
}

/// Where a config's answer came from.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum Answer {
    /// Run: its measured peak (`None` for an OOM).
    Measured { peak_gib: Option<f64>, oom: bool },
    /// Not run: predicted, with the interval the measured peak lies in nine
    /// times in ten, and the calibration that predicted it.
    Predicted {
        peak_gib: f64,
        low_gib: f64,
        high_gib: f64,
        band: f64,
        verdict: VerdictKind,
        /// Outside the calibration's coverage (why the band is wide), if so.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        distance: Option<String>,
        calibration: String,
        /// Interval entirely on one side of the capacity and band within the target.
        settled: bool,
    },
    /// No prediction possible (an invalid config): never run, never settled.
    Invalid { reason: String },
}

impl Answer {
    pub fn is_settled(&self) -> bool {
        match self {
            Answer::Measured { .. } => true,
            Answer::Predicted { settled, .. } => *settled,
            Answer::Invalid { .. } => true,
        }
    }
    pub fn is_measured(&self) -> bool {
        matches!(self, Answer::Measured { .. })
    }
}

/// The calibration of one round: the prior, refitted on the sweep's own runs.
pub struct Refit {
    prior: Calibration,
    overlay: Overlay,
    framework: String,
    /// The memory a run may use when it is less than the GPU's (the worker's `--memory-limit`).
    limit_gib: Option<f64>,
}

impl Refit {
    /// Refits on `measured` (the sweep's records; their framework is taken to
    /// be the sweep's runtime, since they ran what the sweep asked).
    pub fn new(prior: &Calibration, framework: &str, measured: &[MeasurementRecord]) -> Refit {
        let recs: Vec<MeasurementRecord> =
            measured.iter().cloned().map(|r| MeasurementRecord { framework: framework.to_string(), ..r }).collect();
        Refit {
            prior: prior.clone(),
            overlay: Overlay::fit(&recs, prior),
            framework: framework.to_string(),
            limit_gib: None,
        }
    }

    /// Judges against `limit_gib` (a memory limit the runs are held to) instead of the GPU's capacity.
    pub fn with_limit(mut self, limit_gib: Option<f64>) -> Refit {
        self.limit_gib = limit_gib;
        self
    }

    /// The memory a run of `cfg` may use: the limit, else its GPU's capacity.
    pub fn capacity_gib(&self, cfg: &RunConfig) -> f64 {
        self.limit_gib.unwrap_or_else(|| cfg.gpu.capacity_gib())
    }

    /// The predictor for `cfg` and its identity: `local <runtime> on <device>,
    /// N runs #<coefficients digest>` or `prior <runtime> #<digest>`.
    pub fn predictor(&self, cfg: &RunConfig) -> Result<(Predictor, String), String> {
        let key = runtime_key(&self.framework, cfg.precision);
        if let Some(e) = self.overlay.entry(&key, cfg.gpu) {
            let p = Predictor::new(key, e.coefficients).with_uncertainty(e.uncertainty.clone());
            let id = format!("local {} on {}, {} runs #{}", e.runtime, e.device, e.measured, digest(&e.coefficients));
            return Ok((p, id));
        }
        let p = Predictor::from_calibration(&self.prior, &self.framework, cfg.precision).map_err(|e| e.to_string())?;
        let id = format!("prior {} #{}", p.runtime(), digest(p.coefficients()));
        Ok((p, id))
    }

    /// The answer for a config not measured.
    pub fn predict(&self, cfg: &RunConfig, target_error: f64) -> Answer {
        let (pred, calibration) = match self.predictor(cfg) {
            Ok(p) => p,
            Err(reason) => return Answer::Invalid { reason },
        };
        let problems = spec::validate::validate(cfg);
        if !problems.is_empty() {
            return Answer::Invalid { reason: problems.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ") };
        }
        // One prediction gives the peak, the band and (against the memory limit, if any) the verdict.
        let prediction = match pred.predict_peak(cfg) {
            Ok(p) => p,
            Err(e) => return Answer::Invalid { reason: e.to_string() },
        };
        let v = pred.verdict_within(cfg, &prediction, None, self.limit_gib);
        let (peak_gib, band) = (prediction.peak_gib(), prediction.rel_uncertainty);
        let distance = match &v {
            Verdict::Risky { why, .. } => why.clone(),
            _ => prediction.distance.map(|d| d.to_string()),
        };
        let (low_gib, high_gib) = interval(peak_gib, band);
        let decided = matches!(v.kind(), VerdictKind::Fits | VerdictKind::Oom);
        Answer::Predicted {
            peak_gib,
            low_gib,
            high_gib,
            band,
            verdict: v.kind(),
            distance,
            calibration,
            settled: decided && band <= target_error,
        }
    }
}

/// A family and the regime that sets its peak (`activation`, `optimizer`).
pub type Group = (String, &'static str);

impl Refit {
    /// `(family, regime)` of a config as this refit predicts it.
    pub fn group(&self, cfg: &RunConfig) -> Group {
        let phase = self.predictor(cfg).ok().and_then(|(p, _)| p.predict_peak(cfg).ok()).map(|p| p.peak_phase);
        let regime = phase.map(|p| crate::precheck::uncertainty::Regime::of(p).name()).unwrap_or("unknown");
        (cfg.model.family().name().to_string(), regime)
    }
}

/// `[p/(1+u), p/(1-u)]`: where the measured peak lies nine times in ten.
pub fn interval(peak_gib: f64, band: f64) -> (f64, f64) {
    let high = if band < 1.0 { peak_gib / (1.0 - band) } else { f64::INFINITY };
    (peak_gib / (1.0 + band), high)
}

fn digest<T: Serialize>(v: &T) -> String {
    let json = serde_json::to_vec(v).unwrap_or_default();
    hex::encode(&Sha256::digest(&json)[..4])
}

/// The answer of a measured record.
pub fn measured(r: &MeasurementRecord) -> Answer {
    let oom = r.status == MeasuredStatus::Oom;
    Answer::Measured { peak_gib: if oom { None } else { r.peak_gb }, oom }
}

/// Every config's answer: its measurement where `measured` has one (by key),
/// else the refit's prediction. A prediction stays open while its family and
/// regime have no measured anchor (unless every config there is called out of
/// memory: nothing there would run).
pub fn answers(
    configs: &[(String, RunConfig)],
    measured_by_key: &BTreeMap<String, MeasurementRecord>,
    refit: &Refit,
    target_error: f64,
) -> BTreeMap<String, Answer> {
    let mut out: BTreeMap<String, Answer> = configs
        .iter()
        .map(|(k, cfg)| {
            let a = match measured_by_key.get(k) {
                Some(r) => measured(r),
                None => refit.predict(cfg, target_error),
            };
            (k.clone(), a)
        })
        .collect();
    let groups: BTreeMap<&str, Group> = configs.iter().map(|(k, c)| (k.as_str(), refit.group(c))).collect();
    let anchored: BTreeSet<&Group> =
        groups.iter().filter(|(k, _)| out.get(**k).is_some_and(Answer::is_measured)).map(|(_, g)| g).collect();
    let runnable: BTreeSet<&Group> = groups
        .iter()
        .filter(
            |(k, _)| matches!(out.get(**k), Some(Answer::Predicted { verdict, .. }) if *verdict != VerdictKind::Oom),
        )
        .map(|(_, g)| g)
        .collect();
    for (k, g) in &groups {
        if let Some(Answer::Predicted { settled, .. }) = out.get_mut(*k) {
            if runnable.contains(g) && !anchored.contains(g) {
                *settled = false;
            }
        }
    }
    out
}

/// What an active sweep saved: runs not spent, and GPU time at the sweep's
/// measured seconds per run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Savings {
    pub configs: usize,
    pub measured: usize,
    pub predicted: usize,
    pub runs_saved: usize,
    /// Mean wall seconds of the measured runs (`None`: none measured a time).
    pub seconds_per_run: Option<f64>,
    pub gpu_seconds_saved: Option<f64>,
}

impl Savings {
    pub fn of(answers: &BTreeMap<String, Answer>, run_seconds: &[f64]) -> Savings {
        let measured = answers.values().filter(|a| a.is_measured()).count();
        let predicted = answers.values().filter(|a| matches!(a, Answer::Predicted { .. })).count();
        let timed: Vec<f64> = run_seconds.iter().copied().filter(|s| *s > 0.0).collect();
        let seconds_per_run = (!timed.is_empty()).then(|| timed.iter().sum::<f64>() / timed.len() as f64);
        Savings {
            configs: answers.len(),
            measured,
            predicted,
            runs_saved: predicted,
            seconds_per_run,
            gpu_seconds_saved: seconds_per_run.map(|s| s * predicted as f64),
        }
    }
}

#[cfg(test)]
mod tests;
