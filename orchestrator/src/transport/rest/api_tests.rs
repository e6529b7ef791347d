//! The answers of each API version: v0.0.38 recorded from the test cluster's
//! slurmrestd (Slurm 22.05.8; `testdata/`, trimmed to the fields read), the
//! v0.0.40–v0.0.42 shapes written from their OpenAPI schemas.

use super::*;
use crate::transport::rest::directives::WarnSignal;

fn names() -> Vec<String> {
    vec!["rec-demo".to_string(), "other".to_string()]
}

fn by_task(obs: &[TaskObservation]) -> Vec<(u32, Option<&str>, String, Option<&str>)> {
    let mut v: Vec<_> =
        obs.iter().map(|o| (o.task_id, o.job_id.as_deref(), o.state.to_string(), o.detail.as_deref())).collect();
    v.sort();
    v
}

#[test]
fn v0038_live_jobs_recorded_expand_the_pending_range_and_skip_foreign_jobs() {
    let jobs: LiveJobs = serde_json::from_str(include_str!("testdata/v0.0.38-jobs.json")).expect("parses");
    let obs = jobs.observations(&names(), "root").expect("parses");
    assert!(obs.iter().all(|o| o.array_job_id == "803" && o.name == "rec-demo"));
    assert_eq!(
        by_task(&obs),
        vec![
            (0, Some("804"), "RUNNING".into(), None),
            (1, Some("805"), "RUNNING".into(), None),
            (2, None, "PENDING".into(), Some("JobArrayTaskLimit")),
            (3, None, "PENDING".into(), Some("JobArrayTaskLimit")),
        ]
    );
    assert!(
        jobs.observations(&names(), "someone-else").expect("parses").is_empty(),
        "squeue --me: another user's jobs are not ours"
    );
    assert!(jobs.observations(&["sweep-x".to_string()], "root").expect("parses").is_empty());
}

#[test]
fn v0038_accounting_jobs_recorded_give_states_and_exit_codes() {
    let jobs: DbJobs = serde_json::from_str(include_str!("testdata/v0.0.38-db-jobs.json")).expect("parses");
    let obs = jobs.observations(&names(), "root").expect("parses");
    assert_eq!(
        by_task(&obs),
        (0..4)
            .map(|t| (t, Some(["804", "805", "806", "803"][t as usize]), "COMPLETED".into(), Some("0:0")))
            .collect::<Vec<_>>()
    );
}

#[test]
fn v0038_submit_answer_recorded() {
    let a: SubmitAnswer = serde_json::from_str(include_str!("testdata/v0.0.38-submit.json")).expect("parses");
    assert_eq!(a.job_id().as_deref(), Some("803"));
    assert!(a.errors.is_empty());
}

/// `GET /slurm/v0.0.40/jobs` (the same in v0.0.41 and v0.0.42): ids and
/// exit codes as `{set, infinite, number}`, states as flag arrays.
const V0040_JOBS: &str = r#"{
  "jobs": [
    {"job_id": 905, "array_job_id": {"set": true, "infinite": false, "number": 903},
     "array_task_id": {"set": true, "infinite": false, "number": 1}, "array_task_string": "",
     "name": "rec-demo", "user_name": "root", "job_state": ["RUNNING"], "state_reason": "None"},
    {"job_id": 903, "array_job_id": {"set": true, "infinite": false, "number": 903},
     "array_task_id": {"set": false, "infinite": false, "number": 0}, "array_task_string": "2-5%2",
     "name": "rec-demo", "user_name": "root", "job_state": ["PENDING"], "state_reason": "JobArrayTaskLimit"},
    {"job_id": 904, "array_job_id": {"set": true, "infinite": false, "number": 903},
     "array_task_id": {"set": true, "infinite": false, "number": 0}, "array_task_string": "",
     "name": "rec-demo", "user_name": "root", "job_state": ["COMPLETED", "COMPLETING"], "state_reason": "None"},
    {"job_id": 910, "array_job_id": {"set": true, "infinite": false, "number": 0},
     "array_task_id": {"set": false, "infinite": false, "number": 0}, "array_task_string": "",
     "name": "rec-demo", "user_name": "root", "job_state": ["RUNNING"], "state_reason": "None"}
  ],
  "last_backfill": {"set": true, "infinite": false, "number": 1795324000},
  "warnings": [], "errors": []
}"#;

#[test]
fn v0040_live_jobs_with_noval_numbers_and_state_arrays() {
    let jobs: LiveJobs = serde_json::from_str(V0040_JOBS).expect("parses");
    let obs = jobs.observations(&names(), "root").expect("parses");
    assert_eq!(
        by_task(&obs),
        vec![
            (0, Some("904"), "COMPLETED".into(), None),
            (1, Some("905"), "RUNNING".into(), None),
            (2, None, "PENDING".into(), Some("JobArrayTaskLimit")),
            (3, None, "PENDING".into(), Some("JobArrayTaskLimit")),
            (4, None, "PENDING".into(), Some("JobArrayTaskLimit")),
            (5, None, "PENDING".into(), Some("JobArrayTaskLimit")),
        ]
    );
}

#[test]
fn a_pending_range_that_does_not_parse_is_an_error_not_an_empty_set() {
    let bad = V0040_JOBS.replace("\"2-5%2\"", "\"2-x\"");
    let jobs: LiveJobs = serde_json::from_str(&bad).expect("parses");
    let e = jobs.observations(&names(), "root").expect_err("a range that does not parse");
    assert!(e.to_string().contains("job 903") && e.to_string().contains("`2-x`"), "{e}");
}

/// `GET /slurmdb/v0.0.41/jobs` (v0.0.40 and v0.0.42 alike): a task killed by
/// SIGTERM (`scancel`) and one that exited 3 (the worker's measured OOM).
const V0041_DB_JOBS: &str = r#"{
  "jobs": [
    {"job_id": 904, "name": "rec-demo", "user": "root",
     "array": {"job_id": 903, "task_id": {"set": true, "infinite": false, "number": 0}, "task": "",
               "limits": {"max": {"running": {"tasks": 2}}}},
     "state": {"current": ["CANCELLED"], "reason": "None"},
     "exit_code": {"status": ["SIGNALED"], "return_code": {"set": true, "infinite": false, "number": 0},
                   "signal": {"id": {"set": true, "infinite": false, "number": 15}, "name": "SIGTERM"}}},
    {"job_id": 905, "name": "rec-demo", "user": "root",
     "array": {"job_id": 903, "task_id": {"set": true, "infinite": false, "number": 1}, "task": ""},
     "state": {"current": ["FAILED"], "reason": "NonZeroExitCode"},
     "exit_code": {"status": ["ERROR"], "return_code": {"set": true, "infinite": false, "number": 3},
                   "signal": {"id": {"set": false, "infinite": false, "number": 0}, "name": ""}}},
    {"job_id": 903, "name": "rec-demo", "user": "root",
     "array": {"job_id": 903, "task_id": {"set": false, "infinite": false, "number": 0}, "task": "2-3"},
     "state": {"current": ["PENDING"], "reason": "JobArrayTaskLimit"}}
  ],
  "warnings": [], "errors": []
}"#;

#[test]
fn v0041_accounting_jobs_with_signals_and_pending_ranges() {
    let jobs: DbJobs = serde_json::from_str(V0041_DB_JOBS).expect("parses");
    let obs = jobs.observations(&names(), "root").expect("parses");
    assert_eq!(
        by_task(&obs),
        vec![
            (0, Some("904"), "CANCELLED".into(), Some("0:15")),
            (1, Some("905"), "FAILED".into(), Some("3:0")),
            (2, None, "PENDING".into(), None),
            (3, None, "PENDING".into(), None),
        ]
    );
}

#[test]
fn submit_answers_of_later_versions() {
    let a: SubmitAnswer = serde_json::from_str(
        r#"{"job_id": 1234, "step_id": "batch", "job_submit_user_msg": "", "result": {"job_id": 1234, "step_id": "batch"},
            "warnings": [], "errors": []}"#,
    )
    .expect("v0.0.42 parses");
    assert_eq!(a.job_id().as_deref(), Some("1234"));
    let refused: SubmitAnswer = serde_json::from_str(
        r#"{"errors": [{"description": "Invalid partition name specified", "error_number": 2000, "error": "Invalid partition name specified", "source": "slurm_submit_batch_job()"}]}"#,
    )
    .expect("an error answer parses");
    assert_eq!(refused.job_id(), None);
    assert_eq!(
        refused.errors[0].to_string(),
        "slurm_submit_batch_job(): Invalid partition name specified (Invalid partition name specified)"
    );
}

fn spec() -> JobSpec {
    JobSpec {
        name: "sweep-e-s1".into(),
        array: Some("0-2".into()),
        output: Some("/w/logs/%a.out".into()),
        chdir: Some("/w/s1".into()),
        ntasks: Some(1),
        partition: Some("gpu".into()),
        time_minutes: Some(90),
        mem_mb: Some(4096),
        gres: Some("gpu:1".into()),
        ..JobSpec::default()
    }
}

#[test]
fn submit_bodies_per_version() {
    let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string())];
    let b = ApiVersion::V0038.submit_body("#!/bin/sh\n", &spec(), &env);
    assert_eq!(b["script"], "#!/bin/sh\n");
    assert_eq!(b["job"]["environment"], json!({"PATH": "/usr/bin:/bin"}));
    assert_eq!(b["job"]["time_limit"], 90);
    assert_eq!(b["job"]["memory_per_node"], 4096);
    assert_eq!(b["job"]["gres"], "gpu:1");
    assert_eq!(b["job"]["name"], "sweep-e-s1");
    assert_eq!(b["job"]["standard_output"], "/w/logs/%a.out");
    assert_eq!(b["job"]["current_working_directory"], "/w/s1");
    assert_eq!(b["job"]["tasks"], 1);

    let b = ApiVersion::V0040.submit_body("#!/bin/sh\n", &spec(), &env);
    assert_eq!(b["script"], "#!/bin/sh\n");
    assert_eq!(b["job"]["environment"], json!(["PATH=/usr/bin:/bin"]));
    assert_eq!(b["job"]["time_limit"], json!({"set": true, "infinite": false, "number": 90}));
    assert_eq!(b["job"]["tres_per_node"], "gres/gpu:1");
    assert!(b["job"].get("script").is_none() && b["job"].get("gres").is_none());

    for v in [ApiVersion::V0041, ApiVersion::V0042] {
        let b = v.submit_body("#!/bin/sh\n", &spec(), &env);
        assert!(b.get("script").is_none(), "{v:?}: the script moved into job");
        assert_eq!(b["job"]["script"], "#!/bin/sh\n");
        assert_eq!(b["job"]["memory_per_node"], json!({"set": true, "infinite": false, "number": 4096}));
    }
}

#[test]
fn the_newest_common_version_is_chosen_from_the_servers_paths() {
    // The paths `GET /openapi/v3` listed on the test cluster (Slurm 22.05.8), abridged.
    let debian = [
        "/slurm/v0.0.38/ping",
        "/slurm/v0.0.38/jobs",
        "/slurm/v0.0.38/job/submit",
        "/slurmdb/v0.0.38/jobs",
        "/openapi/v3",
    ];
    assert_eq!(ApiVersion::choose(debian), Some(ApiVersion::V0038));
    let newer: Vec<String> = ["v0.0.40", "v0.0.41"]
        .iter()
        .flat_map(|t| [format!("/slurm/{t}/jobs"), format!("/slurm/{t}/job/submit"), format!("/slurmdb/{t}/jobs")])
        .collect();
    assert_eq!(ApiVersion::choose(newer.iter().map(String::as_str)), Some(ApiVersion::V0041));
    assert_eq!(ApiVersion::choose(["/slurm/v0.0.39/jobs", "/slurm/v0.0.39/job/submit", "/slurmdb/v0.0.39/jobs"]), None);
    // A version without the accounting plugin cannot poll: not chosen.
    assert_eq!(ApiVersion::choose(["/slurm/v0.0.42/jobs", "/slurm/v0.0.42/job/submit"]), None);
}

#[test]
fn a_chains_signal_requeue_and_append_travel_in_each_versions_shape() {
    let script = "#!/bin/bash\n#SBATCH --job-name=c\n#SBATCH --signal=B:USR1@120\n#SBATCH --requeue\n\
                  #SBATCH --open-mode=append\nexec worker\n";
    let job = JobSpec::from_script("job.sbatch", script).expect("reads");
    assert_eq!(job.signal, Some(WarnSignal { batch: true, name: "USR1".into(), seconds: 120 }));
    assert_eq!((job.requeue, job.append), (Some(true), Some(true)));
    // v0.0.38 (the test cluster's, Slurm 22.05): plain values; its parser
    // refuses `B:USR1@120` ("Invalid SIGNAL specification", seen on the test
    // cluster), so the batch shell's warning is the worker's own (`--signal-before-s`).
    let j = &ApiVersion::V0038.submit_body(script, &job, &[])["job"];
    assert_eq!((&j["requeue"], &j["open_mode"]), (&json!(true), &json!("append")));
    assert!(j.get("signal").is_none(), "{j}");
    let steps = JobSpec::from_script("job.sbatch", "#SBATCH --job-name=c\n#SBATCH --signal=USR1@60\n").expect("reads");
    assert_eq!(ApiVersion::V0038.submit_body(script, &steps, &[])["job"]["signal"], "USR1@60");
    // v0.0.40+: the warning as signal, delay and flags; open mode as flags.
    for v in [ApiVersion::V0040, ApiVersion::V0041, ApiVersion::V0042] {
        let j = &v.submit_body(script, &job, &[])["job"];
        assert_eq!(j["kill_warning_signal"], "USR1");
        assert_eq!(j["kill_warning_delay"], json!({"set": true, "infinite": false, "number": 120}));
        assert_eq!(j["kill_warning_flags"], json!(["BATCH_JOB"]));
        assert_eq!((&j["requeue"], &j["open_mode"]), (&json!(true), &json!(["APPEND"])));
        assert!(j.get("signal").is_none(), "{v:?}: no v0.0.38 field");
    }
    let bad = JobSpec::from_script("job.sbatch", "#SBATCH --job-name=c\n#SBATCH --signal=USR1\n").unwrap_err();
    assert!(bad.why.contains("[B:]SIG@SECONDS"), "{bad}");
}
