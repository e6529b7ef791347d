//! Fitting a runtime's coefficients to measurement records, and fit quality.
//!
//! The search is a coordinate search in log space over the few coefficients in
//! [`Coefficients::FITTED`], minimising the mean absolute log error of the
//! predicted peak (robust: it targets the median, a few noisy repeats do not
//! drag the fit) plus a hinge penalty for every record that ran out of memory
//! but is predicted to fit. Plain Rust, deterministic, a second or two.

use std::collections::BTreeMap;

use facts::record::{MeasuredStatus, MeasurementRecord};
use facts::RunConfig;
use serde::Serialize;

use super::uncertainty::{Regime, Uncertainty};
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
    /// The memory the run could use (a memory limit, the device, or the
    /// catalog GPU): what an OOM record is scored against.
    pub available_gib: f64,
}

/// Records turned into samples; the second list says why others were left out.
pub fn samples(records: &[MeasurementRecord]) -> (Vec<Sample>, Vec<String>) {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for r in records {
        if let Some(why) = &r.superseded {
            skipped.push(format!("record `{}`: superseded ({why})", r.id));
            continue;
        }
        let cfg = match r.run_config() {
            Ok(c) => c,
            Err(e) => {
                skipped.push(e.to_string());
                continue;
            }
        };
        let problems = facts::validate::validate(&cfg);
        if !problems.is_empty() {
            skipped.push(format!("record `{}`: invalid config: {}", r.id, problems[0]));
            continue;
        }
        let oom = r.status == MeasuredStatus::Oom;
        if !oom && r.peak_gib().is_none() {
            skipped.push(format!("record `{}`: no peak_gb", r.id));
            continue;
        }
        // An OOM only says "more than what the run had": unknown for a device
        // of unknown size without a limit, and never a catalog GPU's capacity
        // for a run that was not on one.
        let available_gib = match r.available_gib() {
            Some(a) => a,
            None if oom => {
                skipped.push(format!(
                    "record `{}`: oom on `{}` with neither a memory limit nor the device's memory; cannot be scored",
                    r.id, r.gpu
                ));
                continue;
            }
            None => f64::INFINITY,
        };
        out.push(Sample {
            id: r.id.clone(),
            table: r.table.clone().unwrap_or_default(),
            family: r.family.name().to_string(),
            runtime: runtime_key(&r.framework, r.precision),
            available_gib,
            cfg,
            measured_gib: if oom { None } else { r.peak_gib() },
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
    /// OOM records predicted to fit the GPU clear of the allocator's
    /// fragmentation margin, as `fits` (must be 0).
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
    let group: Vec<&Sample> = samples.iter().collect();
    held_out_stats(&group, &predictions(pred, &group), |h| group[h.sample].family.clone())
}

/// `pred`'s prediction of every sample it can predict (in sample: no fold left out).
fn predictions(pred: &Predictor, group: &[&Sample]) -> Vec<HeldOut> {
    (0..group.len())
        .filter_map(|i| {
            let p = pred.predict_peak(&group[i].cfg).ok()?;
            Some(HeldOut { sample: i, fold: String::new(), peak_gib: p.peak_gib(), regime: Regime::of(p.peak_phase) })
        })
        .collect()
}

/// Where a fit should stay unless the records say otherwise: the shipped
/// coefficients, with a weight per record-equivalent (a local overlay fitted
/// on a handful of runs moves only as far as those runs demand).
#[derive(Debug, Clone, Copy)]
pub struct Prior {
    pub at: Coefficients,
    pub weight: f64,
}

/// The objective: mean |log(pred/measured)| + a hinge for OOM records predicted
/// to fit (they must come out above what the run had, with 3% to spare), plus
/// the pull of the prior.
fn loss(c: &Coefficients, runtime: &str, samples: &[&Sample], prior: Option<&Prior>) -> f64 {
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
            // An OOM says the allocator reached the device: its allocated
            // peak came at least within the fragmentation margin of it.
            let need = s.available_gib * (1.0 - super::verdict::FRAGMENTATION_MARGIN);
            if gib < need {
                sum += 20.0 * (need / gib).ln();
            }
        }
    }
    let mut total = sum / n.max(1) as f64;
    if let Some(p) = prior {
        let mut pull = 0.0;
        for i in 0..Coefficients::FITTED.len() {
            let (v, v0) = (c.get(i), p.at.get(i));
            pull += (v / v0).ln().powi(2);
        }
        total += p.weight * pull / (n.max(1) as f64);
    }
    total
}

/// Fit the coefficients of one runtime from `start`.
pub fn fit(runtime: &str, samples: &[&Sample], start: Coefficients) -> Coefficients {
    fit_with(runtime, samples, start, None)
}

/// [`fit`], pulled towards `prior` (see [`Prior`]).
pub fn fit_with(runtime: &str, samples: &[&Sample], start: Coefficients, prior: Option<&Prior>) -> Coefficients {
    let mut best = start;
    let mut best_loss = loss(&best, runtime, samples, prior);
    let mut step = 0.5f64;
    while step > 2e-3 {
        let mut improved = false;
        for i in 0..Coefficients::FITTED.len() {
            for dir in [1.0, -1.0] {
                let mut c = best;
                let v = c.get(i);
                c.set(i, v * (1.0 + step).powf(dir));
                let l = loss(&c, runtime, samples, prior);
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

/// The starting point for a runtime: the shipped coefficients that answer
/// for it, flags included (its own fit, its fit at another precision, or the
/// stand-in: see [`Calibration::resolve`]), else bare physics (PyTorch and
/// this project's worker alike: no transformer attention scores kept,
/// autocast for the `-amp` precisions).
pub fn start_for(runtime: &str) -> Coefficients {
    Calibration::builtin().resolve_key(runtime).map(|r| r.coefficients).unwrap_or_else(Coefficients::physical)
}

/// One prediction of a record (by a fit without its fold, where cross-validated).
#[derive(Debug, Clone)]
pub struct HeldOut {
    /// Index into the samples.
    pub sample: usize,
    pub fold: String,
    pub peak_gib: f64,
    pub regime: Regime,
}

/// Cross-validation: every fold (a source table; or, with a single table, one
/// of up to five interleaved parts) is left out in turn, the runtime refitted
/// on the rest from `fitted`, and the left-out records predicted. Returns the
/// predictions and a sentence saying how.
pub fn cross_validate(
    runtime: &str,
    group: &[&Sample],
    fitted: Coefficients,
    prior: Option<&Prior>,
) -> (Vec<HeldOut>, String) {
    let mut tables: Vec<&str> = group.iter().map(|s| s.table.as_str()).collect();
    tables.sort_unstable();
    tables.dedup();
    let k = group.len().min(5);
    let (fold_of, method): (Box<dyn Fn(usize) -> String>, String) = if tables.len() >= 2 {
        (
            Box::new(|i| group[i].table.clone()),
            format!("leave one table out ({} tables, {} records)", tables.len(), group.len()),
        )
    } else {
        (
            Box::new(move |i| format!("part {}", i % k.max(1))),
            format!("leave one of {k} parts out (one table, {} records)", group.len()),
        )
    };
    let mut folds: Vec<String> = (0..group.len()).map(&fold_of).collect();
    folds.sort_unstable();
    folds.dedup();
    let mut out = Vec::new();
    for f in &folds {
        let train: Vec<&Sample> = (0..group.len()).filter(|i| fold_of(*i) != *f).map(|i| group[i]).collect();
        if train.is_empty() {
            continue;
        }
        let pred = Predictor::new(runtime, fit_with(runtime, &train, fitted, prior));
        for i in (0..group.len()).filter(|i| fold_of(*i) == *f) {
            if let Ok(p) = pred.predict_peak(&group[i].cfg) {
                out.push(HeldOut {
                    sample: i,
                    fold: f.clone(),
                    peak_gib: p.peak_gib(),
                    regime: Regime::of(p.peak_phase),
                });
            }
        }
    }
    (out, method)
}

/// Fit quality per group key of predictions made elsewhere (held out).
fn held_out_stats(group: &[&Sample], held: &[HeldOut], key: impl Fn(&HeldOut) -> String) -> BTreeMap<String, FitStats> {
    let mut errs: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut ooms: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for h in held {
        let s = group[h.sample];
        for k in [key(h), "all".to_string()] {
            if let Some(m) = s.measured_gib {
                errs.entry(k.clone()).or_default().push((h.peak_gib - m).abs() / m);
            }
            if s.oom {
                let e = ooms.entry(k).or_default();
                e.0 += 1;
                e.1 += usize::from(h.peak_gib <= s.available_gib * (1.0 - super::verdict::FRAGMENTATION_MARGIN));
            }
        }
    }
    let mut out = BTreeMap::new();
    for (k, v) in errs {
        let n = v.len();
        let (median, p90, max) = summarise(v);
        out.insert(k, FitStats { n, median, p90, max, ..Default::default() });
    }
    for (k, (n, bad)) in ooms {
        let e = out.entry(k).or_default();
        e.n_oom = n;
        e.oom_predicted_fit = bad;
    }
    out
}

/// The bands and coverage of a runtime from its held-out predictions.
pub fn uncertainty(group: &[&Sample], held: &[HeldOut], method: String) -> Uncertainty {
    let residuals: Vec<_> = held
        .iter()
        .filter_map(|h| {
            let s = group[h.sample];
            let m = s.measured_gib?;
            Some((s.cfg.model.family(), h.regime, (h.peak_gib - m).abs() / m))
        })
        .collect();
    Uncertainty::estimate(method, &residuals, group.iter().map(|s| &s.cfg))
}

/// How many of the records that ran the predictor would hold back (`risky`
/// or `oom` against the memory each run had; no budget).
pub fn held_back(pred: &Predictor, group: &[&Sample]) -> (usize, usize) {
    let mut ran = 0;
    let mut held = 0;
    for s in group.iter().filter(|s| s.measured_gib.is_some() && s.available_gib.is_finite()) {
        let Ok(p) = pred.predict_peak(&s.cfg) else { continue };
        ran += 1;
        let v = super::judge_held_out(
            p.peak_gib(),
            s.available_gib,
            None,
            p.rel_uncertainty,
            p.distance.as_ref(),
            p.family_error,
        );
        held += usize::from(!matches!(v, super::Verdict::Fits { .. }));
    }
    (held, ran)
}

/// The outcome of calibrating on a set of records.
pub struct Report {
    pub calibration: Calibration,
    /// Per runtime: fit quality per family.
    pub in_sample: BTreeMap<String, BTreeMap<String, FitStats>>,
    /// Per runtime: quality per family of records predicted by a fit without their table.
    pub cross_validated: BTreeMap<String, BTreeMap<String, FitStats>>,
    /// Per runtime and held-out table: quality on that table when fitted without it.
    pub leave_one_table_out: BTreeMap<String, BTreeMap<String, FitStats>>,
    /// Per runtime: (held back, ran) of the records that ran (see [`held_back`]).
    pub held_back: BTreeMap<String, (usize, usize)>,
}

/// Fit every runtime found in `samples`, each on its own records only. With
/// `cv`, also cross-validate (see [`cross_validate`]): the bands shipped with
/// the coefficients come from those held-out errors; without, from the
/// in-sample ones (and say so).
pub fn calibrate(samples: &[Sample], cv: bool) -> Report {
    let mut by_runtime: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        by_runtime.entry(s.runtime.as_str()).or_default().push(s);
    }
    let mut rep = Report {
        calibration: Calibration { note: String::new(), runtimes: BTreeMap::new(), uncertainty: BTreeMap::new() },
        in_sample: BTreeMap::new(),
        cross_validated: BTreeMap::new(),
        leave_one_table_out: BTreeMap::new(),
        held_back: BTreeMap::new(),
    };
    for (rt, group) in by_runtime {
        let mut c = fit(rt, &group, start_for(rt));
        let in_sample = predictions(&Predictor::new(rt, c), &group);
        let family = |h: &HeldOut| group[h.sample].family.clone();
        let st = held_out_stats(&group, &in_sample, family);
        c.rel_uncertainty = st.get("all").map(|s| s.p90).unwrap_or(0.15).max(0.05);
        rep.in_sample.insert(rt.to_string(), st);
        let (held, method) = if cv {
            let (held, method) = cross_validate(rt, &group, c, None);
            rep.cross_validated.insert(rt.to_string(), held_out_stats(&group, &held, family));
            rep.leave_one_table_out.insert(rt.to_string(), held_out_stats(&group, &held, |h| h.fold.clone()));
            (held, format!("cross-validated: {method}"))
        } else {
            (in_sample, format!("in-sample ({} records; not cross-validated)", group.len()))
        };
        let u = uncertainty(&group, &held, method);
        rep.held_back.insert(rt.to_string(), held_back(&Predictor::new(rt, c).with_uncertainty(u.clone()), &group));
        rep.calibration.uncertainty.insert(rt.to_string(), u);
        rep.calibration.runtimes.insert(rt.to_string(), c);
    }
    rep.calibration.note = format!(
        "Fitted by `orchestrator calibrate` on {} records; coefficients documented in orchestrator/src/precheck/mod.rs (Coefficients).",
        samples.len()
    );
    rep
}

#[cfg(test)]
mod tests {
    use super::*;

    use facts::record::read_jsonl;

    /// The demo sweep run by this project's worker on CPU under a 40 MiB
    /// memory limit (`--memory-limit`): three runs ran out of memory at the
    /// limit, three fitted (recorded output; see testdata/).
    const LIMITED: &str = include_str!("testdata/demo-cpu-40mib.jsonl");
    /// The same sweep without a limit: six runs measured.
    const FREE: &str = include_str!("testdata/demo-cpu.jsonl");

    fn records(text: &str) -> Vec<MeasurementRecord> {
        read_jsonl(text).expect("recorded measurements parse")
    }

    fn predicted_gib(cal: &Calibration, rt: &str, r: &MeasurementRecord) -> f64 {
        let c = cal.runtimes[rt];
        Predictor::new(rt, c).predict_peak(&r.run_config().unwrap()).unwrap().peak_gib()
    }

    #[test]
    fn a_cpu_oom_under_a_memory_limit_is_scored_against_the_limit() {
        let mut recs = records(LIMITED);
        recs.extend(records(FREE));
        let (samples, skipped) = samples(&recs);
        assert!(skipped.is_empty(), "{skipped:?}");
        let oom: Vec<&Sample> = samples.iter().filter(|s| s.oom).collect();
        assert_eq!(oom.len(), 3);
        assert!(oom.iter().all(|s| (s.available_gib - 40.0 / 1024.0).abs() < 1e-12), "the limit, not a GPU");
        let rep = calibrate(&samples, false);
        let rt = "burn-flex/fp32";
        // dit_p2 peaked at 38-42 MiB: it must stay there, not be pushed to a GPU's capacity.
        let dit_p2 = recs.iter().find(|r| r.config_name.as_deref() == Some("dit_p2")).unwrap();
        let p = predicted_gib(&rep.calibration, rt, dit_p2);
        assert!(p < 0.1, "dit_p2 predicted {p} GiB");
        // And the OOMs come out above the 40 MiB they did not fit in.
        for r in recs.iter().filter(|r| r.status == MeasuredStatus::Oom) {
            assert!(predicted_gib(&rep.calibration, rt, r) > 0.039, "{}", r.id);
        }
        assert_eq!(rep.in_sample[rt]["all"].oom_predicted_fit, 0);
    }

    #[test]
    fn an_oom_on_a_device_of_unknown_size_is_left_out_and_said_so() {
        // The same records as an older collector wrote them: `gpu: cpu`, no limit.
        let mut recs = records(LIMITED);
        for r in &mut recs {
            r.memory_limit_gb = None;
        }
        let (samples, skipped) = samples(&recs);
        assert_eq!((samples.len(), skipped.len()), (3, 3));
        assert!(
            skipped[0].contains("oom on `cpu` with neither a memory limit nor the device's memory"),
            "{}",
            skipped[0]
        );
        let rep = calibrate(&samples, false);
        for r in &recs {
            let p = predicted_gib(&rep.calibration, "burn-flex/fp32", r);
            assert!(p < 1.0, "{}: {p} GiB (an 80 GiB A100 would have been scored)", r.id);
        }
    }

    #[test]
    fn a_runtime_is_fitted_on_its_own_records_only() {
        let group =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../data/vram-measurements.jsonl")).unwrap();
        let alone =
            records(&group).into_iter().filter(|r| r.table.as_deref() == Some("unet_latent_8x")).collect::<Vec<_>>();
        let mut mixed = alone.clone();
        mixed.extend(records(LIMITED));
        let a = calibrate(&samples(&alone).0, false);
        let m = calibrate(&samples(&mixed).0, false);
        assert_eq!(a.calibration.runtimes["pytorch/bf16-amp"], m.calibration.runtimes["pytorch/bf16-amp"]);
        assert_eq!(m.calibration.runtimes.len(), 2);
    }

    #[test]
    fn percentiles_nearest_rank() {
        let (m, p90, max) = summarise(vec![0.05, 0.01, 0.02, 0.03, 0.04, 0.06, 0.07, 0.08, 0.09, 0.10]);
        assert_eq!((m, p90, max), (0.05, 0.09, 0.10));
    }
}
