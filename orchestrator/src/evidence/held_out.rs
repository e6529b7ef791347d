//! `orchestrator evidence --held-out`: how honest the precheck's bands are on
//! a table it was not fitted on, family by family.
//!
//! Each source table of the records in turn is treated as a new experiment,
//! as [`super::run`] treats it before its active sweep: the calibration
//! refitted, as `calibrate` fits the shipped one (bands cross-validated), on
//! every other table ([`super::savings`]' held-out fits), and every record of
//! the table predicted by it, band and distance as `plan` gives them. A
//! recorded peak is *inside* when it lies in `[p/(1+u), p/(1-u)]`; a recorded
//! OOM is judged against the memory its run had, and one called `fits` is
//! listed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use facts::record::MeasurementRecord;

use super::EvidenceError;
use crate::precheck::calibrate::{samples, summarise};
use crate::precheck::{judge_held_out, Predictor, Verdict};

/// One family's records, each predicted without its table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FamilyCoverage {
    pub family: String,
    /// |predicted − measured| / measured of each record with a peak.
    pub errors: Vec<f64>,
    /// Of those, how many lie inside the predicted interval.
    pub inside: usize,
    /// OOM records, and those called `fits` (id, predicted GiB, memory the run had).
    pub ooms: usize,
    pub oom_fits: Vec<(String, f64, f64)>,
}

impl FamilyCoverage {
    /// The share of recorded peaks inside their intervals (1 with none).
    pub fn share_inside(&self) -> f64 {
        if self.errors.is_empty() {
            1.0
        } else {
            self.inside as f64 / self.errors.len() as f64
        }
    }

    fn add(&mut self, o: &FamilyCoverage) {
        self.errors.extend(&o.errors);
        self.inside += o.inside;
        self.ooms += o.ooms;
        self.oom_fits.extend(o.oom_fits.iter().cloned());
    }
}

/// Every family of `records` (its tables with a name, not superseded), each
/// record judged by a calibration fitted without its table; the last entry is `all`.
pub fn run(records: &Path) -> Result<Vec<FamilyCoverage>, EvidenceError> {
    let all = super::standing_records(records)?;
    let tables: BTreeSet<Vec<String>> = all.iter().filter_map(|(_, r)| r.table.clone()).map(|t| vec![t]).collect();
    let cals = super::savings::held_out_calibrations(&all, tables);
    let mut by_family: BTreeMap<String, FamilyCoverage> = BTreeMap::new();
    let usable: Vec<MeasurementRecord> = all.into_iter().map(|(_, r)| r).filter(|r| r.table.is_some()).collect();
    // The records a calibration can use (valid configs, scorable OOMs), as `calibrate` takes them.
    let (usable, _) = samples(&usable);
    for s in &usable {
        let cal = &cals[&vec![s.table.clone()]];
        let (framework, precision) = (s.runtime.split('/').next().unwrap_or_default(), s.cfg.precision);
        let pred = Predictor::from_calibration(cal, framework, precision)
            .map_err(|e| EvidenceError::Replay(format!("record `{}`: {e}", s.id)))?;
        let Ok(p) = pred.predict_peak(&s.cfg) else { continue };
        let f = by_family
            .entry(s.family.clone())
            .or_insert_with(|| FamilyCoverage { family: s.family.clone(), ..FamilyCoverage::default() });
        let (gib, u) = (p.peak_gib(), p.rel_uncertainty.clamp(0.0, 1.0));
        match s.measured_gib {
            Some(m) => {
                f.errors.push((gib - m).abs() / m);
                let high = if u < 1.0 { gib / (1.0 - u) } else { f64::INFINITY };
                f.inside += usize::from(gib / (1.0 + u) <= m && m <= high);
            }
            None if s.oom => {
                f.ooms += 1;
                let v = judge_held_out(gib, s.available_gib, None, u, p.distance.as_ref(), p.family_error);
                if matches!(v, Verdict::Fits { .. }) {
                    f.oom_fits.push((s.id.clone(), gib, s.available_gib));
                }
            }
            None => {}
        }
    }
    let mut out: Vec<FamilyCoverage> = by_family.into_values().collect();
    let mut total = FamilyCoverage { family: "all".into(), ..FamilyCoverage::default() };
    out.iter().for_each(|f| total.add(f));
    out.push(total);
    Ok(out)
}

/// The table `evidence --held-out` prints, then each OOM called `fits`.
pub struct HeldOutTally<'a>(pub &'a [FamilyCoverage]);

impl std::fmt::Display for HeldOutTally<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "| family | peaks | error median | p90 | inside interval | OOMs | called `fits` |")?;
        writeln!(f, "|---|---:|---:|---:|---:|---:|---:|")?;
        for c in self.0 {
            let n = c.errors.len();
            let (median, p90, _) = summarise(c.errors.clone());
            let name = if c.family == "all" { "**all**".to_string() } else { c.family.clone() };
            writeln!(
                f,
                "| {name} | {n} | {:.1}% | {:.1}% | {:.0}% ({}/{n}) | {} | {} |",
                100.0 * median,
                100.0 * p90,
                100.0 * c.share_inside(),
                c.inside,
                c.ooms,
                c.oom_fits.len()
            )?;
        }
        for c in self.0.iter().filter(|c| c.family != "all") {
            for (id, gib, avail) in &c.oom_fits {
                writeln!(f, "- `{id}` ran out of memory; called `fits` at {gib:.1} GiB of {avail:.1}")?;
            }
        }
        Ok(())
    }
}
