//! The submission protocol: how an intent to submit one job array becomes a
//! job SLURM runs exactly once, even when `sbatch`'s outcome is unknown.
//!
//! ```text
//!             sbatch ok(id)                      found by name (one id)
//! Intended ───────────────▶ Submitted ◀──────────────────────────────┐
//!    │  sbatch error (any: timeout, dropped link, refusal)            │
//!    ▼                                                                │
//! Unresolved ── complete poll lists no such job ──▶ Absent{since} ───┤
//!    ▲  (an incomplete poll changes nothing)           │              │
//!    └─────────────────────────────────────────────────┘              │
//!                    complete poll again, ≥ CONFIRM_S after `since`   │
//! Absent{since} ───────────────────────────────────────▶ Abandoned   │
//!    └────────────────────────────────────────────────────────────────┘
//! ```
//!
//! The rules, in words: the intent (`submission.json`, fsynced) is on disk
//! before `sbatch` runs. Any `sbatch` error leaves the intent *unresolved*: a
//! timeout is not a "no" (a stalled slurmctld may create the job after the
//! client gave up). Unresolved intents are looked up by their unique job
//! name on every later `status`, `resume`, `cancel` and `submit`. An intent is
//! abandoned (its configs free to be submitted again) only after SLURM
//! answered *twice*, at least [`CONFIRM_S`] apart, with both `squeue
//! --states=all` and `sacct` succeeding and neither listing the name: a
//! request the controller still had queued when it first answered has been
//! processed by the second answer. Submitted and Abandoned are final.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

use super::{blocking, CommandError, Target};
use crate::state::{self, ConfigRecord, StateDir, Submission};
use crate::transport::Poll;

/// How long two complete "no such job" answers must be apart before an
/// intent is abandoned.
pub const CONFIRM_S: f64 = 5.0;

/// Where one submission (one job array) stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum IntentState {
    /// The intent is durable; `sbatch` has not answered (it is in flight, or
    /// the orchestrator died around it).
    #[default]
    Intended,
    /// `sbatch` failed in a way that does not prove the job was not created.
    Unresolved,
    /// One complete poll (at `since`) listed no job of this name; a second
    /// one [`CONFIRM_S`] later decides.
    Absent { since: f64 },
    /// SLURM has the job.
    Submitted { job_id: String },
    /// SLURM positively has no such job: the configs are free again.
    Abandoned,
}

/// What happened to a submission.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// `sbatch` printed this job id.
    SbatchOk(String),
    /// `sbatch` failed: timeout, dropped connection, socket error, refusal.
    SbatchFailed,
    /// The submission failed before its request left (the script could not
    /// be read back, the REST API version could not be learned): no job of
    /// the name can exist.
    NotSent,
    /// A poll by job name listed these array job ids.
    Found(BTreeSet<String>),
    /// A poll by job name listed nothing; `complete`: both squeue and sacct answered.
    NotListed { complete: bool, at: f64 },
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtocolError {
    #[error("SLURM has {} jobs of this name ({}); refusing to guess which is ours", .0.len(), .0.iter().cloned().collect::<Vec<_>>().join(", "))]
    Ambiguous(BTreeSet<String>),
    #[error("{event} cannot happen to a submission that is {state}")]
    Impossible { state: &'static str, event: &'static str },
}

impl IntentState {
    pub fn name(&self) -> &'static str {
        match self {
            IntentState::Intended => "intended",
            IntentState::Unresolved => "unresolved",
            IntentState::Absent { .. } => "absent",
            IntentState::Submitted { .. } => "submitted",
            IntentState::Abandoned => "abandoned",
        }
    }

    /// Submitted or Abandoned: nothing changes it any more.
    pub fn is_final(&self) -> bool {
        matches!(self, IntentState::Submitted { .. } | IntentState::Abandoned)
    }

    /// Not final: SLURM must be asked by name before its configs are touched.
    pub fn is_open(&self) -> bool {
        !self.is_final()
    }

    /// The transition function (the diagram in the module doc).
    pub fn next(&self, event: &Event) -> Result<IntentState, ProtocolError> {
        use IntentState::*;
        let impossible = |e: &'static str| Err(ProtocolError::Impossible { state: self.name(), event: e });
        match (self, event) {
            (Submitted { .. } | Abandoned, _) => Ok(self.clone()),
            (Intended, Event::SbatchOk(id)) => Ok(Submitted { job_id: id.clone() }),
            (Intended, Event::SbatchFailed) => Ok(Unresolved),
            (Intended, Event::NotSent) => Ok(Abandoned),
            (_, Event::SbatchOk(_)) => impossible("an sbatch answer"),
            (_, Event::SbatchFailed) => impossible("an sbatch error"),
            (_, Event::NotSent) => impossible("a request that never left"),
            (_, Event::Found(ids)) => match ids.len() {
                1 => Ok(Submitted { job_id: ids.iter().next().cloned().unwrap_or_default() }),
                0 => Ok(self.clone()),
                _ => Err(ProtocolError::Ambiguous(ids.clone())),
            },
            (_, Event::NotListed { complete: false, .. }) => Ok(self.clone()),
            (Intended | Unresolved, Event::NotListed { complete: true, at }) => Ok(Absent { since: *at }),
            (Absent { since }, Event::NotListed { complete: true, at }) => {
                Ok(if at - since >= CONFIRM_S { Abandoned } else { self.clone() })
            }
        }
    }

    /// For an `Absent` intent: when a second complete poll can abandon it.
    pub fn confirm_at(&self) -> Option<f64> {
        match self {
            IntentState::Absent { since } => Some(since + CONFIRM_S),
            _ => None,
        }
    }
}

/// What one reconciliation did, by submission id.
#[derive(Debug, Clone, Default)]
pub struct Settled {
    pub adopted: Vec<String>,
    pub abandoned: Vec<String>,
    /// Still open (SLURM did not answer, or the answer awaits confirmation).
    pub unresolved: Vec<String>,
}

/// Applies `event` to submission `sub`: the new state in `submission.json`
/// (fsynced: the protocol's record), a journal line, and the records'
/// attempts (job id adopted, or the attempt abandoned).
pub(crate) fn advance(
    st: &StateDir,
    records: &mut BTreeMap<String, ConfigRecord>,
    sub: &mut Submission,
    event: &Event,
) -> Result<(), CommandError> {
    let before = sub.state();
    let next = before
        .next(event)
        .map_err(|e| CommandError::Refused(format!("submission {} (job name {}): {e}", sub.id, sub.job_name)))?;
    if next == before {
        return Ok(());
    }
    sub.set_state(next.clone());
    st.save_submission(sub)?;
    let mut entry =
        serde_json::json!({"t": state::now(), "op": next.name(), "from": before.name(), "submission": sub.id});
    if let IntentState::Submitted { job_id } = &next {
        entry["job_id"] = job_id.clone().into();
    }
    st.journal(entry)?;
    for (task, hash) in sub.tasks.iter().enumerate() {
        let Some(r) = records.get_mut(hash) else { continue };
        let mut dirty = false;
        for a in r.attempts.iter_mut().filter(|a| a.submission == sub.id && a.task_id == task as u32) {
            match &next {
                IntentState::Submitted { job_id } => {
                    a.array_job_id = Some(job_id.clone());
                    a.submitted_at = sub.submitted_at;
                    dirty = true;
                }
                IntentState::Abandoned => {
                    a.abandoned = true;
                    dirty = true;
                }
                _ => {}
            }
        }
        if dirty {
            st.save_record(r)?;
        }
    }
    Ok(())
}

/// Asks SLURM by job name about every open intent (one squeue + one sacct
/// for all of them) and moves each on. With `wait_confirm` (`submit`,
/// `resume`), an intent seen absent once is asked again after [`CONFIRM_S`]
/// within this call, so a resume after a stall can resubmit at once.
pub(crate) async fn reconcile(
    st: &StateDir,
    target: &Target,
    records: &mut BTreeMap<String, ConfigRecord>,
    wait_confirm: bool,
) -> Result<Settled, CommandError> {
    let mut settled = Settled::default();
    for round in 0..3 {
        let open: Vec<Submission> = st.load_submissions()?.into_iter().filter(|s| s.state().is_open()).collect();
        if open.is_empty() {
            settled.unresolved.clear();
            return Ok(settled);
        }
        let names: Vec<String> = open.iter().map(|s| s.job_name.clone()).collect();
        let since = open.iter().map(|s| s.intended_at).fold(f64::INFINITY, f64::min);
        let poll = match blocking(&target.transport, move |t| t.poll(&names, since)).await {
            Ok(p) => p,
            Err(e) => {
                // Neither view answered: nothing is known, everything stays open.
                tracing::warn!("cannot settle {} open submission(s): {e}", open.len());
                Poll { errors: vec![e.to_string()], ..Poll::default() }
            }
        };
        let at = state::now();
        let mut next_confirm = f64::INFINITY;
        settled.unresolved.clear();
        for mut s in open {
            let ids: BTreeSet<String> =
                poll.tasks.values().filter(|o| o.name == s.job_name).map(|o| o.array_job_id.clone()).collect();
            let event =
                if ids.is_empty() { Event::NotListed { complete: poll.complete(), at } } else { Event::Found(ids) };
            advance(st, records, &mut s, &event)?;
            match s.state() {
                IntentState::Submitted { .. } => settled.adopted.push(s.id.clone()),
                IntentState::Abandoned => settled.abandoned.push(s.id.clone()),
                open => {
                    if let Some(t) = open.confirm_at() {
                        next_confirm = next_confirm.min(t);
                    }
                    settled.unresolved.push(s.id.clone());
                }
            }
        }
        if !wait_confirm || round == 2 || !next_confirm.is_finite() || !poll.complete() {
            break;
        }
        let wait = (next_confirm - state::now()).max(0.0) + 0.1;
        tokio::time::sleep(std::time::Duration::from_secs_f64(wait.min(2.0 * CONFIRM_S))).await;
    }
    Ok(settled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use IntentState::*;

    fn ids(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }
    fn none(complete: bool, at: f64) -> Event {
        Event::NotListed { complete, at }
    }
    fn sub(id: &str) -> IntentState {
        Submitted { job_id: id.into() }
    }

    #[test]
    fn intended_sbatch_ok_is_submitted() {
        assert_eq!(Intended.next(&Event::SbatchOk("42".into())), Ok(sub("42")));
    }

    #[test]
    fn intended_sbatch_error_is_unresolved_never_abandoned() {
        assert_eq!(Intended.next(&Event::SbatchFailed), Ok(Unresolved));
        // Only a request that never left proves there is no job.
        assert_eq!(Intended.next(&Event::NotSent), Ok(Abandoned));
        assert!(matches!(Unresolved.next(&Event::NotSent), Err(ProtocolError::Impossible { .. })));
    }

    #[test]
    fn open_states_adopt_a_job_found_by_name() {
        for s in [Intended, Unresolved, Absent { since: 1.0 }] {
            assert_eq!(s.next(&Event::Found(ids(&["7"]))), Ok(sub("7")), "{s:?}");
        }
    }

    #[test]
    fn two_jobs_of_one_name_are_refused() {
        for s in [Intended, Unresolved, Absent { since: 1.0 }] {
            assert!(matches!(s.next(&Event::Found(ids(&["7", "8"]))), Err(ProtocolError::Ambiguous(_))), "{s:?}");
        }
    }

    #[test]
    fn an_incomplete_answer_changes_nothing() {
        for s in [Intended, Unresolved, Absent { since: 1.0 }] {
            assert_eq!(s.next(&none(false, 100.0)), Ok(s.clone()), "{s:?}");
            assert_eq!(s.next(&Event::Found(BTreeSet::new())), Ok(s.clone()), "{s:?}");
        }
    }

    #[test]
    fn one_complete_no_is_absent_not_abandoned() {
        assert_eq!(Intended.next(&none(true, 10.0)), Ok(Absent { since: 10.0 }));
        assert_eq!(Unresolved.next(&none(true, 10.0)), Ok(Absent { since: 10.0 }));
    }

    #[test]
    fn a_second_complete_no_after_the_confirmation_time_abandons() {
        let a = Absent { since: 10.0 };
        assert_eq!(a.next(&none(true, 10.0 + CONFIRM_S - 0.1)), Ok(a.clone()), "too soon");
        assert_eq!(a.next(&none(true, 10.0 + CONFIRM_S)), Ok(Abandoned));
        assert_eq!(a.confirm_at(), Some(10.0 + CONFIRM_S));
    }

    #[test]
    fn final_states_stay() {
        for s in [sub("1"), Abandoned] {
            for e in [Event::SbatchOk("2".into()), Event::SbatchFailed, Event::Found(ids(&["3"])), none(true, 99.0)] {
                assert_eq!(s.next(&e), Ok(s.clone()), "{s:?} {e:?}");
            }
            assert!(s.is_final());
        }
    }

    #[test]
    fn sbatch_happens_once() {
        for s in [Unresolved, Absent { since: 1.0 }] {
            assert!(matches!(s.next(&Event::SbatchOk("1".into())), Err(ProtocolError::Impossible { .. })));
            assert!(matches!(s.next(&Event::SbatchFailed), Err(ProtocolError::Impossible { .. })));
        }
    }

    #[test]
    fn state_round_trips_as_json() {
        for s in [Intended, Unresolved, Absent { since: 2.5 }, sub("9"), Abandoned] {
            let j = serde_json::to_string(&s).expect("json");
            assert_eq!(serde_json::from_str::<IntentState>(&j).expect("back"), s, "{j}");
        }
    }
}
