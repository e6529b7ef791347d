//! Which configs one round measures, and when the loop stops.
//!
//! In order of what a measurement is worth:
//!
//! 1. an *anchor* for each family and regime (activation- or optimizer-bound
//!    peak) the sweep touches and has not measured: its largest config the
//!    band does not call out of memory (the one that extends coverage most);
//! 2. configs the band does not settle: capacity (or budget) inside the
//!    interval (`risky`), nearest it first;
//! 3. configs outside the calibration's coverage, or whose band is wider than
//!    the target, widest first, one per family and regime a round (a
//!    measurement refits the whole group).

use std::collections::{BTreeMap, BTreeSet};

use facts::RunConfig;

use super::{Answer, Group, Refit, Settings};
use crate::precheck::{RiskReason, VerdictKind};

/// Why the loop stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// Every config is measured or settled by its prediction.
    Settled,
    /// Nothing left worth measuring, but some configs could not be measured.
    Unmeasured,
    /// The run budget is spent.
    Budget,
    /// Every run of the last round failed: a worker that measures nothing is
    /// not asked again (until the loop is run again).
    RoundFailed,
    /// `orchestrator cancel` stopped runs of the last round: no further round
    /// is submitted (until the loop is run again).
    Cancelled,
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stop::Settled => "every config is measured or settled by its prediction",
            Stop::Unmeasured => "every other config is measured or settled by its prediction",
            Stop::Budget => "the run budget is spent",
            Stop::RoundFailed => "every run of the last round failed, so no further round was submitted",
            Stop::Cancelled => "`cancel` stopped the last round's runs, so no further round was submitted",
        })
    }
}

/// Whether every config of the last round (`last`, keys) was submitted and
/// measured nothing: the loop stops there rather than ask again a worker or
/// a cluster that fails every config.
pub fn round_failed(last: &[String], answers: &BTreeMap<String, Answer>) -> bool {
    !last.is_empty() && last.iter().all(|k| answers.get(k).is_some_and(Answer::is_failed))
}

/// The next round, or why there is none.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    Measure(Vec<String>),
    Done(Stop),
}

/// The next round's configs (keys), given every config's current answer.
/// `spent`: runs already made (or in flight) by this sweep; `tried`: configs
/// submitted before, never chosen again. Only predictions are chosen, never
/// one that is settled: a config that could not be measured
/// ([`Answer::Failed`]) is not asked again.
pub fn choose(
    configs: &[(String, RunConfig)],
    answers: &BTreeMap<String, Answer>,
    refit: &Refit,
    settings: &Settings,
    spent: usize,
    tried: &BTreeSet<String>,
) -> Choice {
    let open: Vec<&(String, RunConfig)> = configs
        .iter()
        .filter(|(k, _)| !tried.contains(k) && matches!(answers.get(k), Some(Answer::Predicted { settled: false, .. })))
        .collect();
    if open.is_empty() {
        let unmeasured = answers.values().any(Answer::is_failed);
        return Choice::Done(if unmeasured { Stop::Unmeasured } else { Stop::Settled });
    }
    let left = settings.max_runs.map_or(usize::MAX, |m| m.saturating_sub(spent));
    if left == 0 {
        return Choice::Done(Stop::Budget);
    }
    let size = settings.round_size.unwrap_or((configs.len() / 10).max(2)).min(left).max(1);
    let groups: BTreeMap<&str, Group> = configs.iter().map(|(k, c)| (k.as_str(), refit.group(c))).collect();
    let mut chosen: Vec<String> = Vec::new();
    let push = |k: &str, chosen: &mut Vec<String>| {
        if chosen.len() < size && !chosen.iter().any(|c| c == k) {
            chosen.push(k.to_string());
        }
    };
    // 1. Anchors.
    let anchors = anchors(&open, answers, &groups);
    for k in anchors {
        push(k, &mut chosen);
    }
    // 2. Verdicts the band does not settle, nearest the capacity first.
    let mut risky: Vec<(f64, &str)> = open
        .iter()
        .filter_map(|(k, c)| match answers.get(k) {
            Some(Answer::Predicted { peak_gib, verdict: VerdictKind::Risky, reason, .. }) => {
                let limit = match (reason, refit.budget_gib()) {
                    (Some(RiskReason::NearBudget | RiskReason::OverBudget), Some(b)) => b,
                    _ => refit.capacity_gib(c),
                };
                Some(((peak_gib / limit).ln().abs(), k.as_str()))
            }
            _ => None,
        })
        .collect();
    risky.sort_by(|a, b| a.0.total_cmp(&b.0));
    // 3. Bands too wide (outside coverage widest), one per group a round.
    let mut wide: Vec<(f64, &str)> = open
        .iter()
        .filter_map(|(k, _)| match answers.get(k) {
            Some(Answer::Predicted { band, verdict, .. }) if *verdict != VerdictKind::Risky => {
                Some((*band, k.as_str()))
            }
            _ => None,
        })
        .collect();
    wide.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (_, k) in &risky {
        push(k, &mut chosen);
    }
    let mut used: BTreeSet<&Group> = chosen.iter().filter_map(|k| groups.get(k.as_str())).collect();
    for (_, k) in &wide {
        if used.insert(&groups[k]) {
            push(k, &mut chosen);
        }
    }
    if chosen.is_empty() {
        // Every open config is in a group already chosen this round: take the widest.
        if let Some((_, k)) = wide.first() {
            chosen.push(k.to_string());
        }
    }
    Choice::Measure(chosen)
}

/// Per family and regime with no measured config: its open config with the
/// largest predicted peak that the band does not call out of memory.
fn anchors<'a>(
    open: &[&'a (String, RunConfig)],
    answers: &BTreeMap<String, Answer>,
    groups: &BTreeMap<&str, Group>,
) -> Vec<&'a str> {
    let measured: BTreeSet<&Group> =
        answers.iter().filter(|(_, a)| a.is_measured()).filter_map(|(k, _)| groups.get(k.as_str())).collect();
    let mut best: BTreeMap<&Group, (f64, &'a str)> = BTreeMap::new();
    for (k, _) in open {
        let (g, Some(Answer::Predicted { peak_gib, verdict, .. })) = (&groups[k.as_str()], answers.get(k)) else {
            continue;
        };
        if measured.contains(g) || *verdict == VerdictKind::Oom {
            continue;
        }
        let e = best.entry(g).or_insert((f64::MIN, k.as_str()));
        if *peak_gib > e.0 {
            *e = (*peak_gib, k.as_str());
        }
    }
    best.into_values().map(|(_, k)| k).collect()
}
