//! `submit` and `resume`: one pass, in the order the work happens, each
//! stage a function of the one before's output. What they all share, where
//! the sweep runs and its state directory (a [`Site`]), is opened once at
//! the start and handed down.
//!
//! 1. [`read_and_judge`] (`judge`): the sweep as that cluster runs it, each
//!    config's verdict, recorded in the state directory;
//! 2. [`what_to_send`] (`decide`): open intents settled, `resume`'s first
//!    poll, then each config sent or skipped, and why;
//! 3. [`render_arrays`] (`arrays`): the job arrays, and the worker they run
//!    checked on the cluster;
//! 4. for each array in turn: [`record_intent`] (`intend`: its intent in the
//!    state directory), [`sbatch`] and [`record_answer`] (`send`: what SLURM
//!    said, through the submission protocol).

use serde::Serialize;
use std::time::Instant;

use super::arrays::render_arrays;
use super::decide::{what_to_send, Plan};
use super::intend::record_intent;
use super::judge::{read_and_judge, ClusterChoice, Site};
use super::protocol::Settled;
use super::send::{record_answer, sbatch, Recorded};
use super::{CommandError, Options};
use crate::cluster::TransportKind;
use crate::slurm::JobId;
use crate::sweep::Sweep;
use crate::transport::CounterSnapshot;

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

/// `submit` (never-submitted configs only) and `resume` (also retryable ended ones).
pub async fn submit(sweep: &Sweep, opts: &Options, resume: bool) -> Result<SubmitReport, CommandError> {
    let t0 = Instant::now();
    let mut site = Site::open(sweep, opts)?;
    let sweep = read_and_judge(sweep, &mut site)?;
    let before = site.target.transport.counters();
    let plan = what_to_send(&sweep, &mut site, resume).await?;
    let mut report = SubmitReport::of(&site, &sweep, &plan);
    if !plan.todo.is_empty() {
        for p in render_arrays(&plan.todo, &sweep, &site).await? {
            let sub = record_intent(p, &mut site).await?;
            let answered = sbatch(sub, &site).await;
            report.add(record_answer(answered, &mut site).await?);
        }
    }
    let after = site.target.transport.counters();
    report.counters = CounterSnapshot {
        commands: after.commands - before.commands,
        file_ops: after.file_ops - before.file_ops,
        connects: after.connects - before.connects,
    };
    report.wall_s = t0.elapsed().as_secs_f64();
    Ok(report)
}

impl SubmitReport {
    /// The report before anything is sent: where, and what was decided.
    fn of(site: &Site, sweep: &Sweep, plan: &Plan) -> SubmitReport {
        let mut report = SubmitReport {
            cluster: Some(site.choice.clone()),
            configs_per_task: sweep.experiment.worker.configs_per_task,
            slurm: !matches!(site.target.config.transport, TransportKind::Local | TransportKind::Replay),
            skipped: plan.skipped.clone(),
            cancelled_by_cancel: plan.cancelled_by_cancel.clone(),
            ..SubmitReport::default()
        };
        report.merge(plan.settled.clone());
        report
    }

    /// One array SLURM has.
    fn add(&mut self, r: Recorded) {
        if let Some(s) = r.settled {
            self.merge(s);
        }
        self.arrays.push(r.job_id);
        self.submitted.extend(r.configs);
    }

    fn merge(&mut self, s: Settled) {
        self.adopted.extend(s.adopted);
        self.abandoned.extend(s.abandoned);
        self.unresolved = s.unresolved;
        self.ran_anyway = s.ran_anyway;
    }
}
