//! Fitting a runtime's coefficients to measurement records, and fit quality.
//!
//! The search is a coordinate search in log space over the few coefficients in
//! [`Coefficients::FITTED`], minimising the mean absolute log error of the
//! predicted peak (robust: it targets the median, a few noisy repeats do not
//! drag the fit) plus a hinge penalty for every record that ran out of memory
//! but is predicted to fit. Plain Rust, deterministic, a second or two.

use std::collections::BTreeMap;

use serde::Serialize;
use spec::record::{MeasuredStatus, MeasurementRecord};
use spec::RunConfig;

use super::{runtime_key, Calibration, Coefficients, Predictor, GIB};

/// One record the calibration can use.
#[derive(Debug, Clone)]
pub struct Sample {
    pub id: String,
    pub table: String,
    pub family: String,
    pub runtime: String,
    pub cfg: RunConfig,
    /// Measured peak in GiB (None for OOM records).
    pub measured_gib: Option<f64>,
    pub oom: bool,
    pub capacity_gib: f64,
}

/// Records turned into samples; the second list says why others were left out.
pub fn samples(records: &[MeasurementRecord]) -> (Vec<Sample>, Vec<String>) {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for r in records {
        let cfg = match r.run_config() {
            Ok(c) => c,
            Err(e) => {
                skipped.push(e.to_string());
                continue;
            }
        };
        let problems = spec::validate::validate(&cfg);
        if !problems.is_empty() {
            skipped.push(format!("record `{}`: invalid config: {}", r.id, problems[0]));
            continue;
        }
        let oom = r.status == MeasuredStatus::Oom;
        if !oom && r.peak_gb.is_none() {
            skipped.push(format!("record `{}`: no peak_gb", r.id));
            continue;
        }
        out.push(Sample {
            id: r.id.clone(),
            table: r.table.clone().unwrap_or_default(),
            family: r.family.name().to_string(),
            runtime: runtime_key(&r.framework, r.precision),
            capacity_gib: cfg.gpu.capacity_gib(),
            cfg,
            measured_gib: if oom { None } else { r.peak_gb },
            oom,
        });
    }
    (out, skipped)
}

/// Error statistics of one group of samples.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct FitStats {
    /// Records with a measured peak.
    pub n: usize,
    pub median: f64,
    pub p90: f64,
    pub max: f64,
    /// OOM records in the group.
    pub n_oom: usize,
    /// OOM records predicted to fit the GPU (must be 0).
    pub oom_predicted_fit: usize,
}

/// Absolute relative errors of a slice, summarised (nearest-rank percentiles).
pub fn summarise(mut errs: Vec<f64>) -> (f64, f64, f64) {
    if errs.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    errs.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| {
        let rank = ((p * errs.len() as f64).ceil() as usize).clamp(1, errs.len());
        errs[rank - 1]
    };
    (pct(0.5), pct(0.9), errs[errs.len() - 1])
}

/// Fit quality per family (and `all`) of `pred` on `samples`.
pub fn stats(pred: &Predictor, samples: &[Sample]) -> BTreeMap<String, FitStats> {
    let mut errs: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut ooms: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for s in samples {
        let Ok(p) = pred.predict_peak(&s.cfg) else { continue };
        let gib = p.peak_gib();
        for key in [s.family.as_str(), "all"] {
            if let Some(m) = s.measured_gib {
                errs.entry(key.to_string()).or_default().push((gib - m).abs() / m);
            }
            if s.oom {
                let e = ooms.entry(key.to_string()).or_default();
                e.0 += 1;
                if gib <= s.capacity_gib {
                    e.1 += 1;
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    for (k, v) in errs {
        let (median, p90, max) = summarise(v.clone());
        out.insert(k, FitStats { n: v.len(), median, p90, max, ..Default::default() });
    }
    for (k, (n, bad)) in ooms {
        let e = out.entry(k).or_default();
        e.n_oom = n;
        e.oom_predicted_fit = bad;
    }
    out
}

/// The objective: mean |log(pred/measured)| + a hinge for OOM records predicted
/// to fit (they must come out above capacity, with 3% to spare).
fn loss(c: &Coefficients, runtime: &str, samples: &[&Sample]) -> f64 {
    let pred = Predictor::new(runtime, *c);
    let mut sum = 0.0;
    let mut n = 0usize;
    for s in samples {
        let Ok(p) = pred.predict_peak(&s.cfg) else { continue };
        let gib = p.peak_bytes / GIB;
        if let Some(m) = s.measured_gib {
            sum += (gib / m).ln().abs();
            n += 1;
        } else if s.oom {
            let need = s.capacity_gib * 1.03;
            if gib < need {
                sum += 20.0 * (need / gib).ln();
            }
        }
    }
    sum / n.max(1) as f64
}

/// Fit the coefficients of one runtime from `start`.
pub fn fit(runtime: &str, samples: &[&Sample], start: Coefficients) -> Coefficients {
    let mut best = start;
    let mut best_loss = loss(&best, runtime, samples);
    let mut step = 0.5f64;
    while step > 2e-3 {
        let mut improved = false;
        for i in 0..Coefficients::FITTED.len() {
            for dir in [1.0, -1.0] {
                let mut c = best;
                let v = c.get(i);
                let nv = if Coefficients::FITTED[i] == "unet_ckpt_keep" {
                    (v + dir * step * 0.5).clamp(0.0, 1.0)
                } else {
                    v * (1.0 + step).powf(dir)
                };
                c.set(i, nv);
                let l = loss(&c, runtime, samples);
                if l < best_loss - 1e-12 {
                    best = c;
                    best_loss = l;
                    improved = true;
                }
            }
        }
        if !improved {
            step *= 0.5;
        }
    }
    best
}

/// The starting point for a runtime: the shipped coefficients where the runtime
/// is known, else bare physics (Burn materialises transformer attention scores).
pub fn start_for(runtime: &str) -> Coefficients {
    let builtin = Calibration::builtin();
    if let Some(c) = builtin.runtimes.get(runtime) {
        return *c;
    }
    Coefficients::physical(runtime.starts_with("burn"))
}

/// The outcome of calibrating on a set of records.
pub struct Report {
    pub calibration: Calibration,
    /// Per runtime: fit quality per family.
    pub in_sample: BTreeMap<String, BTreeMap<String, FitStats>>,
    /// Per runtime and held-out table: quality on that table when fitted without it.
    pub leave_one_table_out: BTreeMap<String, BTreeMap<String, FitStats>>,
}

/// Fit every runtime found in `samples`; with `loto`, also refit once per table
/// without it and measure the held-out table (extrapolation check).
pub fn calibrate(samples: &[Sample], loto: bool) -> Report {
    let mut by_runtime: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        by_runtime.entry(s.runtime.as_str()).or_default().push(s);
    }
    let mut runtimes = BTreeMap::new();
    let mut in_sample = BTreeMap::new();
    let mut held = BTreeMap::new();
    for (rt, group) in by_runtime {
        let mut c = fit(rt, &group, start_for(rt));
        let owned: Vec<Sample> = group.iter().map(|s| (*s).clone()).collect();
        let st = stats(&Predictor::new(rt, c), &owned);
        c.rel_uncertainty = st.get("all").map(|s| s.p90).unwrap_or(0.15).max(0.05);
        in_sample.insert(rt.to_string(), st);
        runtimes.insert(rt.to_string(), c);
        if loto {
            let mut tables: Vec<&str> = group.iter().map(|s| s.table.as_str()).collect();
            tables.sort_unstable();
            tables.dedup();
            let mut per_table = BTreeMap::new();
            for t in tables {
                let train: Vec<&Sample> = group.iter().copied().filter(|s| s.table != t).collect();
                let test: Vec<Sample> = owned.iter().filter(|s| s.table == t).cloned().collect();
                let ct = fit(rt, &train, c);
                let mut st = stats(&Predictor::new(rt, ct), &test);
                if let Some(all) = st.remove("all") {
                    per_table.insert(t.to_string(), all);
                }
            }
            held.insert(rt.to_string(), per_table);
        }
    }
    Report {
        calibration: Calibration {
            note: format!(
                "Fitted by `orchestrator calibrate` on {} records; coefficients documented in orchestrator/src/precheck/mod.rs (Coefficients).",
                samples.len()
            ),
            runtimes,
        },
        in_sample,
        leave_one_table_out: held,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_nearest_rank() {
        let (m, p90, max) = summarise(vec![0.05, 0.01, 0.02, 0.03, 0.04, 0.06, 0.07, 0.08, 0.09, 0.10]);
        assert_eq!((m, p90, max), (0.05, 0.09, 0.10));
    }
}
