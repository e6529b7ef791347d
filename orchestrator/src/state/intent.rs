//! The pure intent state machine of one submission (one job array): the
//! transitions the submission protocol ([`crate::submit::protocol`]) drives
//! with what `sbatch` and polls answered.
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
use std::collections::BTreeSet;

use crate::slurm::JobId;

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
    Submitted { job_id: JobId },
    /// SLURM positively has no such job: the configs are free again.
    Abandoned,
}

/// What happened to a submission.
#[derive(Debug, Clone, PartialEq)]
pub enum IntentEvent {
    /// `sbatch` printed this job id.
    SbatchOk(JobId),
    /// `sbatch` failed: timeout, dropped connection, socket error, refusal.
    SbatchFailed,
    /// The submission failed before its request left (the script could not
    /// be read back, the REST API version could not be learned): no job of
    /// the name can exist.
    NotSent,
    /// A poll by job name listed these array job ids.
    Found(BTreeSet<JobId>),
    /// A poll by job name listed nothing; `complete`: both squeue and sacct answered.
    NotListed { complete: bool, at: f64 },
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtocolError {
    #[error("SLURM has {} jobs of this name ({}); refusing to guess which is ours", .0.len(), .0.iter().map(|j| j.as_str()).collect::<Vec<_>>().join(", "))]
    Ambiguous(BTreeSet<JobId>),
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
    pub fn next(&self, event: &IntentEvent) -> Result<IntentState, ProtocolError> {
        use IntentState::*;
        let impossible = |e: &'static str| Err(ProtocolError::Impossible { state: self.name(), event: e });
        match (self, event) {
            (Submitted { .. } | Abandoned, _) => Ok(self.clone()),
            (Intended, IntentEvent::SbatchOk(id)) => Ok(Submitted { job_id: id.clone() }),
            (Intended, IntentEvent::SbatchFailed) => Ok(Unresolved),
            (Intended, IntentEvent::NotSent) => Ok(Abandoned),
            (_, IntentEvent::SbatchOk(_)) => impossible("an sbatch answer"),
            (_, IntentEvent::SbatchFailed) => impossible("an sbatch error"),
            (_, IntentEvent::NotSent) => impossible("a request that never left"),
            (_, IntentEvent::Found(ids)) => match ids.len() {
                1 => Ok(ids.iter().next().map_or(Intended, |id| Submitted { job_id: id.clone() })),
                0 => Ok(self.clone()),
                _ => Err(ProtocolError::Ambiguous(ids.clone())),
            },
            (_, IntentEvent::NotListed { complete: false, .. }) => Ok(self.clone()),
            (Intended | Unresolved, IntentEvent::NotListed { complete: true, at }) => Ok(Absent { since: *at }),
            (Absent { since }, IntentEvent::NotListed { complete: true, at }) => {
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

#[cfg(test)]
mod tests {
    use super::*;
    use IntentState::*;

    fn ids(v: &[&str]) -> BTreeSet<JobId> {
        v.iter().map(|s| JobId::from(*s)).collect()
    }
    fn none(complete: bool, at: f64) -> IntentEvent {
        IntentEvent::NotListed { complete, at }
    }
    fn sub(id: &str) -> IntentState {
        Submitted { job_id: id.into() }
    }

    #[test]
    fn intended_sbatch_ok_is_submitted() {
        assert_eq!(Intended.next(&IntentEvent::SbatchOk("42".into())), Ok(sub("42")));
    }

    #[test]
    fn intended_sbatch_error_is_unresolved_never_abandoned() {
        assert_eq!(Intended.next(&IntentEvent::SbatchFailed), Ok(Unresolved));
        // Only a request that never left proves there is no job.
        assert_eq!(Intended.next(&IntentEvent::NotSent), Ok(Abandoned));
        assert!(matches!(Unresolved.next(&IntentEvent::NotSent), Err(ProtocolError::Impossible { .. })));
    }

    #[test]
    fn open_states_adopt_a_job_found_by_name() {
        for s in [Intended, Unresolved, Absent { since: 1.0 }] {
            assert_eq!(s.next(&IntentEvent::Found(ids(&["7"]))), Ok(sub("7")), "{s:?}");
        }
    }

    #[test]
    fn two_jobs_of_one_name_are_refused() {
        for s in [Intended, Unresolved, Absent { since: 1.0 }] {
            assert!(matches!(s.next(&IntentEvent::Found(ids(&["7", "8"]))), Err(ProtocolError::Ambiguous(_))), "{s:?}");
        }
    }

    #[test]
    fn an_incomplete_answer_changes_nothing() {
        for s in [Intended, Unresolved, Absent { since: 1.0 }] {
            assert_eq!(s.next(&none(false, 100.0)), Ok(s.clone()), "{s:?}");
            assert_eq!(s.next(&IntentEvent::Found(BTreeSet::new())), Ok(s.clone()), "{s:?}");
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
            for e in [
                IntentEvent::SbatchOk("2".into()),
                IntentEvent::SbatchFailed,
                IntentEvent::Found(ids(&["3"])),
                none(true, 99.0),
            ] {
                assert_eq!(s.next(&e), Ok(s.clone()), "{s:?} {e:?}");
            }
            assert!(s.is_final());
        }
    }

    #[test]
    fn sbatch_happens_once() {
        for s in [Unresolved, Absent { since: 1.0 }] {
            assert!(matches!(s.next(&IntentEvent::SbatchOk("1".into())), Err(ProtocolError::Impossible { .. })));
            assert!(matches!(s.next(&IntentEvent::SbatchFailed), Err(ProtocolError::Impossible { .. })));
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
