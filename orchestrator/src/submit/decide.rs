//! `submit`'s second stage: what to send. Open intents a crash left are
//! settled first (SLURM asked by job name), `resume` learns the current
//! states (its first poll), and then each config of the sweep is sent or
//! skipped with why: its verdict, an attempt still live or unresolved, an
//! active sweep's settled prediction, `cancel`, the retry policy and its
//! budget of attempts.

use facts::run::ConfigHash;
use std::collections::{BTreeMap, BTreeSet};

use super::judge::Site;
use super::poll::awaiting_result;
use super::protocol::{self, Settled};
use super::{CommandError, Options};
use crate::collect::WorkerOutcome;
use crate::fsio;
use crate::precheck::VerdictKind;
use crate::slurm::SlurmState;
use crate::state::{Attempt, ConfigRecord, View};
use crate::sweep::{Sweep, SweepConfig};

/// What `submit` sends, and what it learnt deciding so.
pub(crate) struct Plan<'a> {
    /// The configs to send, in the sweep's order.
    pub todo: Vec<&'a SweepConfig>,
    /// (config name, why not sent).
    pub skipped: Vec<(String, String)>,
    /// Configs `resume` would have run again but that `cancel` stopped (also in `skipped`).
    pub cancelled_by_cancel: Vec<String>,
    /// The open intents settled before deciding.
    pub settled: Settled,
}

/// Settles what a crash left, then (`resume`) learns the current states,
/// before deciding anything; then chooses. An open intent's configs stay
/// reserved (`ConfigRecord::live`) until SLURM answers by name.
pub(crate) async fn what_to_send<'a>(
    sweep: &'a Sweep,
    site: &mut Site,
    resume: bool,
) -> Result<Plan<'a>, CommandError> {
    let settled = protocol::reconcile(&mut site.st, &site.target, true).await?;
    if resume {
        let _ = super::poll::update(&mut site.st, &site.target, sweep, true, site.grace_s).await?;
    }
    let mut plan = Plan { todo: Vec::new(), skipped: Vec::new(), cancelled_by_cancel: Vec::new(), settled };
    let (st, opts) = (&site.st, &site.opts);
    let started = tasks_started(st.records());
    let answered = answered_by_active(opts, &sweep.experiment.name)?;
    let asked = super::cancel::asked_to_cancel(st.view())?;
    let mut seen = BTreeSet::new();
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
            plan.skipped.push((c.name.clone(), why.clone()));
            continue;
        }
        match blocker(r, opts, resume, &started) {
            None if !opts.retry.cancelled_by_cancel && super::cancel::cancelled_by_cancel(r, &asked) => {
                plan.skipped.push((c.name.clone(), "cancelled by `cancel` (--retry-cancelled runs it)".into()));
                plan.cancelled_by_cancel.push(c.name.clone());
            }
            None => plan.todo.push(c),
            Some(why) => plan.skipped.push((c.name.clone(), why)),
        }
    }
    Ok(plan)
}

/// Which verdicts `submit` sends to the cluster.
fn allowed(verdict: VerdictKind, opts: &Options) -> bool {
    match verdict {
        VerdictKind::Fits => true,
        VerdictKind::Risky => opts.include_risky || opts.force,
        VerdictKind::Oom => opts.force,
        VerdictKind::Invalid => false, // fails at once with a dimension error, never worth a job
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
    // A chain continued after a segment that saved and stopped is no failed try.
    let failed_tries = tried.iter().filter(|a| a.worker() != WorkerOutcome::SegmentEnded).count();
    if failed_tries as u32 >= opts.retry.max_attempts {
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
    let verdicts = super::judge::verdicts(sweep, &opts.state_root);
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
        r.with_result(result.map(|s| facts::event::RunResult {
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
