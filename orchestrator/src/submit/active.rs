//! `submit --active`: the active loop ([`crate::active`]) on a cluster.
//!
//! Each round waits for what is in flight (a `status --watch`: poll and
//! collect), reads what the sweep has measured (`measurements.jsonl`) and
//! tried (the configs' attempts), refits, judges every config, records the
//! round in the journal ([`Change::ActiveRound`]) and submits the chosen
//! configs as one array (`submit` limited to them, so the submission protocol
//! and its guarantees hold: no config is submitted twice). Everything the loop
//! knows is in the state directory, so a loop killed at any point resumes
//! where it stopped when run again.
//!
//! A config submitted that measured nothing *could not be measured*: it is
//! neither settled nor saved, and the loop stops after a round whose every
//! run failed (the causes grouped in its answer). Run again, the loop tries
//! one new round before it stops again on failures. On a `replay` cluster the
//! loop chooses among the configs its records hold first: one without a
//! record cannot be measured there, and a round of those would end the loop
//! before it measured what it could.
//!
//! Ctrl-C ([`Interrupt`]) stops the loop: in any phase of a round (waiting,
//! collecting, choosing, submitting) the step in flight finishes (a poll is
//! applied, a round's submission completes: the state stays whole) and no
//! new round is chosen; the loop ends [`Ended::Interrupted`], with what is
//! still running.

use facts::run::ConfigHash;
use std::collections::{BTreeMap, BTreeSet};

use facts::record::MeasurementRecord;
use facts::RunConfig;

use super::judge::{cluster_name, where_it_runs};
use super::{status_until, submit, CommandError, Interrupt, Options, Watch};
use crate::active::{self, ActiveReport, Answer, Choice, Refit, Savings, Settings, Stop};
use crate::cluster::{ClustersFile, TransportKind};
use crate::precheck::Calibration;
use crate::state::{Change, ConfigRecord, StateDir, View};
use crate::sweep::Sweep;
use crate::transport::replay::Records;

/// What the state directory says: measured records by hash, configs
/// submitted that measured nothing (hash: why), hashes tried, rounds
/// recorded (and the last one's configs), and the measured runs' seconds.
struct Known {
    measured: BTreeMap<String, MeasurementRecord>,
    failed: BTreeMap<String, String>,
    /// Of `failed`, the configs `orchestrator cancel` stopped.
    cancelled: BTreeSet<String>,
    tried: BTreeSet<String>,
    rounds: u32,
    last_round: Vec<String>,
    seconds: Vec<f64>,
}

fn known(opts: &Options, experiment: &str) -> Result<Known, CommandError> {
    let st = StateDir::open(&opts.state_root, experiment, opts.lock_wait)?;
    let mut measured = BTreeMap::new();
    // A run made before one model had one hash is recorded under the hash it was written with.
    let now: BTreeMap<&str, &str> =
        st.records().values().flat_map(|c| c.former_hashes().map(move |h| (h, c.hash().as_str()))).collect();
    for r in st.view().measurements()? {
        if let Some((_, hash)) = r.id.rsplit_once('@') {
            measured.insert(now.get(hash).copied().unwrap_or(hash).to_string(), r);
        }
    }
    let records = st.records().values();
    let submitted = |r: &&ConfigRecord| r.attempts().iter().any(|a| !a.abandoned());
    let tried: BTreeSet<String> = records.clone().filter(submitted).map(|r| r.hash().to_string()).collect();
    let failed: BTreeMap<String, String> = records
        .clone()
        .filter(submitted)
        .filter(|r| !r.occupied() && !measured.contains_key(r.hash().as_str()))
        .map(|r| (r.hash().to_string(), cause(r)))
        .collect();
    let asked = super::cancel::asked_to_cancel(st.view())?;
    let cancelled = records
        .clone()
        .filter(|r| failed.contains_key(r.hash().as_str()) && super::cancel::cancelled_by_cancel(r, &asked))
        .map(|r| r.hash().to_string())
        .collect();
    let seconds = records.filter_map(|r| r.result().map(|x| x.wall_s)).collect();
    let lines = st.view().journal()?;
    let rounds: Vec<&Vec<ConfigHash>> = lines
        .iter()
        .filter_map(|l| match &l.change {
            Change::ActiveRound { chosen, .. } => Some(chosen),
            _ => None,
        })
        .collect();
    let last_round = rounds.last().map(|c| c.iter().map(ConfigHash::to_string).collect()).unwrap_or_default();
    Ok(Known { measured, failed, cancelled, tried, rounds: rounds.len() as u32, last_round, seconds })
}

/// Why a submitted config measured nothing: the worker's message or the
/// job's log (as `status` says it), else how the job or the worker ended.
fn cause(r: &ConfigRecord) -> String {
    if let Some(c) = r.failure_cause() {
        return c;
    }
    match (r.result_status(), r.latest().and_then(|a| a.state())) {
        (Some(s), _) => format!("the worker ended {}", s.name()),
        (None, Some(state)) => format!("the job ended {state} without a result from the worker"),
        (None, None) => "no result from the worker".into(),
    }
}

/// How a loop that can be interrupted ended.
#[derive(Debug)]
pub enum Ended {
    Done(ActiveReport),
    /// Ctrl-C: no new round was chosen.
    Interrupted(Stopped),
}

/// Where a loop stopped by Ctrl-C left the sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    pub experiment: String,
    /// Rounds recorded in the journal.
    pub rounds: u32,
    /// The configs still queued or running (or whose submission awaits the
    /// cluster's answer), by name.
    pub running: Vec<String>,
}

/// Runs the loop until every config is settled or could not be measured,
/// the budget is spent, or a round's every run failed; `say` gets one line
/// per round.
pub async fn run(
    sweep: &Sweep,
    opts: &Options,
    settings: &Settings,
    watch: Watch,
    say: &mut (dyn FnMut(&str) + Send),
) -> Result<ActiveReport, CommandError> {
    match run_until(sweep, opts, settings, watch, None, say).await? {
        Ended::Done(r) => Ok(r),
        Ended::Interrupted(s) => Err(CommandError::Refused(format!("active sweep {} interrupted", s.experiment))),
    }
}

/// [`run`], stopped by `interrupt` (Ctrl-C) in any phase of a round: no new
/// round is chosen once it was pressed.
pub async fn run_until(
    sweep: &Sweep,
    opts: &Options,
    settings: &Settings,
    watch: Watch,
    interrupt: Option<&Interrupt>,
    say: &mut (dyn FnMut(&str) + Send),
) -> Result<Ended, CommandError> {
    let name = sweep.experiment.name.clone();
    // On a `local` cluster the runs have this machine's memory (a limit below the GPU's).
    let view = View::new(&opts.state_root, &name)?;
    // Held to its cluster once a submission may have reached it (as `submit`).
    let stored = view.pinned_sweep()?;
    let (judged, _) = where_it_runs(sweep, opts.cluster.as_deref(), stored.as_ref(), opts.clusters_file.as_deref())?;
    let sweep = &judged;
    let mut seen = BTreeSet::new();
    let configs: Vec<(String, RunConfig)> = sweep
        .configs
        .iter()
        .filter(|c| c.is_valid() && seen.insert(c.hash.clone()))
        .map(|c| (c.hash.to_string(), c.config.clone()))
        .collect();
    let prior = Calibration::builtin();
    // A stop on failures or on `cancel` already said (the loop run again): one new round first.
    let said = view.active()?.filter(|r| matches!(r.stop, Stop::RoundFailed | Stop::Cancelled)).map(|r| r.rounds);
    let replay = replay_records(sweep, opts)?;
    let mut submitted_round = None;
    let pressed = || interrupt.is_some_and(Interrupt::pressed);
    loop {
        if view.has_sweep() {
            status_until(&name, opts, Some(watch), interrupt, &mut |_| {}).await?;
        }
        if pressed() {
            return Ok(Ended::Interrupted(stopped(opts, &name)?));
        }
        if let Some(i) = interrupt {
            i.at("active:choosing").await;
        }
        let k = known(opts, &name)?;
        let list: Vec<MeasurementRecord> = k.measured.values().cloned().collect();
        let refit = Refit::new(&prior, &settings.runtime, &list)
            .with_limit(sweep.memory_limit_gib())
            .with_budget(sweep.experiment.budget_gb);
        let mut answers = active::answers_after(&configs, &k.measured, &k.failed, &refit, settings.target_error);
        for hash in &k.cancelled {
            answers.insert(hash.clone(), Answer::Cancelled);
        }
        if submitted_round == Some(k.rounds) {
            say(&round_outcome(k.rounds, &k.last_round, &answers));
        }
        let stopped_by_cancel = k.last_round.iter().any(|h| k.cancelled.contains(h));
        let choice = if said != Some(k.rounds) && stopped_by_cancel {
            Choice::Done(Stop::Cancelled)
        } else if said != Some(k.rounds) && active::round_failed(&k.last_round, &answers) {
            Choice::Done(Stop::RoundFailed)
        } else {
            choose_measurable(&configs, &answers, &refit, settings, &k.tried, replay.as_ref())
        };
        if pressed() {
            return Ok(Ended::Interrupted(stopped(opts, &name)?));
        }
        let chosen = match choice {
            Choice::Done(stop) => {
                let r = report(sweep, k, stop, answers);
                StateDir::open(&opts.state_root, &name, opts.lock_wait)?.save_active(&r)?;
                return Ok(Ended::Done(r));
            }
            Choice::Measure(keys) => keys,
        };
        let round = k.rounds + 1;
        let open = answers.values().filter(|a| !a.is_settled()).count();
        measure_round(sweep, opts, (round, k.measured.len(), open), &chosen, interrupt, say).await?;
        submitted_round = Some(round);
    }
}

/// What a loop stopped by Ctrl-C leaves running.
fn stopped(opts: &Options, experiment: &str) -> Result<Stopped, CommandError> {
    let view = View::new(&opts.state_root, experiment)?;
    let mut running: Vec<String> =
        view.records()?.values().filter(|r| r.occupied()).map(|r| r.name().to_string()).collect();
    running.sort();
    let rounds = view.journal()?.iter().filter(|l| matches!(l.change, Change::ActiveRound { .. })).count() as u32;
    Ok(Stopped { experiment: experiment.to_string(), rounds, running })
}

/// Records round `round` (`measured` configs measured so far, `open` not
/// settled) in the journal, says what it measures, and submits `chosen` (hashes).
async fn measure_round(
    sweep: &Sweep,
    opts: &Options,
    (round, measured, open): (u32, usize, usize),
    chosen: &[String],
    interrupt: Option<&Interrupt>,
    say: &mut (dyn FnMut(&str) + Send),
) -> Result<(), CommandError> {
    let round_of: Vec<ConfigHash> = chosen.iter().map(|k| ConfigHash::from(k.as_str())).collect();
    let hashes: BTreeSet<ConfigHash> = round_of.iter().cloned().collect();
    StateDir::open(&opts.state_root, &sweep.experiment.name, opts.lock_wait)?.apply(Change::ActiveRound {
        round,
        chosen: round_of,
        measured,
        open,
    })?;
    let names: Vec<&str> = sweep.configs.iter().filter(|c| hashes.contains(&c.hash)).map(|c| c.name.as_str()).collect();
    say(&format!("round {round}: {} open, measuring {}: {}", active::configs(open), chosen.len(), names.join(", ")));
    let o = Options { only: Some(hashes), force: true, include_risky: true, ..opts.clone() };
    if let Some(i) = interrupt {
        // A press from here on lets the round's submission finish: the loop stops after it.
        i.at("active:submitting").await;
    }
    let r = submit(sweep, &o, false).await?;
    if r.submitted.is_empty() && r.unresolved.is_empty() {
        let why: Vec<String> = r.skipped.iter().map(|(n, w)| format!("{n}: {w}")).collect();
        return Err(CommandError::Refused(format!(
            "round {round} chose configs that could not be submitted ({})",
            why.join("; ")
        )));
    }
    Ok(())
}

/// The records of the sweep's cluster when it is a `replay` one (`None`
/// for any other: every config can be measured there).
fn replay_records(sweep: &Sweep, opts: &Options) -> Result<Option<Records>, CommandError> {
    let prev = crate::state::View::new(&opts.state_root, &sweep.experiment.name)?.sweep()?;
    let cluster = cluster_name(opts, sweep, prev.as_ref());
    let (file, label) = ClustersFile::load_or_default(opts.clusters_file.as_deref())?;
    let (_, config) = file.get(&cluster, &label)?;
    if config.transport != TransportKind::Replay {
        return Ok(None);
    }
    let path = config.records.as_deref().ok_or_else(|| {
        CommandError::Refused(format!("cluster `{cluster}` replays records but names no `records` file"))
    })?;
    Ok(Some(Records::load(path)?))
}

/// [`active::choose`], on a `replay` cluster first among the configs its
/// records hold: one without a record cannot be measured there, and a round
/// of those would end the loop (every run failed) before it measured what it
/// could. Once those are measured or settled, the others as on any cluster.
fn choose_measurable(
    configs: &[(String, RunConfig)],
    answers: &BTreeMap<String, Answer>,
    refit: &Refit,
    settings: &Settings,
    tried: &BTreeSet<String>,
    replay: Option<&Records>,
) -> Choice {
    if let Some(records) = replay {
        let recorded: Vec<(String, RunConfig)> =
            configs.iter().filter(|(_, c)| records.find(c).is_ok()).cloned().collect();
        if let Choice::Measure(keys) = active::choose(&recorded, answers, refit, settings, tried.len(), tried) {
            return Choice::Measure(keys);
        }
    }
    active::choose(configs, answers, refit, settings, tried.len(), tried)
}

/// `round 2: 3 measured, 1 could not be measured`.
fn round_outcome(round: u32, chosen: &[String], answers: &BTreeMap<String, Answer>) -> String {
    let of = |f: fn(&Answer) -> bool| chosen.iter().filter(|k| answers.get(*k).is_some_and(f)).count();
    let (failed, cancelled) = (of(Answer::is_failed), of(Answer::is_cancelled));
    let mut s = format!("round {round}: {} measured", of(Answer::is_measured));
    if failed > 0 {
        s += &format!(", {failed} could not be measured");
    }
    if cancelled > 0 {
        s += &format!(", {cancelled} stopped by `cancel`");
    }
    s
}

fn report(sweep: &Sweep, k: Known, stop: Stop, answers: BTreeMap<String, Answer>) -> ActiveReport {
    let savings = Savings::of(&answers, &k.seconds);
    let by_hash: BTreeMap<&str, &str> = sweep.configs.iter().map(|c| (c.hash.as_str(), c.name.as_str())).collect();
    let answers = answers.into_iter().map(|(h, a)| (by_hash.get(h.as_str()).unwrap_or(&"?").to_string(), a)).collect();
    ActiveReport { experiment: sweep.experiment.name.clone(), rounds: k.rounds, stop, answers, savings }
}

/// Gives each `status` row of a config never submitted its predicted answer.
pub fn annotate(rows: &mut [super::StatusRow], a: &ActiveReport) {
    for row in rows.iter_mut().filter(|r| r.state == "-") {
        row.answer = a.answers.get(&row.name).filter(|a| matches!(a, Answer::Predicted { .. })).cloned();
    }
}
