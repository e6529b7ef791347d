//! `submit` and `resume`: which configs to (re)submit, and sending their
//! arrays through the submission protocol ([`super::protocol`]).

use serde::Serialize;
use spec::run::ConfigHash;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use super::arrays::{prepare_arrays, Placement, Prepared};
use super::protocol;
use super::pull::awaiting_result;
use super::{
    allowed, blocking, open_target, prepare, result_grace_s, same_file, template_dirs, ClusterChoice, ClusterSource,
    CommandError, Options, Target,
};
use crate::cluster::{ClusterError, TransportKind};
use crate::collect::WorkerOutcome;
use crate::experiment::locate::KeyPath;
use crate::fsio;
use crate::precheck::VerdictKind;
use crate::render::Renderer;
use crate::slurm::{JobId, SlurmState};
use crate::state::intent::{IntentEvent, IntentState};
use crate::state::{Attempt, Change, ConfigRecord, StateDir, View};
use crate::sweep::{Sweep, SweepConfig};
use crate::transport::{CounterSnapshot, TransportError};
use crate::util::failpoint;

/// Summary of a submit/resume.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SubmitReport {
    pub submitted: Vec<String>,
    /// How many configs each array task runs, in turn.
    pub configs_per_task: u32,
    pub arrays: Vec<JobId>,
    /// (config name, why not submitted).
    pub skipped: Vec<(String, String)>,
    /// Open intents settled by asking SLURM by name: adopted (SLURM had the
    /// job) / abandoned (SLURM positively has none) / still unresolved.
    pub adopted: Vec<String>,
    pub abandoned: Vec<String>,
    pub unresolved: Vec<String>,
    /// Of the unresolved, those the cluster lists no job of while their
    /// configs' run directories say it ran them: (id, what was found).
    pub ran_anyway: Vec<(String, String)>,
    /// Transport commands and file transfers this command used.
    pub counters: CounterSnapshot,
    pub wall_s: f64,
    /// Where the sweep went, and what said so.
    pub cluster: Option<ClusterChoice>,
    /// Whether that cluster is SLURM (not the built-in `local` or `replay`).
    pub slurm: bool,
    /// Configs `resume` would have run again but that `cancel` stopped: not
    /// sent without `--retry-cancelled` (their names; also in `skipped`).
    pub cancelled_by_cancel: Vec<String>,
}

/// Submits prepared arrays one by one: upload, intent (the one fsync the
/// protocol needs), sbatch, outcome. An sbatch error leaves the intent
/// unresolved and stops: the controller is likely not answering.
async fn send(
    st: &mut StateDir,
    target: &Target,
    prepared: Vec<Prepared>,
    report: &mut SubmitReport,
) -> Result<(), CommandError> {
    let local = target.config.transport == TransportKind::Local;
    for mut p in prepared {
        // 1. Files on the cluster (a fresh path per submission: nothing to clobber).
        if !local || !same_file(&p.script_local, &p.sub.remote_script) {
            for (path, data) in std::mem::take(&mut p.files) {
                blocking(&target.transport, move |t| t.files().put_file(&path, &data, false)).await?;
            }
        }
        // 2. The intent, durable before sbatch. The records' attempts follow
        // from it (`StateDir::repair`), so they are written without fsync.
        p.sub.intended_at = fsio::now();
        failpoint::hit("intent:before");
        st.apply(Change::Intent { submission: p.sub.clone() })?;
        // 3. sbatch, whose outcome moves the intent on.
        let script = p.sub.remote_script.clone();
        let result = blocking(&target.transport, move |t| t.submit(&script)).await;
        failpoint::hit("sbatch:answered");
        match result {
            Ok(job_id) => {
                protocol::advance(st, &mut p.sub, &IntentEvent::SbatchOk(job_id.clone()))?;
                tracing::info!(submission = %p.sub.id, job = %job_id, "submitted {} configs", p.sub.tasks.len());
                report.arrays.push(job_id);
                report.submitted.extend(p.sub.tasks.iter().filter_map(|h| st.record(h).map(|r| r.name().to_string())));
            }
            Err(e @ TransportError::NotSent(_)) => {
                protocol::advance(st, &mut p.sub, &IntentEvent::NotSent)?;
                st.apply(Change::NotSent { submission: p.sub.id.clone(), error: e.to_string() })?;
                return Err(CommandError::Refused(format!(
                    "submitting {} ({} configs) failed: {e}; its configs are free to submit again",
                    p.sub.id,
                    p.sub.tasks.len()
                )));
            }
            Err(e) => {
                protocol::advance(st, &mut p.sub, &IntentEvent::SbatchFailed)?;
                st.apply(Change::SbatchError { submission: p.sub.id.clone(), error: e.to_string() })?;
                // Did it reach SLURM anyway? Ask by name now; whatever stays open, every later command asks again.
                if let Ok(s) = protocol::reconcile(st, target, false).await {
                    report.merge(s);
                }
                let state = st.load_submissions()?.into_iter().find(|s| s.id == p.sub.id).map(|s| s.state());
                if let Some(IntentState::Submitted { job_id }) = state {
                    report.arrays.push(job_id);
                    report
                        .submitted
                        .extend(p.sub.tasks.iter().filter_map(|h| st.record(h).map(|r| r.name().to_string())));
                    continue;
                }
                return Err(CommandError::Refused(format!(
                    "submitting {} ({} configs) failed: {e}. SLURM may still have created the job: \
                     its configs stay reserved until SLURM answers by the job name {} \
                     (`orchestrator status` or `resume` asks again; nothing is submitted twice)",
                    p.sub.id,
                    p.sub.tasks.len(),
                    p.sub.job_name
                )));
            }
        }
    }
    Ok(())
}

impl SubmitReport {
    fn merge(&mut self, s: protocol::Settled) {
        self.adopted.extend(s.adopted);
        self.abandoned.extend(s.abandoned);
        self.unresolved = s.unresolved;
        self.ran_anyway = s.ran_anyway;
    }
}

/// The array tasks, as (submission, task id), whose worker started some
/// config. A config of such a task with no `start` of its own was not
/// reached: the task's worker died (or was killed) on an earlier config.
fn tasks_started(records: &BTreeMap<ConfigHash, ConfigRecord>) -> BTreeSet<(String, u32)> {
    let attempts = records.values().flat_map(|r| r.attempts().iter());
    attempts
        .filter(|a| !a.abandoned() && !a.worker().is_not_started())
        .map(|a| (a.submission().to_string(), a.task_id()))
        .collect()
}

/// Why a config is not (re)submitted, or `None` when it should be.
/// `started`: the tasks whose worker started ([`tasks_started`]).
fn blocker(
    r: &ConfigRecord,
    opts: &Options,
    resubmit_retryable: bool,
    started: &BTreeSet<(String, u32)>,
) -> Option<String> {
    let verdict = r.verdict().unwrap_or(VerdictKind::Invalid);
    if !allowed(verdict, opts) {
        if let Some(status) = r.result_status() {
            // Run with --force once and measured: that says more than the prediction.
            return Some(format!("measured {}", status.name()));
        }
        return Some(refusal(verdict));
    }
    if r.attempts().iter().any(|a| !a.abandoned() && a.array_job_id().is_none()) {
        return Some(
            "submission unresolved (SLURM has not yet answered by job name; nothing is submitted twice)".into(),
        );
    }
    if r.occupied() {
        return Some("queued or running".into());
    }
    let tried: Vec<&Attempt> = r.attempts().iter().filter(|a| !a.abandoned()).collect();
    let last = tried.last()?;
    let grace_s = opts.result_grace.as_secs_f64();
    if awaiting_result(last, grace_s, fsio::now()) {
        return Some(format!(
            "ended {} without a visible result yet; read again for {grace_s:.0} s (shared filesystem lag)",
            last.state().map(|s| s.to_string()).unwrap_or_default(),
        ));
    }
    let state = last.state().cloned().unwrap_or(SlurmState::Pending);
    let mut worker = if r.attempts().iter().all(|a| a.worker().is_not_started()) {
        // Records written before attempts carried the worker's outcome keep it only here.
        legacy_outcome(r)
    } else {
        last.worker()
    };
    if worker.is_not_started() && started.contains(&(last.submission().to_string(), last.task_id())) {
        // Not reached: its task's worker ran an earlier config and ended with
        // the task, before this one's turn. Nothing was measured; it is
        // judged as a worker that started and wrote no result.
        worker = WorkerOutcome::NoResult;
    }
    if let Some(why) = opts.retry.refusal(&state, worker) {
        return Some(why);
    }
    if !resubmit_retryable {
        return Some(format!("already submitted ({state}; `resume` retries)"));
    }
    if tried.len() as u32 >= opts.retry.max_attempts {
        return Some(format!("ended {state} after {} attempts", tried.len()));
    }
    None
}

/// Why a config of `verdict` is not submitted without a flag.
fn refusal(verdict: VerdictKind) -> String {
    match verdict {
        VerdictKind::Risky => "risky (use --include-risky)".into(),
        VerdictKind::Oom => "predicted oom (use --force)".into(),
        v => v.to_string(),
    }
}

/// What a plain `submit` would send now, read without the lock (`render`):
/// the configs, and every other config of the sweep with why not (already
/// measured, queued, answered by an active sweep, held back by its verdict).
pub(super) fn would_send<'a>(sweep: &'a Sweep, opts: &Options) -> Result<WouldSend<'a>, CommandError> {
    let (_, records) = crate::state::View::new(&opts.state_root, &sweep.experiment.name)?.sweep_and_records()?;
    let verdicts = super::verdicts(sweep, &opts.state_root);
    let started = tasks_started(&records);
    let answered = answered_by_active(opts, &sweep.experiment.name)?;
    let (mut todo, mut skipped) = (Vec::new(), Vec::new());
    let mut seen = BTreeSet::new();
    for c in sweep.configs.iter().filter(|c| seen.insert(&c.hash)) {
        if opts.only.as_ref().is_some_and(|only| !only.contains(&c.hash)) {
            continue;
        }
        let record = records.get(&c.hash);
        let never_submitted = record.is_none_or(|r| r.attempts().iter().all(Attempt::abandoned));
        let why = match answered.get(c.name.as_str()).filter(|_| never_submitted) {
            Some(why) => Some(why.clone()),
            None => match record {
                Some(r) => blocker(r, opts, false, &started),
                None => match verdicts.get(&c.hash).map(|v| v.kind()) {
                    Some(k) if allowed(k, opts) => None,
                    Some(k) => Some(refusal(k)),
                    None => Some("no verdict".into()),
                },
            },
        };
        match why {
            None => todo.push(c),
            Some(why) => skipped.push((c.name.clone(), why)),
        }
    }
    Ok((todo, skipped))
}

/// The configs `submit` would send, and the others with why not.
pub(super) type WouldSend<'a> = (Vec<&'a SweepConfig>, Vec<(String, String)>);

/// The configs an active sweep answered by a settled prediction (name: why
/// they are not submitted): a plain `submit` or `resume` does not spend the
/// runs the loop saved; `--all` does, and an active round chooses its own.
fn answered_by_active(opts: &Options, experiment: &str) -> Result<BTreeMap<String, String>, CommandError> {
    if opts.all || opts.only.is_some() {
        return Ok(BTreeMap::new());
    }
    let Some(a) = View::new(&opts.state_root, experiment)?.active()? else { return Ok(BTreeMap::new()) };
    Ok(a.answers
        .iter()
        .filter(|(_, answer)| answer.is_settled_prediction())
        .map(|(name, answer)| {
            let words = answer.predicted_words().unwrap_or_default();
            (name.clone(), format!("answered by the active sweep: {words} (`resume --all` runs it)"))
        })
        .collect())
}

/// The worker outcome a record's `result` gives when its attempts do not say.
fn legacy_outcome(r: &ConfigRecord) -> WorkerOutcome {
    match r.result_status() {
        Some(status) => WorkerOutcome::Result(status),
        None => WorkerOutcome::NotStarted,
    }
}

/// The target the sweep goes to; an unknown cluster that the experiment file
/// named is reported at its line there.
fn open_chosen(opts: &Options, sweep: &Sweep, choice: &ClusterChoice) -> Result<Target, CommandError> {
    open_target(opts, &choice.name).map_err(|e| match (e, choice.from) {
        (CommandError::Cluster(e @ ClusterError::Unknown { .. }), ClusterSource::Experiment) => {
            CommandError::Refused(match crate::experiment::Source::read(&sweep.source) {
                Ok(src) => src.error_in_file(&KeyPath::default().key("cluster"), e.to_string()).to_string(),
                Err(_) => format!("{}: cluster: {e}", sweep.source.display()),
            })
        }
        (e, _) => e,
    })
}

/// Checks the worker that the prepared job scripts run (a user's own
/// template that runs none needs none); on refusal the rendered files go too
/// (nothing was recorded).
async fn check_worker_of(
    st: &StateDir,
    target: &Target,
    sweep: &Sweep,
    worker: &str,
    prepared: &[Prepared],
) -> Result<(), CommandError> {
    let contains = |bytes: &[u8]| bytes.windows(worker.len()).any(|w| w == worker.as_bytes());
    if !prepared.iter().any(|p| p.files.iter().any(|(_, bytes)| contains(bytes))) {
        return Ok(());
    }
    let backend = super::arrays::experiment_backend(&sweep.experiment);
    let resources = crate::cluster::merge_resources(&sweep.experiment.slurm, &target.config.defaults);
    let need = super::probe::Need::of(backend, "the experiment asks for", &resources);
    let checked = super::probe::check_worker(target, worker, &need).await;
    if checked.is_err() {
        for p in prepared {
            st.forget_unsent(&p.sub.id);
        }
    }
    checked
}

/// `submit` (never-submitted configs only) and `resume` (also retryable ended ones).
pub async fn submit(sweep: &Sweep, opts: &Options, resume: bool) -> Result<SubmitReport, CommandError> {
    let t0 = Instant::now();
    if !View::new(&opts.state_root, &sweep.experiment.name)?.has_sweep() {
        // Refused before the state directory is made: nothing to clean up.
        ClusterChoice::of(opts.cluster.as_deref(), sweep, None).check(sweep)?;
    }
    let mut st = StateDir::open(&opts.state_root, &sweep.experiment.name, opts.lock_wait)?;
    // The stored cluster, once something may have reached it; else as if new.
    let prev = st.view().pinned_sweep()?;
    let (judged, choice) =
        super::where_it_runs(sweep, opts.cluster.as_deref(), prev.as_ref(), opts.clusters_file.as_deref());
    choice.check(sweep)?;
    let sweep = &judged;
    let cluster = choice.name.clone();
    let target = open_chosen(opts, sweep, &choice)?;
    let grace_s = result_grace_s(opts, &target);
    let opts = &Options { result_grace: std::time::Duration::from_secs_f64(grace_s), ..opts.clone() };
    prepare(&mut st, sweep, &cluster)?;
    let before = target.transport.counters();
    let configs_per_task = sweep.experiment.worker.configs_per_task;
    let slurm = !matches!(target.config.transport, TransportKind::Local | TransportKind::Replay);
    let mut report = SubmitReport { cluster: Some(choice), configs_per_task, slurm, ..SubmitReport::default() };

    // Settle what a crash left, then learn the current states, before deciding anything.
    // An open intent's configs stay reserved (`ConfigRecord::live`) until SLURM answers by name.
    let settled = protocol::reconcile(&mut st, &target, true).await?;
    report.merge(settled);
    if resume {
        let _ = super::poll::update(&mut st, &target, sweep, true, grace_s).await?;
    }

    let mut todo: Vec<&SweepConfig> = Vec::new();
    let mut seen = BTreeSet::new();
    let started = tasks_started(st.records());
    let answered = answered_by_active(opts, &sweep.experiment.name)?;
    let asked = super::cancel::asked_to_cancel(st.view())?;
    for c in &sweep.configs {
        if !seen.insert(&c.hash) {
            continue;
        }
        let Some(r) = st.record(&c.hash) else { continue };
        if opts.only.as_ref().is_some_and(|only| !only.contains(&c.hash)) {
            continue;
        }
        let never_submitted = r.attempts().iter().all(Attempt::abandoned);
        if let Some(why) = answered.get(c.name.as_str()).filter(|_| never_submitted) {
            report.skipped.push((c.name.clone(), why.clone()));
            continue;
        }
        match blocker(r, opts, resume, &started) {
            None if !opts.retry.cancelled_by_cancel && super::cancel::cancelled_by_cancel(r, &asked) => {
                report.skipped.push((c.name.clone(), "cancelled by `cancel` (--retry-cancelled runs it)".into()));
                report.cancelled_by_cancel.push(c.name.clone());
            }
            None => todo.push(c),
            Some(why) => report.skipped.push((c.name.clone(), why)),
        }
    }
    if !todo.is_empty() {
        let max_array = blocking(&target.transport, |t| t.max_array_size()).await?;
        let remote_state = blocking(&target.transport, |t| t.files().remote_state_root()).await?;
        let worker = blocking(&target.transport, |t| t.files().worker_path()).await?;
        let mut renderer = Renderer::new(template_dirs(opts, sweep));
        let first_seq = st.load_submissions()?.len() + 1;
        let place = Placement { remote_state: &remote_state, worker: &worker, max_array, first_seq };
        let prepared = prepare_arrays(sweep, &todo, &target, &place, &mut renderer, &|sid, name, data| {
            Ok(st.keep_sent(sid, name, data)?)
        })?;
        check_worker_of(&st, &target, sweep, &worker, &prepared).await?;
        send(&mut st, &target, prepared, &mut report).await?;
    }
    let after = target.transport.counters();
    report.counters = CounterSnapshot {
        commands: after.commands - before.commands,
        file_ops: after.file_ops - before.file_ops,
        connects: after.connects - before.connects,
    };
    report.wall_s = t0.elapsed().as_secs_f64();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::RetryPolicy;

    fn rec(verdict: &str, attempts: Vec<Attempt>, result: Option<&str>) -> ConfigRecord {
        rec_named("h", verdict, attempts, result)
    }

    fn rec_named(hash: &str, verdict: &str, attempts: Vec<Attempt>, result: Option<&str>) -> ConfigRecord {
        let verdict = serde_json::from_value(verdict.into()).expect("a verdict name");
        let r = ConfigRecord::fixture(hash, "n").with_verdict(Some(verdict), None);
        let r = attempts.into_iter().fold(r, ConfigRecord::with_attempt);
        r.with_result(result.map(|s| spec::event::RunResult {
            t: 0.0,
            status: serde_json::from_value(s.into()).expect("a status"),
            params: 0,
            peaks: Default::default(),
            peak_bytes: 0,
            phase: None,
            message: None,
            wall_s: 0.0,
            nvml_peak_bytes: None,
            as_pytorch_counts: None,
            group: None,
        }))
    }

    fn none() -> BTreeSet<(String, u32)> {
        BTreeSet::new()
    }

    fn ended(state: SlurmState) -> Attempt {
        Attempt::intended("s", 0, 0.0).in_array("1").in_state(Some(state))
    }

    #[test]
    fn resume_never_resubmits_live_completed_or_measured_oom() {
        let o = Options::default();
        assert_eq!(blocker(&rec("fits", vec![], None), &o, true, &none()), None, "never submitted");
        assert!(blocker(&rec("fits", vec![ended(SlurmState::Running)], None), &o, true, &none()).is_some());
        assert!(blocker(&rec("fits", vec![ended(SlurmState::Pending)], None), &o, true, &none()).is_some());
        assert!(blocker(&rec("fits", vec![ended(SlurmState::Completed)], None), &o, true, &none()).is_some());
        assert!(blocker(&rec("fits", vec![ended(SlurmState::NodeFail)], Some("oom")), &o, true, &none()).is_some());
        let intent = Attempt::intended("s", 0, 0.0);
        assert!(blocker(&rec("fits", vec![intent], None), &o, true, &none()).is_some(), "unsettled intent");
        assert_eq!(blocker(&rec("fits", vec![ended(SlurmState::NodeFail)], None), &o, true, &none()), None);
        assert_eq!(blocker(&rec("fits", vec![ended(SlurmState::Cancelled)], None), &o, true, &none()), None);
        assert!(
            blocker(&rec("fits", vec![ended(SlurmState::Cancelled)], None), &o, false, &none()).is_some(),
            "submit does not retry"
        );
        let three = vec![ended(SlurmState::NodeFail), ended(SlurmState::NodeFail), ended(SlurmState::NodeFail)];
        assert!(blocker(&rec("fits", three, None), &o, true, &none()).is_some(), "max attempts");
    }

    #[test]
    fn verdict_gates() {
        let o = Options::default();
        assert!(blocker(&rec("invalid", vec![], None), &Options { force: true, ..o.clone() }, true, &none()).is_some());
        assert!(blocker(&rec("oom", vec![], None), &o, true, &none()).is_some());
        assert_eq!(blocker(&rec("oom", vec![], None), &Options { force: true, ..o.clone() }, true, &none()), None);
        assert!(blocker(&rec("risky", vec![], None), &o, true, &none()).is_some());
        assert_eq!(blocker(&rec("risky", vec![], None), &Options { include_risky: true, ..o }, true, &none()), None);
    }

    fn with_worker(a: Attempt, worker: &str) -> Attempt {
        a.with_worker(WorkerOutcome::from_word(Some(worker)))
    }

    #[test]
    fn resume_retries_a_killed_worker_but_not_a_measured_oom_or_a_real_error() {
        let o = Options::default();
        let failed = || ended(SlurmState::Failed);
        // Exit 3 makes SLURM say FAILED; the worker's `oom` result wins.
        let oom = rec("fits", vec![with_worker(failed(), "oom")], Some("oom"));
        assert_eq!(blocker(&oom, &o, true, &none()).as_deref(), Some("measured oom"));
        // Started, no result, FAILED (SIGKILL) or OUT_OF_MEMORY (host OOM killer): retried.
        assert_eq!(blocker(&rec("fits", vec![with_worker(failed(), "started")], None), &o, true, &none()), None);
        let host_oom = with_worker(ended(SlurmState::OutOfMemory), "started");
        assert_eq!(blocker(&rec("fits", vec![host_oom], None), &o, true, &none()), None);
        // A real error: only with --retry-failed.
        let err = rec("fits", vec![with_worker(failed(), "failed")], Some("failed"));
        assert!(blocker(&err, &o, true, &none()).is_some_and(|w| w.contains("--retry-failed")));
        let retry_failed = Options { retry: RetryPolicy { failed: true, ..o.retry }, ..o.clone() };
        assert_eq!(blocker(&err, &retry_failed, true, &none()), None);
        // The latest attempt decides: a first attempt's failure does not stick to a killed retry.
        let r = rec("fits", vec![with_worker(failed(), "failed"), with_worker(failed(), "started")], None);
        assert_eq!(blocker(&r, &o, true, &none()), None);
        // The job script failed before the worker started (missing binary): a real error.
        assert!(blocker(&rec("fits", vec![failed()], None), &o, true, &none()).is_some());
    }

    #[test]
    fn configs_of_a_task_killed_midway_keep_their_results_and_the_unreached_are_retried() {
        // One task (s, 0) ran three configs: the first ended ok, the worker was
        // SIGKILLed in the second (started, no result), the third was never reached.
        let o = Options::default();
        let failed = || ended(SlurmState::Failed);
        let mut records = BTreeMap::new();
        for (hash, worker, result) in [("a", Some("ok"), Some("ok")), ("b", Some("started"), None), ("c", None, None)] {
            let a = failed().with_worker(WorkerOutcome::from_word(worker));
            records.insert(hash.into(), rec_named(hash, "fits", vec![a], result));
        }
        let started = tasks_started(&records);
        assert_eq!(started, BTreeSet::from([("s".to_string(), 0)]));
        assert_eq!(blocker(&records["a"], &o, true, &started).as_deref(), Some("completed"), "keeps its result");
        assert_eq!(blocker(&records["b"], &o, true, &started), None, "killed: retried");
        assert_eq!(blocker(&records["c"], &o, true, &started), None, "not reached: retried as killed");
        let no_killed = Options { retry: RetryPolicy { killed: false, ..o.retry }, ..o.clone() };
        assert!(blocker(&records["c"], &no_killed, true, &started).is_some_and(|w| w.contains("--no-retry-killed")));
        // A task whose worker never started any config failed before the worker: a real error, as with one config.
        assert!(blocker(&records["c"], &o, true, &none()).is_some_and(|w| w.contains("before the worker started")));
        // Once retried, the retry's own outcome decides (max attempts per config, as before).
        let three = vec![failed(), failed(), failed()];
        assert!(blocker(&rec("fits", three, None), &o, true, &started).is_some_and(|w| w.contains("3 attempts")));
    }
}
