//! A config's answer in an active sweep (measured, predicted, could not be
//! measured, invalid), how it is said, and what the sweep saved.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::precheck::{memory, RiskReason, VerdictKind};

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
        /// Why the verdict is `risky` (near the capacity, over the budget), if it is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<RiskReason>,
        /// Outside the calibration's coverage (why the band is wide), if so.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        distance: Option<String>,
        calibration: String,
        /// The verdict holds over the whole interval (it lies entirely on one
        /// side of the capacity, and of the budget), and the band is within
        /// the target unless the interval lies above the capacity, where a run
        /// could only say `oom`.
        settled: bool,
    },
    /// Submitted, and no measurement came back (the job or the worker
    /// failed): neither measured nor settled, and no run saved.
    Failed { cause: String },
    /// Submitted, and stopped by `orchestrator cancel` before it measured:
    /// not a failure, neither measured nor settled (`resume
    /// --retry-cancelled` runs it again).
    Cancelled,
    /// No prediction possible (an invalid config): never run, never settled.
    Invalid { reason: String },
}

impl Answer {
    pub fn is_settled(&self) -> bool {
        match self {
            Answer::Measured { .. } | Answer::Invalid { .. } => true,
            Answer::Predicted { settled, .. } => *settled,
            Answer::Failed { .. } | Answer::Cancelled => false,
        }
    }
    pub fn is_measured(&self) -> bool {
        matches!(self, Answer::Measured { .. })
    }
    pub fn is_failed(&self) -> bool {
        matches!(self, Answer::Failed { .. })
    }
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Answer::Cancelled)
    }
    /// A prediction that answers for its config without a run.
    pub fn is_settled_prediction(&self) -> bool {
        matches!(self, Answer::Predicted { settled: true, .. })
    }

    /// `fits, predicted 2.5G (2.3–2.8G)`: a prediction in words, the verdict
    /// first (`risky (near budget)`), then the peak and its interval.
    pub fn predicted_words(&self) -> Option<String> {
        let Answer::Predicted { peak_gib, low_gib, high_gib, band, verdict, reason, .. } = self else {
            return None;
        };
        let verdict = match reason {
            Some(r) => format!("{verdict} ({})", r.words()),
            None => verdict.to_string(),
        };
        Some(format!("{verdict}, predicted {}", peak_interval(*peak_gib, *low_gib, *high_gib, *band)))
    }
}

/// `2.5G (2.3–2.8G)`; `2.5G (±0.4%)` when the interval is narrower than the
/// digits shown; `2.5G (2.3G or more)` without an upper end.
pub fn peak_interval(peak_gib: f64, low_gib: f64, high_gib: f64, band: f64) -> String {
    format!("{} ({})", memory(peak_gib), interval_words(low_gib, high_gib, band))
}

/// `2.3–2.8G`, `±0.4%` (an interval narrower than the digits shown), `2.3G or more`.
pub fn interval_words(low_gib: f64, high_gib: f64, band: f64) -> String {
    let lo = memory(low_gib);
    if !high_gib.is_finite() {
        return format!("{lo} or more");
    }
    let hi = memory(high_gib);
    if lo == hi {
        return format!("±{}", percent(band));
    }
    format!("{}–{hi}", lo.trim_end_matches('G'))
}

/// `12%`, `0.4%`, `0.02%`: a share with the digits it needs.
fn percent(share: f64) -> String {
    let pct = share * 100.0;
    match pct {
        p if p >= 10.0 => format!("{p:.0}%"),
        p if p >= 1.0 => format!("{p:.1}%"),
        p if p >= 0.1 => format!("{p:.2}%"),
        p => format!("{p:.3}%"),
    }
}

/// The configs that could not be measured, grouped by cause (a cause's
/// first line, the config's own name and hash taken out): `(cause, names)`,
/// the most frequent cause first.
pub fn failures(answers: &BTreeMap<String, Answer>) -> Vec<(String, Vec<String>)> {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for (name, a) in answers {
        let Answer::Failed { cause } = a else { continue };
        let generic = generic_cause(cause, name);
        match groups.iter_mut().find(|(c, _)| *c == generic) {
            Some((_, names)) => names.push(name.clone()),
            None => groups.push((generic, vec![name.clone()])),
        }
    }
    groups.sort_by_key(|g| std::cmp::Reverse(g.1.len()));
    groups
}

/// A cause's first line with the config's name and any 12-digit hash
/// replaced, so that configs failing alike group together.
fn generic_cause(cause: &str, name: &str) -> String {
    let first = cause.lines().next().unwrap_or("").trim();
    let first = replace_whole(first, name, "<config>");
    let mut out = String::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let hash = word.len() == 12 && word.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase());
        out.push_str(if hash { "<hash>" } else { word.as_str() });
        word.clear();
    };
    for ch in first.chars() {
        if ch.is_ascii_alphanumeric() || ch == '_' {
            word.push(ch);
        } else {
            flush(&mut word, &mut out);
            out.push(ch);
        }
    }
    flush(&mut word, &mut out);
    if out.is_empty() {
        "no cause recorded".into()
    } else {
        out
    }
}

/// `text` with each occurrence of `word` that no letter, digit or `_`
/// touches replaced by `by`.
fn replace_whole(text: &str, word: &str, by: &str) -> String {
    let is_word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    if word.is_empty() {
        return text.to_string();
    }
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(word) {
        let (before, after) = (rest[..i].chars().next_back(), rest[i + word.len()..].chars().next());
        let whole = !is_word(before) && !is_word(after);
        out.push_str(&rest[..i]);
        out.push_str(if whole { by } else { word });
        rest = &rest[i + word.len()..];
    }
    out.push_str(rest);
    out
}

/// `N configs could not be measured:` and a line per cause, or nothing.
pub fn failures_text(answers: &BTreeMap<String, Answer>) -> String {
    let groups = failures(answers);
    let n: usize = groups.iter().map(|(_, names)| names.len()).sum();
    if n == 0 {
        return String::new();
    }
    let mut s = format!("{} could not be measured:\n", configs(n));
    for (cause, names) in &groups {
        let said = match names.as_slice() {
            [one] => answers.get(one).map_or_else(|| cause.clone(), |a| own_cause(a, cause)),
            _ => for_several(cause),
        };
        s += &format!("  {} ({}): {said}\n", configs(names.len()), some_names(names));
    }
    s
}

/// A lone config's cause as it came (the first line, its name and hash in it).
fn own_cause(a: &Answer, generic: &str) -> String {
    match a {
        Answer::Failed { cause } => cause.lines().next().unwrap_or(generic).trim().to_string(),
        _ => generic.to_string(),
    }
}

/// A cause shared by several configs, the placeholders of their names and
/// hashes worded: `has no record of config <config> (hash <hash>)` becomes
/// `has no record of these configs`.
fn for_several(generic: &str) -> String {
    generic
        .replace(" (hash <hash>)", "")
        .replace("config <config>", "these configs")
        .replace("<config>", "each config")
        .replace("<hash>", "its hash")
}

/// `2 configs were stopped by `cancel` before they measured (a, b)` and a
/// newline, or nothing.
pub fn cancelled_text(answers: &BTreeMap<String, Answer>) -> String {
    let names: Vec<String> = answers.iter().filter(|(_, a)| a.is_cancelled()).map(|(n, _)| n.clone()).collect();
    match names.len() {
        0 => String::new(),
        1 => format!("1 config was stopped by `cancel` before it measured ({})\n", names[0]),
        n => format!("{n} configs were stopped by `cancel` before they measured ({})\n", some_names(&names)),
    }
}

/// `a, b, c and 4 more`.
fn some_names(names: &[String]) -> String {
    const SHOWN: usize = 3;
    if names.len() <= SHOWN + 1 {
        return names.join(", ");
    }
    format!("{} and {} more", names[..SHOWN].join(", "), names.len() - SHOWN)
}

/// `1 config`, `3 configs`.
pub fn configs(n: usize) -> String {
    plural(n, "config", "configs")
}

/// `1 round`, `2 rounds`, and so on for any noun.
pub fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// What an active sweep saved: runs not spent (configs its settled
/// predictions answer, never submitted), and GPU time at the sweep's
/// measured seconds per run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Savings {
    pub configs: usize,
    pub measured: usize,
    /// Predicted without a run, settled or not.
    pub predicted: usize,
    /// Of those, the predictions that settle their config.
    #[serde(default)]
    pub settled: usize,
    /// Submitted without a measurement coming back.
    #[serde(default)]
    pub failed: usize,
    /// Submitted, and stopped by `cancel` before they measured.
    #[serde(default)]
    pub cancelled: usize,
    /// Settled predictions of configs never submitted.
    pub runs_saved: usize,
    /// Mean wall seconds of the measured runs (`None`: none measured a time).
    pub seconds_per_run: Option<f64>,
    pub gpu_seconds_saved: Option<f64>,
}

impl Savings {
    pub fn of(answers: &BTreeMap<String, Answer>, run_seconds: &[f64]) -> Savings {
        let count = |f: fn(&Answer) -> bool| answers.values().filter(|a| f(a)).count();
        let predicted = count(|a| matches!(a, Answer::Predicted { .. }));
        let settled = count(Answer::is_settled_prediction);
        let timed: Vec<f64> = run_seconds.iter().copied().filter(|s| *s > 0.0).collect();
        let seconds_per_run = (!timed.is_empty()).then(|| timed.iter().sum::<f64>() / timed.len() as f64);
        Savings {
            configs: answers.len(),
            measured: count(Answer::is_measured),
            predicted,
            settled,
            failed: count(Answer::is_failed),
            cancelled: count(Answer::is_cancelled),
            runs_saved: settled,
            seconds_per_run,
            gpu_seconds_saved: seconds_per_run.map(|s| s * settled as f64),
        }
    }

    /// `12 configs: 2 measured, 10 predicted (8 settled), 1 could not be
    /// measured; 8 runs saved`.
    pub fn counts(&self) -> String {
        let mut parts = vec![format!("{} measured", self.measured)];
        let settled = match self.settled {
            s if s == self.predicted => String::new(),
            s => format!(" ({s} settled)"),
        };
        parts.push(format!("{} predicted without a run{settled}", self.predicted));
        if self.failed > 0 {
            parts.push(format!("{} could not be measured", self.failed));
        }
        if self.cancelled > 0 {
            parts.push(format!("{} stopped by `cancel`", self.cancelled));
        }
        format!("{}: {}; {} saved", configs(self.configs), parts.join(", "), plural(self.runs_saved, "run", "runs"))
    }
}
