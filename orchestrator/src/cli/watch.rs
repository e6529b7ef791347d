//! What `status --watch` prints as a sweep moves. In a terminal: a progress
//! bar with the running configs' phase and peak, and a line above it for
//! every config that starts or ends (a failure with its cause, when it
//! happens). Piped: the table once, then only what changed, then the table
//! again when every config has ended; `--json`: every row once, then the rows
//! that changed.

use std::collections::BTreeMap;

use crate::precheck::memory;
use crate::progress::{SweepProgress, WatchBar};
use crate::submit::{StatusReport, StatusRow};

/// Running configs named beside the bar; more are counted.
const RUNNING_SHOWN: usize = 3;

pub struct Printer {
    json: bool,
    bar: Option<WatchBar>,
    /// Each config's row as last shown, by hash.
    last: Option<BTreeMap<facts::run::ConfigHash, StatusRow>>,
}

impl Printer {
    /// `bar`: the terminal's bar, or `None` when stderr is not a terminal.
    pub fn new(json: bool, bar: Option<WatchBar>) -> Printer {
        Printer { json, bar: bar.filter(|b| !b.bar.is_hidden()), last: None }
    }

    /// One poll's report, and the sweep's progress line.
    pub fn show(&mut self, r: &StatusReport, progress: Option<&SweepProgress>) {
        let last = self.last.replace(r.rows.iter().map(|row| (row.hash.clone(), row.clone())).collect());
        if self.json {
            for row in r.rows.iter().filter(|row| last.as_ref().is_none_or(|l| l.get(&row.hash) != Some(*row))) {
                println!("{}", serde_json::to_string(row).unwrap_or_default());
            }
            return;
        }
        let moves: Vec<String> = match &last {
            None => vec![],
            Some(l) => r.rows.iter().filter_map(|row| transition(l.get(&row.hash), row)).collect(),
        };
        match &self.bar {
            Some(bar) => {
                for m in &moves {
                    bar.bar.println(m);
                }
                if let Some(p) = progress {
                    p.show_on(bar, &running(&r.rows));
                }
                if r.settled {
                    bar.bar.finish_and_clear();
                    print_all(r, progress);
                }
            }
            None if last.is_none() || r.settled => print_all(r, progress),
            None => {
                for m in &moves {
                    println!("{m}");
                }
            }
        }
    }
}

fn print_all(r: &StatusReport, progress: Option<&SweepProgress>) {
    print!("{}", r.table());
    if let Some(p) = progress {
        println!("{}", p.line());
    }
}

/// `unet_2L  RUNNING -> COMPLETED  ok 0.080G`, and for a failure its cause's
/// first line; `None` when the config's state and result did not change.
fn transition(before: Option<&StatusRow>, now: &StatusRow) -> Option<String> {
    let was = before.map_or("-", |b| b.state.as_str());
    if before.is_some_and(|b| b.state == now.state && b.result == now.result) {
        return None;
    }
    let mut line = format!("{:<28} {was} -> {}", now.name, now.state);
    match (&now.result, now.peak_gib) {
        (Some(res), Some(p)) => line += &format!("  {res} {}", memory(p)),
        (Some(res), None) => line += &format!("  {res}"),
        (None, _) => {}
    }
    if let Some(cause) = now.cause.as_deref().and_then(|c| c.lines().next()) {
        line += &format!("  why: {cause}");
    }
    Some(line)
}

/// `: unet_2L fwd 0.050G, dit_p4 bwd 0.0031G, +2 more` (empty when none runs).
fn running(rows: &[StatusRow]) -> String {
    let live: Vec<String> = rows
        .iter()
        .filter(|r| r.state == "RUNNING")
        .map(|r| match (&r.phase, r.peak_gib) {
            (Some(ph), Some(p)) => format!("{} {ph} {}", r.name, memory(p)),
            (Some(ph), None) => format!("{} {ph}", r.name),
            _ => r.name.clone(),
        })
        .collect();
    if live.is_empty() {
        return String::new();
    }
    let more = live.len().saturating_sub(RUNNING_SHOWN);
    let mut s = format!(": {}", live[..live.len().min(RUNNING_SHOWN)].join(", "));
    if more > 0 {
        s += &format!(", +{more} more");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, state: &str, result: Option<&str>, phase: Option<&str>, peak: Option<f64>) -> StatusRow {
        StatusRow {
            name: name.into(),
            hash: format!("h-{name}").as_str().into(),
            verdict: "fits".into(),
            predicted_gib: Some(0.1),
            state: state.into(),
            job: None,
            attempts: 1,
            result: result.map(String::from),
            peak_gib: peak,
            phase: phase.map(String::from),
            cause: None,
            note: None,
            answer: None,
            chain: None,
        }
    }

    #[test]
    fn a_change_is_one_line_and_a_failure_says_why() {
        let before = row("unet_2L", "RUNNING", None, Some("fwd"), Some(0.05));
        let mut peak_only = before.clone();
        peak_only.peak_gib = Some(0.06);
        assert_eq!(transition(Some(&before), &peak_only), None, "a new peak is the bar's, not a line");
        let done = row("unet_2L", "COMPLETED", Some("ok"), None, Some(0.08));
        assert_eq!(
            transition(Some(&before), &done).unwrap(),
            format!("{:<28} RUNNING -> COMPLETED  ok 0.080G", "unet_2L")
        );
        let mut failed = row("dit_p2", "FAILED", None, None, None);
        failed.cause = Some("worker: error while loading shared libraries (exit code 127:0)\nlog: x".into());
        let line = transition(Some(&row("dit_p2", "RUNNING", None, None, None)), &failed).unwrap();
        assert!(
            line.ends_with("RUNNING -> FAILED  why: worker: error while loading shared libraries (exit code 127:0)"),
            "{line}"
        );
    }

    #[test]
    fn the_bar_names_the_running_configs_with_phase_and_peak() {
        let rows = vec![
            row("a", "RUNNING", None, Some("fwd"), Some(0.05)),
            row("b", "COMPLETED", Some("ok"), None, Some(0.08)),
            row("c", "RUNNING", None, Some("bwd"), Some(1.5)),
            row("d", "RUNNING", None, None, None),
            row("e", "RUNNING", None, Some("model"), Some(0.001)),
        ];
        assert_eq!(running(&rows), ": a fwd 0.050G, c bwd 1.5G, d, +1 more");
        assert_eq!(running(&rows[1..2]), "");
    }
}
