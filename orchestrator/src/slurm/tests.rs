//! The parsers on output recorded from a real cluster, the state mapping, the retry rule.

use super::*;
use crate::collect::WorkerOutcome;

// Recorded on the test cluster (SLURM 22.05.8): an array of 5 with %2.
const SQUEUE: &str = "\
1_2|1|1|2|sw-a b|PENDING|JobArrayTaskLimit
1_3|1|1|3|sw-a b|PENDING|JobArrayTaskLimit
1_4|1|1|4|sw-a b|PENDING|JobArrayTaskLimit
1_0|2|1|0|sw-a b|RUNNING|None
1_1|3|1|1|sw-a b|RUNNING|None
";
const SACCT: &str = "\
1_0|2|sw-a b|COMPLETED|0:0
1_1|3|sw-a b|CANCELLED by 0|0:15
1_[2-4%2]|1|sw-a b|PENDING|0:0
7_3|12|sw-x|NODE_FAIL|0:0
7_4|13|sw-x|TIMEOUT|0:1
7_5|14|sw-x|OUT_OF_MEMORY|0:125
";

#[test]
fn squeue_lines_become_tasks() {
    let t = parse_squeue(SQUEUE).expect("parses");
    assert_eq!(t.len(), 5);
    assert_eq!(t[0].array_job_id, "1");
    assert_eq!(t[0].task_id, 2);
    assert_eq!(t[0].state, SlurmState::Pending);
    assert_eq!(t[0].detail.as_deref(), Some("JobArrayTaskLimit"));
    assert_eq!(t[3].job_id.as_deref(), Some("2"));
    assert_eq!(t[3].state, SlurmState::Running);
    assert_eq!(t[3].detail, None);
}

#[test]
fn sacct_expands_pending_ranges_and_strips_cancel_author() {
    let t = parse_sacct(SACCT).expect("parses");
    let ids: Vec<_> = t.iter().map(|o| (o.array_job_id.as_str(), o.task_id)).collect();
    assert_eq!(ids, [("1", 0), ("1", 1), ("1", 2), ("1", 3), ("1", 4), ("7", 3), ("7", 4), ("7", 5)]);
    assert_eq!(t[1].state, SlurmState::Cancelled);
    assert_eq!(t[2].job_id, None);
    assert_eq!(t[5].state, SlurmState::NodeFail);
    assert_eq!(t[7].state, SlurmState::OutOfMemory);
}

#[test]
fn merge_prefers_live_squeue_rows() {
    let m = merge(parse_squeue(SQUEUE).expect("squeue"), parse_sacct(SACCT).expect("sacct"));
    assert_eq!(m[&("1".into(), 1)].state, SlurmState::Running, "squeue is live");
    assert_eq!(m[&("1".into(), 0)].state, SlurmState::Running);
    assert_eq!(m[&("7".into(), 4)].state, SlurmState::Timeout, "only sacct knows it");
    assert_eq!(m.len(), 8);
}

#[test]
fn bad_lines_are_errors_not_guesses() {
    assert!(parse_squeue("1_2|1|1|x|n|PENDING|None").is_err());
    assert!(parse_squeue("garbage").is_err());
    assert!(parse_sacct("1_[2-x]|1|n|PENDING|0:0").is_err());
}

#[test]
fn every_slurm_state_maps() {
    use Activity::*;
    let cases = [
        ("PENDING", Queued),
        ("RUNNING", Running),
        ("REQUEUED", Queued),
        ("SUSPENDED", Running),
        ("PREEMPTED", Ended),
        ("COMPLETED", Ended),
        ("FAILED", Ended),
        ("TIMEOUT", Ended),
        ("OUT_OF_MEMORY", Ended),
        ("NODE_FAIL", Ended),
        ("CANCELLED", Ended),
        ("BOOT_FAIL", Ended),
        ("DEADLINE", Ended),
        ("COMPLETING", Running),
        ("REQUEUE_HOLD", Queued),
        ("PD", Queued),
        ("CG", Running),
    ];
    for (s, a) in cases {
        let st = SlurmState::parse(s);
        assert_eq!(st.activity(), a, "{s}");
    }
    // Named states round-trip through their names.
    for s in [
        "PENDING",
        "RUNNING",
        "REQUEUED",
        "SUSPENDED",
        "PREEMPTED",
        "COMPLETED",
        "FAILED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "CANCELLED",
        "BOOT_FAIL",
        "DEADLINE",
    ] {
        let st = SlurmState::parse(s);
        assert!(!matches!(st, SlurmState::Other(_)), "{s} is a named state");
        assert_eq!(st.name(), s);
    }
}

#[test]
fn retry_policy_follows_the_issue() {
    let p = RetryPolicy::default();
    for s in ["NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "TIMEOUT", "CANCELLED"] {
        assert!(p.retryable(&SlurmState::parse(s)), "{s} retryable");
    }
    for s in ["COMPLETED", "OUT_OF_MEMORY", "DEADLINE", "FAILED", "PENDING", "RUNNING", "REQUEUED", "SUSPENDED"] {
        assert!(!p.retryable(&SlurmState::parse(s)), "{s} not retryable");
    }
    let strict = RetryPolicy { timeout: false, ..p };
    assert!(!strict.retryable(&SlurmState::Timeout));
}

#[test]
fn the_worker_result_decides_over_the_slurm_state() {
    use facts::event::RunStatus;
    use WorkerOutcome::*;
    let p = RetryPolicy::default();
    let failed = SlurmState::Failed;
    // A measured OOM is a result: never again, although SLURM says FAILED (exit 3).
    assert_eq!(p.refusal(&failed, Result(RunStatus::Oom)).as_deref(), Some("measured oom"));
    assert!(p.refusal(&SlurmState::NodeFail, Result(RunStatus::Oom)).is_some());
    assert!(p.refusal(&SlurmState::Completed, Result(RunStatus::Ok)).is_some());
    // Killed from outside (SIGKILL, host OOM killer): nothing measured, retried.
    assert_eq!(p.refusal(&failed, NoResult), None);
    assert_eq!(p.refusal(&SlurmState::OutOfMemory, NoResult), None);
    assert_eq!(p.refusal(&SlurmState::OutOfMemory, NotStarted), None);
    assert_eq!(p.refusal(&SlurmState::NodeFail, NoResult), None);
    assert_eq!(p.refusal(&SlurmState::NodeFail, NotStarted), None);
    let no_killed = RetryPolicy { killed: false, ..p };
    assert!(no_killed.refusal(&failed, NoResult).unwrap().contains("--no-retry-killed"));
    assert_eq!(no_killed.refusal(&SlurmState::NodeFail, NoResult), None, "node failures always");
    // A real error stays down unless asked.
    assert!(p.refusal(&failed, Result(RunStatus::Failed)).unwrap().contains("--retry-failed"));
    assert!(p.refusal(&failed, NotStarted).unwrap().contains("before the worker started"));
    let retry_failed = RetryPolicy { failed: true, ..p };
    assert_eq!(retry_failed.refusal(&failed, Result(RunStatus::Failed)), None);
    assert_eq!(retry_failed.refusal(&failed, NotStarted), None);
    // Cancelled by the worker's SIGTERM handler: the time limit or a cancel.
    assert_eq!(p.refusal(&SlurmState::Timeout, Result(RunStatus::Cancelled)), None);
    assert_eq!(p.refusal(&SlurmState::Cancelled, Result(RunStatus::Cancelled)), None);
    let strict = RetryPolicy { timeout: false, cancelled: false, ..p };
    assert!(strict.refusal(&SlurmState::Timeout, Result(RunStatus::Cancelled)).is_some());
    assert!(strict.refusal(&SlurmState::Cancelled, NoResult).is_some());
    assert!(p.refusal(&SlurmState::Deadline, NoResult).is_some());
}

#[test]
fn sbatch_and_scontrol_outputs() {
    assert_eq!(parse_sbatch("1234\n"), Ok("1234".into()));
    assert_eq!(parse_sbatch("1234;idun\n"), Ok("1234".into()));
    assert!(parse_sbatch("sbatch: error: invalid partition").is_err());
    let cfg = "Configuration data as of 2026-01-01\nMaxArraySize            = 100\nMaxJobCount = 10000\n";
    assert_eq!(parse_max_array_size(cfg), 100);
    assert_eq!(parse_max_array_size("nothing"), 1001);
}

#[test]
fn arrays_are_split_below_max_array_size() {
    assert_eq!(chunks(120, 100), vec![0..100, 100..120]);
    assert_eq!(chunks(20, 1001), vec![0..20]);
    assert_eq!(array_spec(20, Some(4)), "0-19%4");
    assert_eq!(array_spec(20, None), "0-19");
    assert_eq!(array_spec(1, Some(4)), "0");
    assert_eq!(array_spec(3, Some(8)), "0-2");
}

#[test]
fn slugs_are_inert() {
    assert_eq!(slug("exp9", 20), "exp9");
    assert_eq!(slug("$(touch /tmp/x)'\n", 40), "--touch--tmp-x---");
    assert_eq!(slug("", 5), "x");
}
