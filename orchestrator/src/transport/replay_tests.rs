use super::*;
use crate::collect::{parse_events, to_record};

fn group_records() -> Records {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/vram-measurements.jsonl");
    Records::load(&path).expect("the group's records load")
}

fn first(recs: &Records, status: MeasuredStatus) -> MeasurementRecord {
    recs.by_hash.values().flatten().map(|(_, r)| r).find(|r| r.status == status).expect("a record").clone()
}

/// A job array as `submit` renders it: manifest beside the script, `--chdir` there.
fn job(dir: &Path, configs: Vec<RunConfig>) -> String {
    job_of(dir, configs, 1)
}

/// [`job`] with `k` configs per array task.
fn job_of(dir: &Path, configs: Vec<RunConfig>, k: u32) -> String {
    let sub = dir.join("sub");
    std::fs::create_dir_all(&sub).expect("mkdir");
    let manifest = Manifest {
        experiment: configs[0].experiment.clone(),
        task_offset: 0,
        configs_per_task: k,
        memory_limit: None,
        configs,
    };
    let n = manifest.tasks();
    std::fs::write(sub.join("manifest.json"), serde_json::to_vec(&manifest).expect("json")).expect("write");
    let script = format!(
        "#!/bin/bash\n#SBATCH --job-name=sweep-x\n#SBATCH --array=0-{}\n#SBATCH --output={}/%a.out\n#SBATCH --chdir={}\nexec worker run\n",
        n - 1,
        sub.display(),
        sub.display()
    );
    let path = sub.join("job.sbatch");
    std::fs::write(&path, script).expect("write");
    path.to_string_lossy().into_owned()
}

#[test]
fn answers_each_config_with_its_record_through_the_event_stream() {
    let d = tempfile::tempdir().expect("tempdir");
    let recs = group_records();
    let ok = first(&recs, MeasuredStatus::Ok);
    let oom = first(&recs, MeasuredStatus::Oom);
    let mut cfgs: Vec<RunConfig> = [&ok, &oom].iter().map(|r| r.run_config().expect("config")).collect();
    for (i, c) in cfgs.iter_mut().enumerate() {
        c.experiment = "exp".into();
        c.name = format!("c{i}");
    }
    let mut unknown = cfgs[0].clone();
    unknown.name = "c2".into();
    unknown.batch += 1000;
    cfgs.push(unknown);
    let t = ReplayTransport::with_records(recs, d.path()).expect("transport");
    assert!(t.describe().contains("replay of"), "{}", t.describe());
    let id = t.submit(&job(d.path(), cfgs.clone())).expect("submit");
    let poll = t.poll(&["sweep-x".to_string()], 0.0).expect("poll");
    let states: Vec<(SlurmState, Option<String>)> =
        poll.tasks.values().map(|o| (o.state.clone(), o.detail.clone())).collect();
    assert_eq!(
        states,
        vec![
            (SlurmState::Completed, Some("0:0".into())),
            (SlurmState::Failed, Some("3:0".into())),
            (SlurmState::Failed, Some("1:0".into()))
        ]
    );
    assert!(poll.tasks.keys().all(|(j, _)| *j == id));
    let events = |i: usize| std::fs::read(d.path().join("exp").join(cfgs[i].events_rel())).expect("events");
    // The measured config: the record's peak comes back through the collect path.
    let p = parse_events(&events(0));
    assert_eq!(p.env.as_ref().map(|e| e.host.as_str()), Some("replay"));
    let back = to_record(&cfgs[0], &p).expect("a measurement");
    assert_eq!(back.peak_gb, ok.peak_gb);
    assert!(back.framework.contains("replay"), "{}", back.framework);
    assert!(p.result.as_ref().and_then(|r| r.message.clone()).is_some_and(|m| m.contains(&ok.id)));
    // The OOM: a measured OOM, not a crash.
    let back = to_record(&cfgs[1], &parse_events(&events(1))).expect("a measurement");
    assert_eq!(back.status, MeasuredStatus::Oom);
    // No record: failed, saying why, in the result and the task's log.
    let p = parse_events(&events(2));
    let r = p.result.expect("a result");
    assert_eq!(r.status, RunStatus::Failed);
    assert!(r.message.as_deref().is_some_and(|m| m.contains("has no record of config c2")), "{:?}", r.message);
    let log = std::fs::read_to_string(d.path().join("sub/2.out")).expect("log");
    assert!(log.contains("replay cluster (no GPU run)") && log.contains("no record"), "{log}");
}

#[test]
fn a_task_of_several_configs_answers_each_and_exits_as_the_worker_does() {
    let d = tempfile::tempdir().expect("tempdir");
    let recs = group_records();
    let oom = first(&recs, MeasuredStatus::Oom);
    let oks: Vec<MeasurementRecord> = recs
        .by_hash
        .values()
        .filter_map(|v| v.first().map(|(_, r)| r.clone()))
        .filter(|r| r.status == MeasuredStatus::Ok && r.gpu().is_some())
        .take(3)
        .collect();
    let config = |r: &MeasurementRecord, name: &str, batch_plus: u32| {
        let mut c = r.run_config().expect("config");
        (c.experiment, c.name, c.batch) = ("exp".into(), name.into(), c.batch + batch_plus);
        c
    };
    // Tasks of two: [ok, oom] → 3; [ok, unknown] → 1 (failed wins over oom); [ok] → 0.
    let cfgs = vec![
        config(&oks[0], "a", 0),
        config(&oom, "b", 0),
        config(&oks[1], "c", 0),
        config(&oks[0], "d", 1000),
        config(&oks[2], "e", 0),
    ];
    let t = ReplayTransport::with_records(recs, d.path()).expect("transport");
    t.submit(&job_of(d.path(), cfgs.clone(), 2)).expect("submit");
    let poll = t.poll(&["sweep-x".to_string()], 0.0).expect("poll");
    let codes: Vec<(u32, Option<String>)> = poll.tasks.values().map(|o| (o.task_id, o.detail.clone())).collect();
    assert_eq!(codes, [(0, Some("3:0".into())), (1, Some("1:0".into())), (2, Some("0:0".into()))]);
    for c in &cfgs {
        let p = parse_events(&std::fs::read(d.path().join("exp").join(c.events_rel())).expect("events"));
        assert!(p.result.is_some(), "{}: every config of a task has its own result", c.name);
    }
    assert_eq!(task_exit_code(&[RunStatus::Ok, RunStatus::Cancelled, RunStatus::Failed]), 143);
    assert_eq!(task_exit_code(&[RunStatus::Oom, RunStatus::Ok]), 3);
    assert_eq!(task_exit_code(&[RunStatus::Ok, RunStatus::Ok]), 0);
}

#[test]
fn a_config_recorded_only_on_another_gpu_is_not_answered() {
    let recs = group_records();
    let ok = first(&recs, MeasuredStatus::Ok);
    let mut cfg = ok.run_config().expect("config");
    cfg.gpu = facts::Gpu::ALL.into_iter().find(|g| Some(*g) != ok.gpu()).expect("another gpu");
    let why = recs.find(&cfg).expect_err("not on that gpu");
    assert!(why.contains("only on"), "{why}");
}

#[test]
fn a_bad_records_line_is_named() {
    let d = tempfile::tempdir().expect("tempdir");
    let p = d.path().join("m.jsonl");
    std::fs::write(&p, "{\"id\": 1}\n").expect("write");
    let e = Records::load(&p).expect_err("bad line");
    assert!(e.to_string().contains("m.jsonl:1"), "{e}");
}

/// What a submitter that died answering leaves: the job's record with every
/// task pending (written before the first answer), task 0's config answered.
fn half_answered(t: &ReplayTransport, dir: &Path, cfgs: &[RunConfig]) -> ReplayJob {
    let script = job(dir, cfgs.to_vec());
    let chdir = directives(&std::fs::read_to_string(&script).expect("script")).chdir.expect("chdir");
    let job = ReplayJob {
        id: reserve_ids(&t.jobs_dir, cfgs.len() as u64 + 1).expect("ids"),
        name: "sweep-x".into(),
        tasks: BTreeMap::new(),
        pending: (0..cfgs.len() as u32).collect(),
        manifest: Some(Path::new(&chdir).join("manifest.json")),
        output: Some(format!("{chdir}/%a.out")),
    };
    t.jobs.save(&job).expect("record");
    t.answer(&cfgs[0], job.id, 0, &job.log(0)).expect("task 0 answered");
    job
}

fn starts(d: &Path, c: &RunConfig) -> usize {
    let events = std::fs::read_to_string(d.join("exp").join(c.events_rel())).unwrap_or_default();
    events.lines().filter(|l| l.contains("\"event\":\"start\"")).count()
}

#[test]
fn a_job_whose_submitter_died_answering_is_finished_by_the_next_poll_answering_nothing_twice() {
    let d = tempfile::tempdir().expect("tempdir");
    let recs = group_records();
    let ok = first(&recs, MeasuredStatus::Ok);
    let cfgs: Vec<RunConfig> = (0..3)
        .map(|i| {
            let mut c = ok.run_config().expect("config");
            (c.experiment, c.name, c.batch) = ("exp".into(), format!("c{i}"), c.batch + i * 1000);
            c
        })
        .collect();
    let t = ReplayTransport::with_records(recs, d.path()).expect("transport");
    let job = half_answered(&t, d.path(), &cfgs);
    // The submitter alive (its lock held): the tasks run, nothing is answered meanwhile.
    let held = t.jobs.lock(job.id, true).expect("lock").expect("held");
    let poll = t.poll(&["sweep-x".to_string()], 0.0).expect("poll");
    assert!(poll.tasks.values().all(|o| o.state == SlurmState::Running), "{:?}", poll.tasks);
    assert_eq!(starts(d.path(), &cfgs[1]), 0, "answered while its submitter holds the job");
    // The submitter dead (its lock released): the poll answers the rest, task 0 once.
    drop(held);
    let poll = t.poll(&["sweep-x".to_string()], 0.0).expect("poll");
    let states: Vec<(u32, SlurmState)> = poll.tasks.values().map(|o| (o.task_id, o.state.clone())).collect();
    assert_eq!(states, [(0, SlurmState::Completed), (1, SlurmState::Failed), (2, SlurmState::Failed)]);
    for c in &cfgs {
        assert_eq!(starts(d.path(), c), 1, "{}: answered exactly once", c.name);
    }
    let done = t.jobs.load(job.id).expect("load").expect("the job");
    assert!(done.pending.is_empty() && done.tasks.len() == 3, "{done:?}");
    // Polled again: nothing more is written.
    t.poll(&["sweep-x".to_string()], 0.0).expect("poll");
    assert!(cfgs.iter().all(|c| starts(d.path(), c) == 1));
}

#[test]
fn a_half_answered_job_that_cannot_be_finished_is_a_node_failure_not_a_failed_poll() {
    let d = tempfile::tempdir().expect("tempdir");
    let recs = group_records();
    let mut cfgs = vec![first(&recs, MeasuredStatus::Ok).run_config().expect("config")];
    cfgs.push(cfgs[0].clone());
    for (i, c) in cfgs.iter_mut().enumerate() {
        (c.experiment, c.name, c.batch) = ("exp".into(), format!("c{i}"), c.batch + i as u32 * 1000);
    }
    let t = ReplayTransport::with_records(recs, d.path()).expect("transport");
    let job = half_answered(&t, d.path(), &cfgs);
    std::fs::remove_file(job.manifest.as_deref().expect("manifest")).expect("the manifest goes");
    let poll = t.poll(&["sweep-x".to_string()], 0.0).expect("the poll still answers");
    let states: Vec<(SlurmState, Option<String>)> =
        poll.tasks.values().map(|o| (o.state.clone(), o.detail.clone())).collect();
    assert_eq!(states[0].0, SlurmState::NodeFail, "{states:?}");
    assert!(states[0].1.as_deref().is_some_and(|d| d.contains("cannot be answered")), "{states:?}");
    assert_eq!(starts(d.path(), &cfgs[0]), 1, "task 0's answer stands, once");
}
