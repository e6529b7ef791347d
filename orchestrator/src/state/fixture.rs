//! Records as unit tests need them, built without a state directory
//! (production code changes records only through [`super::StateDir::apply`]).

use facts::event::RunResult;

use super::events_read::{ChainRead, Live};
use super::record::{Attempt, ConfigRecord, StateChange};
use crate::collect::WorkerOutcome;
use crate::precheck::VerdictKind;
use crate::slurm::{JobId, SlurmState};

impl ConfigRecord {
    /// A config never judged nor submitted.
    pub(crate) fn fixture(hash: &str, name: &str) -> ConfigRecord {
        ConfigRecord::new(hash, name)
    }
    pub(crate) fn with_attempt(mut self, a: Attempt) -> ConfigRecord {
        self.attempts.push(a);
        self
    }
    pub(crate) fn with_result(mut self, result: Option<RunResult>) -> ConfigRecord {
        self.result = result;
        self
    }
    pub(crate) fn with_verdict(mut self, verdict: Option<VerdictKind>, predicted_gib: Option<f64>) -> ConfigRecord {
        self.verdict = verdict;
        self.predicted_gib = predicted_gib;
        self
    }
}

impl Attempt {
    /// Submitted as array job `array`.
    pub(crate) fn in_array(mut self, array: &str) -> Attempt {
        self.array_job_id = Some(JobId::from(array));
        self
    }
    /// The task's own job id.
    pub(crate) fn ran_as(mut self, job: Option<&str>) -> Attempt {
        self.job_id = job.map(JobId::from);
        self
    }
    pub(crate) fn submitted(mut self, at: f64) -> Attempt {
        self.submitted_at = Some(at);
        self
    }
    /// Seen in `state` at `t` (with SLURM's exit code detail), the latest state.
    pub(crate) fn seen(mut self, state: SlurmState, t: f64, detail: Option<&str>) -> Attempt {
        self.history.push(StateChange { t, state: state.clone(), detail: detail.map(str::to_string) });
        self.state = Some(state);
        self
    }
    /// The latest state, with no history (a record whose history was not kept).
    pub(crate) fn in_state(mut self, state: Option<SlurmState>) -> Attempt {
        self.state = state;
        self
    }
    pub(crate) fn with_worker(mut self, worker: WorkerOutcome) -> Attempt {
        self.worker = worker;
        self
    }
    pub(crate) fn with_live(mut self, live: Option<Live>) -> Attempt {
        self.live = live;
        self
    }
    pub(crate) fn with_chain(mut self, chain: Option<ChainRead>) -> Attempt {
        self.chain = chain;
        self
    }
}
