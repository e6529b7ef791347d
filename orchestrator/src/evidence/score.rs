//! How right an active sweep's answers were, against the records.

use std::collections::BTreeMap;

use facts::record::{MeasuredStatus, MeasurementRecord};

use crate::active::Answer;
use crate::precheck::calibrate::summarise;
use crate::precheck::VerdictKind;

/// One table's (or all tables') figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Score {
    pub configs: usize,
    pub measured: usize,
    /// Predicted `fits` but recorded OOM, or predicted `oom` but recorded a peak.
    pub wrong: Vec<String>,
    /// Predicted but left `risky` (the budget ran out first).
    pub undecided: usize,
    /// |predicted − measured| / measured of each unmeasured config with a recorded peak.
    pub errors: Vec<f64>,
    /// Of those, how many recorded peaks lie inside the predicted interval.
    pub inside: usize,
}

impl Score {
    pub fn of(answers: &BTreeMap<String, Answer>, truth: &BTreeMap<String, MeasurementRecord>) -> Score {
        let mut s = Score { configs: answers.len(), ..Score::default() };
        for (k, a) in answers {
            let Some(r) = truth.get(k) else { continue };
            let Answer::Predicted { peak_gib, low_gib, high_gib, verdict, .. } = a else {
                s.measured += usize::from(a.is_measured());
                continue;
            };
            let oom = r.status == MeasuredStatus::Oom;
            match verdict {
                VerdictKind::Fits if oom => s.wrong.push(format!("{k}: predicted fits, recorded oom")),
                VerdictKind::Oom if !oom => s.wrong.push(format!("{k}: predicted oom, recorded a peak")),
                VerdictKind::Risky => s.undecided += 1,
                _ => {}
            }
            if let (false, Some(m)) = (oom, r.peak_gb) {
                s.errors.push((peak_gib - m).abs() / m);
                s.inside += usize::from(*low_gib <= m && m <= *high_gib);
            }
        }
        s
    }

    pub fn add(&mut self, o: &Score) {
        self.configs += o.configs;
        self.measured += o.measured;
        self.wrong.extend(o.wrong.iter().cloned());
        self.undecided += o.undecided;
        self.errors.extend(o.errors.iter().copied());
        self.inside += o.inside;
    }
}

/// The table `evidence` prints: one row per table and the total.
pub struct Tally<'a>(pub &'a [super::TableRun]);

impl std::fmt::Display for Tally<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "| table | configs | measured | rounds | wrong verdicts | undecided | unmeasured error median | p90 | inside interval |")?;
        writeln!(f, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")?;
        let mut all = Score::default();
        let rounds: usize = self.0.iter().map(|t| t.rounds).sum();
        for t in self.0 {
            row(f, &t.table, &t.score, &t.rounds.to_string())?;
            all.add(&t.score);
        }
        row(f, "**all**", &all, &rounds.to_string())?;
        for w in &all.wrong {
            writeln!(f, "wrong: {w}")?;
        }
        Ok(())
    }
}

fn row(f: &mut std::fmt::Formatter<'_>, name: &str, s: &Score, rounds: &str) -> std::fmt::Result {
    let (median, p90, _) = summarise(s.errors.clone());
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    let share =
        |a: usize, n: usize| if n == 0 { "-".to_string() } else { format!("{:.0}%", 100.0 * a as f64 / n as f64) };
    let n = s.errors.len();
    writeln!(
        f,
        "| {name} | {} | {} ({}) | {rounds} | {} | {} | {} | {} | {} ({}/{n}) |",
        s.configs,
        s.measured,
        share(s.measured, s.configs),
        s.wrong.len(),
        s.undecided,
        if n == 0 { "-".into() } else { pct(median) },
        if n == 0 { "-".into() } else { pct(p90) },
        share(s.inside, n),
        s.inside,
    )
}
