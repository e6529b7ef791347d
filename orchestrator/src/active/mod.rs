//! Active profiling: measure only the configs whose measurement decides
//! something, predict the rest with a stated band, and say which is which.
//!
//! One round: refit the calibration on what the sweep has measured so far
//! (the overlay's fit, pulled towards the prior calibration: shipped, or any
//! other), judge every config not yet measured, and choose the next configs
//! to measure ([`choose`]). An unmeasured config's band is never narrower
//! than the sweep's own runs of its family and regime ask for (how far its
//! calibration was off them, an `oom` counting as a peak above the memory it
//! had). A config is *settled* when it is measured, or
//! when its interval lies entirely above the memory a run may use (a run
//! could only say `oom`), or entirely below it (and on one side of the
//! budget) with its band within the target error. A config submitted that
//! measured nothing *could not be measured*: neither settled nor saved. The
//! loop stops when every config is settled or could not be measured, when
//! the run budget is spent, or after a round whose every run failed (a
//! worker that fails every config is not asked again and again). This module
//! is the pure part of the loop; submitting, collecting and recording rounds
//! belong to its callers.

mod answer;
mod choose;
mod outcome;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use facts::record::{MeasuredStatus, MeasurementRecord};
use facts::RunConfig;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::precheck::overlay::Overlay;
use crate::precheck::uncertainty::{Distance, Regime};
use crate::precheck::{runtime_key, Calibration, Predictor, RiskReason, Runtime, Verdict, VerdictKind};

pub use answer::{
    cancelled_text, configs, failures, failures_text, interval_words, peak_interval, plural, Answer, Savings,
};
pub use choose::{choose, round_failed, Choice, Stop};
pub use outcome::ActiveReport;

/// The target error `submit --active` and `evidence` use unless told
/// otherwise: the largest band an unmeasured config may keep.
pub const DEFAULT_TARGET_ERROR: &str = "20%";

/// What the user asks of an active sweep.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The runtime the sweep's configs are predicted for (`pytorch`, `burn-flex`).
    pub runtime: Runtime,
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

/// An unmeasured config's band is at least this many times the band that
/// would just hold the sweep's own runs of its family and regime as its
/// calibration predicts them. A calibration that missed this sweep's regime
/// (the group's `s2d_128_wdm`: runs 11-15% over a prior whose band there is
/// about 10%) says so in its intervals before the overlay has runs enough to
/// refit. One and a half: a few runs show less than the worst of the rest.
const OBSERVED_MARGIN: f64 = 1.5;

/// The calibration of one round: the prior, refitted on the sweep's own runs.
pub struct Refit {
    prior: Calibration,
    overlay: Overlay,
    /// The sweep's runs: each config, and its peak or (an `oom`) the memory it
    /// had, a bound its peak lies above (GiB).
    runs: Vec<Run>,
    /// [`Refit::observed`] by (calibration, family, regime).
    observed: Mutex<HashMap<ObservedKey, Option<Observed>>>,
    framework: String,
    /// The memory a run may use when it is less than the GPU's (the worker's `--memory-limit`).
    limit_gib: Option<f64>,
    /// The experiment's memory policy (`budget_gb`): above it a config is `risky`, as `plan` says.
    budget_gib: Option<f64>,
}

impl Refit {
    /// Refits on `measured` (the sweep's records; their framework is taken to
    /// be the sweep's runtime, since they ran what the sweep asked).
    pub fn new(prior: &Calibration, framework: &str, measured: &[MeasurementRecord]) -> Refit {
        let recs: Vec<MeasurementRecord> =
            measured.iter().cloned().map(|r| MeasurementRecord { framework: framework.to_string(), ..r }).collect();
        let runs = measured
            .iter()
            .filter_map(|r| {
                let oom = r.status == MeasuredStatus::Oom;
                let gib = if oom { r.available_gib()? } else { r.peak_gib()? };
                Some(Run { cfg: r.run_config().ok()?, gib, oom })
            })
            .collect();
        Refit {
            prior: prior.clone(),
            overlay: Overlay::fit(&recs, prior),
            runs,
            observed: Mutex::default(),
            framework: framework.to_string(),
            limit_gib: None,
            budget_gib: None,
        }
    }

    /// Judges against the experiment's budget (`budget_gb`) as `plan` does.
    pub fn with_budget(mut self, budget_gib: Option<f64>) -> Refit {
        self.budget_gib = budget_gib;
        self
    }

    /// Judges against `limit_gib` instead of the GPU's capacity: the memory
    /// the runs have in its place (`Sweep::memory_limit_gib`: the worker's
    /// limit, or this machine's memory, as `plan` judges).
    pub fn with_limit(mut self, limit_gib: Option<f64>) -> Refit {
        self.limit_gib = limit_gib;
        self
    }

    /// The experiment's budget the verdicts are judged against, if any.
    pub fn budget_gib(&self) -> Option<f64> {
        self.budget_gib
    }

    /// The memory a run of `cfg` may use: the limit, else its GPU's capacity.
    pub fn capacity_gib(&self, cfg: &RunConfig) -> f64 {
        self.limit_gib.unwrap_or(cfg.gpu.capacity_gib())
    }

    /// The predictor for `cfg` and its identity: `local <runtime> on <device>,
    /// N runs #<coefficients digest>` or `prior <runtime> #<digest>`.
    pub fn predictor(&self, cfg: &RunConfig) -> Result<(Predictor, String), crate::precheck::PrecheckError> {
        let key = runtime_key(&self.framework, cfg.precision);
        if let Some(e) = self.overlay.entry(&key, cfg.gpu) {
            let p = Predictor::new(key, e.coefficients).with_uncertainty(e.uncertainty.clone());
            let id = format!("local {} on {}, {} runs #{}", e.runtime, e.device, e.measured, digest(&e.coefficients));
            return Ok((p, id));
        }
        let p = Predictor::from_calibration(&self.prior, &self.framework, cfg.precision)?;
        let id = format!("prior {} #{}", p.runtime(), digest(p.coefficients()));
        Ok((p, id))
    }

    /// The answer for a config not measured.
    pub fn predict(&self, cfg: &RunConfig, target_error: f64) -> Answer {
        let (pred, calibration) = match self.predictor(cfg) {
            Ok(p) => p,
            Err(e) => return Answer::Invalid { reason: e.to_string() },
        };
        let problems = facts::validate::validate(cfg);
        if !problems.is_empty() {
            return Answer::Invalid { reason: problems.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ") };
        }
        // One prediction gives the peak, the band and (against the memory limit, if any) the verdict.
        let mut prediction = match pred.predict_peak(cfg) {
            Ok(p) => p,
            Err(e) => return Answer::Invalid { reason: e.to_string() },
        };
        let regime = Regime::of(prediction.peak_phase);
        if let Some(o) = self.observed(&pred, &calibration, cfg, regime) {
            let band = (OBSERVED_MARGIN * o.band).min(1.0);
            if band > prediction.rel_uncertainty {
                prediction.rel_uncertainty = band;
                prediction.distance = Some(Distance::Observed { runs: o.runs, error: o.error });
            }
        }
        let v = pred.verdict_against(cfg, &prediction, self.budget_gib, self.capacity_gib(cfg));
        let (peak_gib, band) = (prediction.peak_gib(), prediction.rel_uncertainty);
        let (distance, reason) = match &v {
            Verdict::Risky { why, reason, .. } => (why.clone(), Some(*reason)),
            _ => (prediction.distance.map(|d| d.to_string()), None),
        };
        let (low_gib, high_gib) = interval(peak_gib, band);
        Answer::Predicted {
            peak_gib,
            low_gib,
            high_gib,
            band,
            verdict: v.kind(),
            reason,
            distance,
            calibration,
            settled: settles(&v, low_gib, band, target_error),
        }
    }
}

/// (calibration, family, regime): what [`Refit::observed`] is kept by.
type ObservedKey = (String, &'static str, &'static str);

/// One run of the sweep as the bands see it.
struct Run {
    cfg: RunConfig,
    /// Its measured peak, or (`oom`) the memory it had: its peak was more.
    gib: f64,
    oom: bool,
}

/// How far a calibration was off the sweep's own runs of one family and regime.
#[derive(Debug, Clone, Copy)]
struct Observed {
    runs: usize,
    /// The largest `|measured / predicted - 1|`.
    error: f64,
    /// The smallest band whose interval holds every one of them: `|m - p| / m`.
    band: f64,
}

impl Refit {
    /// The sweep's runs of `cfg`'s family whose peak `pred` (known as
    /// `calibration`) sets in `regime`, and how far it was off them. An `oom`
    /// is a censored observation: predicted below the memory it had, the
    /// calibration was off by at least the difference; predicted above, it
    /// was right as far as anyone can tell.
    fn observed(&self, pred: &Predictor, calibration: &str, cfg: &RunConfig, regime: Regime) -> Option<Observed> {
        let family = cfg.model.family();
        let key = (calibration.to_string(), family.name(), regime.name());
        let mut cache = self.observed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = cache.get(&key) {
            return *o;
        }
        let mut o: Option<Observed> = None;
        for run in self.runs.iter().filter(|r| r.cfg.model.family() == family) {
            let Ok(p) = pred.predict_peak(&run.cfg) else { continue };
            let (predicted, measured) = (p.peak_gib(), run.gib);
            if Regime::of(p.peak_phase) != regime || predicted <= 0.0 || (run.oom && predicted >= measured) {
                continue;
            }
            let (error, band) = ((measured / predicted - 1.0).abs(), (measured - predicted).abs() / measured);
            let seen = o.get_or_insert(Observed { runs: 0, error: 0.0, band: 0.0 });
            *seen = Observed { runs: seen.runs + 1, error: seen.error.max(error), band: seen.band.max(band) };
        }
        cache.insert(key, o);
        o
    }
}

/// Whether a verdict holds over the whole interval `[low, …]` of its
/// prediction. `oom` (the interval lies above the memory a run may use)
/// settles whatever the band: a run could only say `oom`, which measures no
/// peak. `fits`, and `risky` over the budget with the whole interval above
/// it, settle once the band is within the target. Any other `risky` (the
/// interval holds the capacity or the budget) is what a run decides.
fn settles(v: &Verdict, low_gib: f64, band: f64, target_error: f64) -> bool {
    match v {
        Verdict::Oom { .. } => true,
        Verdict::Fits { .. } => band <= target_error,
        Verdict::Risky { reason: RiskReason::OverBudget, limit_gib, .. } => {
            low_gib > *limit_gib && band <= target_error
        }
        Verdict::Risky { .. } | Verdict::Invalid { .. } => false,
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

/// `[p/(1+u), p/(1-u)]`: where the measured peak lies nine times in ten
/// (`u` at most 1, as the precheck's verdicts take it: no upper end there).
pub fn interval(peak_gib: f64, band: f64) -> (f64, f64) {
    let u = band.clamp(0.0, 1.0);
    let high = if u < 1.0 { peak_gib / (1.0 - u) } else { f64::INFINITY };
    (peak_gib / (1.0 + u), high)
}

fn digest<T: Serialize>(v: &T) -> String {
    let json = serde_json::to_vec(v).unwrap_or_default();
    hex::encode(&Sha256::digest(&json)[..4])
}

/// The answer of a measured record.
pub fn measured(r: &MeasurementRecord) -> Answer {
    let oom = r.status == MeasuredStatus::Oom;
    Answer::Measured { peak_gib: if oom { None } else { r.peak_gib() }, oom }
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
    answers_after(configs, measured_by_key, &BTreeMap::new(), refit, target_error)
}

/// [`answers`] where the configs of `failed` (by key: why) were submitted
/// and measured nothing: each is [`Answer::Failed`], neither settled nor an
/// anchor of its family and regime.
pub fn answers_after(
    configs: &[(String, RunConfig)],
    measured_by_key: &BTreeMap<String, MeasurementRecord>,
    failed: &BTreeMap<String, String>,
    refit: &Refit,
    target_error: f64,
) -> BTreeMap<String, Answer> {
    let mut out: BTreeMap<String, Answer> = configs
        .iter()
        .map(|(k, cfg)| {
            let a = match (measured_by_key.get(k), failed.get(k)) {
                (Some(r), _) => measured(r),
                (None, Some(cause)) => Answer::Failed { cause: cause.clone() },
                (None, None) => refit.predict(cfg, target_error),
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
        if let Some(Answer::Predicted { settled, verdict, .. }) = out.get_mut(*k) {
            // Above the capacity a run can only say `oom`: no anchor changes that.
            if *verdict != VerdictKind::Oom && runnable.contains(g) && !anchored.contains(g) {
                *settled = false;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
