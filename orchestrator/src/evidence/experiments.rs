//! `orchestrator evidence --experiments PATH...`: what a user's `submit
//! FILE --active --cluster replay` does on each experiment file, scored
//! against the records it replays.
//!
//! Each experiment runs the active loop of `submit --active`
//! ([`crate::submit::active`]) in a scratch state directory, on a replay
//! cluster of the records file (with the default file, the built-in
//! `replay`): rounds rendered, submitted as job arrays, polled and collected
//! as a user's are. Then, per experiment: its configs (valid, each model
//! once); those with a record (a record the replay answers with: the same
//! model and input on the same GPU, fields the record does not give matched
//! as the config's); how many were measured and predicted; how many runs
//! failed; the predicted verdicts a record contradicts (`fits` recorded
//! `oom`, `oom` recorded a peak); and how many recorded peaks of the
//! predicted configs lie inside their intervals.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use facts::event::RunStatus;
use facts::record::{MeasuredStatus, Unstated};

use super::EvidenceError;
use crate::active::{Answer, Settings};
use crate::precheck::VerdictKind;
use crate::state::View;
use crate::submit::{self, Options, Watch};
use crate::sweep::Sweep;
use crate::transport::replay::Records;

/// One experiment's active sweep on the replay cluster, scored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExperimentRun {
    pub experiment: String,
    /// Valid configs, each model once (what the loop answers).
    pub configs: usize,
    /// Of those, the ones the records answer.
    pub with_record: usize,
    pub measured: usize,
    pub predicted: usize,
    /// Runs the replay could not answer (a config without a record).
    pub failed: usize,
    /// Configs with a record whose run failed all the same (none should).
    pub unanswered: Vec<String>,
    /// Predicted verdicts a record contradicts, one line each.
    pub wrong: Vec<String>,
    /// Predicted configs with a recorded peak, and how many of those peaks
    /// lie inside the predicted interval.
    pub scored: usize,
    pub inside: usize,
    /// Fields some matching record does not give (matched as the config's).
    pub assumed: BTreeSet<Unstated>,
}

/// The experiment files of `paths`: each a file, or a directory's `*.yaml`,
/// all in natural order of their names (`exp9` before `exp10`), each once.
pub fn files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, EvidenceError> {
    let mut out = Vec::new();
    for p in paths {
        if !p.is_dir() {
            out.push(p.clone());
            continue;
        }
        let rd = std::fs::read_dir(p).map_err(|e| EvidenceError::Replay(format!("{}: {e}", p.display())))?;
        out.extend(
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "yaml" || x == "yml")),
        );
    }
    out.sort_by_key(|f| (natural(&f.file_stem().unwrap_or_default().to_string_lossy()), f.clone()));
    out.dedup();
    Ok(out)
}

/// A name as (text, number) runs, so that numbers sort by value.
fn natural(name: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut rest = name;
    while !rest.is_empty() {
        let text_end = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let (text, tail) = rest.split_at(text_end);
        let num_end = tail.find(|c: char| !c.is_ascii_digit()).unwrap_or(tail.len());
        let (num, tail) = tail.split_at(num_end);
        out.push((text.to_string(), num.parse().unwrap_or(0)));
        rest = tail;
    }
    out
}

/// Runs every experiment of `paths` as `submit --active --cluster replay`
/// would, answering from `records`, in scratch state under `work`.
pub fn run(
    paths: &[PathBuf],
    records: &Path,
    settings: &Settings,
    work: &Path,
) -> Result<Vec<ExperimentRun>, EvidenceError> {
    let recs = Records::load(records)?;
    let clusters = work.join("clusters.yaml");
    let abs = std::path::absolute(records).map_err(|e| EvidenceError::Replay(format!("{}: {e}", records.display())))?;
    let file = serde_json::json!({"clusters": {"replay": {"transport": "replay", "records": abs}}});
    std::fs::write(&clusters, serde_json::to_string(&file).unwrap_or_default())
        .map_err(|e| EvidenceError::Replay(format!("{}: {e}", clusters.display())))?;
    let mut out = Vec::new();
    for path in files(paths)? {
        let sweep = crate::sweep::load(&path, &[]).map_err(|e| EvidenceError::Replay(format!("{e}")))?;
        let opts = Options {
            state_root: work.join("state"),
            clusters_file: Some(clusters.clone()),
            cluster: Some("replay".into()),
            ..Options::default()
        };
        let settings = Settings { runtime: sweep.experiment.runtime.clone(), ..settings.clone() };
        out.push(one(&sweep, &opts, &settings, &recs)?);
    }
    Ok(out)
}

/// One experiment: its active loop on the replay, then its score.
fn one(sweep: &Sweep, opts: &Options, settings: &Settings, recs: &Records) -> Result<ExperimentRun, EvidenceError> {
    let name = sweep.experiment.name.clone();
    let fail = |e: &dyn std::fmt::Display| EvidenceError::Replay(format!("{name}: {e}"));
    let watch = Watch { min: Duration::from_millis(5), max: Duration::from_millis(50), max_polls: None };
    let report = crate::target::block_on(submit::active::run(sweep, opts, settings, watch, &mut |_| {}))
        .map_err(|e| fail(&e))?
        .map_err(|e| fail(&e))?;
    let view = View::new(&opts.state_root, &name).map_err(|e| fail(&e))?;
    let states = view.records().map_err(|e| fail(&e))?;
    let failed_run = |hash: &str| states.get(hash).is_some_and(|r| r.result_status() == Some(RunStatus::Failed));
    let failed = states.keys().filter(|h| failed_run(h)).count();
    let mut run = ExperimentRun { experiment: name, failed, ..ExperimentRun::default() };
    let mut seen = BTreeSet::new();
    for c in sweep.configs.iter().filter(|c| c.is_valid() && seen.insert(c.hash.clone())) {
        run.configs += 1;
        let answer = report.answers.get(&c.name);
        run.measured += usize::from(answer.is_some_and(Answer::is_measured));
        let Ok(found) = recs.find(&c.config) else {
            run.predicted += usize::from(matches!(answer, Some(Answer::Predicted { .. })));
            continue;
        };
        run.with_record += 1;
        run.assumed.extend(found.assumed.iter().copied());
        if failed_run(&c.hash) {
            run.unanswered.push(format!("{}/{}", run.experiment, c.name));
        }
        let Some(Answer::Predicted { peak_gib: _, low_gib, high_gib, verdict, .. }) = answer else { continue };
        run.predicted += 1;
        let r = found.record;
        let oom = r.status == MeasuredStatus::Oom;
        match verdict {
            VerdictKind::Fits if oom => run.wrong.push(format!("{}: predicted fits, recorded oom", c.name)),
            VerdictKind::Oom if !oom => run.wrong.push(format!("{}: predicted oom, recorded a peak", c.name)),
            _ => {}
        }
        if let (false, Some(m)) = (oom, r.peak_gb) {
            run.scored += 1;
            run.inside += usize::from(*low_gib <= m && m <= *high_gib);
        }
    }
    Ok(run)
}

/// The table `evidence --experiments` prints: one row per experiment and the total.
pub struct ExperimentTally<'a>(pub &'a [ExperimentRun]);

impl std::fmt::Display for ExperimentTally<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "| experiment | configs | with a record | measured | predicted | failed runs | wrong verdicts | recorded peaks inside interval | matched without |")?;
        writeln!(f, "|---|---:|---:|---:|---:|---:|---:|---:|---|")?;
        let mut all = ExperimentRun { experiment: "**all**".into(), ..ExperimentRun::default() };
        for r in self.0 {
            row(f, r)?;
            all.configs += r.configs;
            all.with_record += r.with_record;
            all.measured += r.measured;
            all.predicted += r.predicted;
            all.failed += r.failed;
            all.wrong.extend(r.wrong.iter().cloned());
            all.unanswered.extend(r.unanswered.iter().cloned());
            all.scored += r.scored;
            all.inside += r.inside;
            all.assumed.extend(r.assumed.iter().copied());
        }
        row(f, &all)?;
        for w in &all.wrong {
            writeln!(f, "wrong: {w}")?;
        }
        for u in &all.unanswered {
            writeln!(f, "not answered though recorded: {u}")?;
        }
        Ok(())
    }
}

fn row(f: &mut std::fmt::Formatter<'_>, r: &ExperimentRun) -> std::fmt::Result {
    let inside = match r.scored {
        0 => "- (0/0)".to_string(),
        n => format!("{:.0}% ({}/{n})", 100.0 * r.inside as f64 / n as f64, r.inside),
    };
    let assumed: Vec<&str> = r.assumed.iter().map(|u| u.field()).collect();
    let assumed = if assumed.is_empty() { "-".to_string() } else { assumed.join(", ") };
    writeln!(
        f,
        "| {} | {} | {} | {} | {} | {} | {} | {inside} | {assumed} |",
        r.experiment,
        r.configs,
        r.with_record,
        r.measured,
        r.predicted,
        r.failed,
        r.wrong.len()
    )
}
