//! The report against a state directory built through the real state API
//! (sweep expansion, `StateDir`, config records, attempts) and event files in
//! the worker's exact line format; and the records mode.

use super::*;
use crate::collect::WorkerOutcome;
use crate::precheck::Predictor;
use crate::precheck::Verdict;
use crate::slurm::JobId;
use crate::slurm::SlurmState;
use crate::state::intent::IntentState;
use crate::state::{ArrayJob, Change, ConfigRecord, EventsRead, Seen, StateDir, StoredSweep, Submission};
use crate::sweep::SweepConfig;
use facts::event::RunResult;
use facts::record::MeasuredStatus;
use std::collections::BTreeSet;
use std::time::Duration;

const GIB_U: u64 = 1 << 30;

const SWEEP: &str = r#"
name: rep
description: report test sweep
gpu: A100-SXM4-80GB
precision: bf16-amp
budget_gb: 60
input: {channels: 1, spatial: [160, 256, 256]}
output_channels: 1
model: {family: dit, variant: S, patch: 8}
sweep:
  configs:
    - {name: dit_S_p8, model: {family: dit, variant: S, patch: 8}}
    - {name: dit_S_p3, model: {family: dit, variant: S, patch: 3}}
    - {name: dit_B_p8, model: {family: dit, variant: B, patch: 8}}
    - {name: dit_L_p8, model: {family: dit, variant: L, patch: 8}}
    - {name: dit_XL_p8, model: {family: dit, variant: XL, patch: 8}}
    - {name: dit_XL_p2, model: {family: dit, variant: XL, patch: 2}}
    - {name: unet_3L, model: {family: unet, channels: [32, 64, 64], attention_levels: [false, false, true], num_res_blocks: 1, num_head_channels: 32}}
"#;

/// A `start` line as the worker writes it.
fn start(name: &str, hash: &str) -> String {
    format!(
        r#"{{"event":"start","t":1795215785.9,"config":"{name}","config_hash":"{hash}","env":{{"host":"gpu-node-7","device":"NVIDIA A100-SXM4-80GB","driver":"550.54.15","backend":"vulkan","dtype":"bf16","grad_ckpt":false,"slurm_job_id":"1001","slurm_array_task_id":"0"}}}}"#
    )
}

/// What `submit`, polls and the collector leave for config `c`, through the
/// store's changes: judged `v`; then, for a `run`, submitted alone as array
/// job `1000 + task`, seen in its state as job `1001 + task`, and the result
/// its events gave.
fn record(st: &mut StateDir, c: &SweepConfig, v: &Verdict, run: Option<(u32, SlurmState, Option<RunResult>)>) {
    let hash = c.hash.clone();
    st.apply(Change::Config(Seen {
        hash: hash.clone(),
        name: c.name.clone(),
        verdict: Some(v.kind()),
        predicted_gib: v.predicted_gib(),
        calibration: None,
    }))
    .expect("judged");
    let Some((task, state, result)) = run else { return };
    let job = ArrayJob {
        job_name: format!("rep-{task}"),
        comment: "c".into(),
        array: "0".into(),
        configs: vec![hash.clone()],
        configs_per_task: 1,
    };
    let mut sub = Submission::new(format!("s{task:03}-abcd"), job, "/x".into());
    sub.intended_at = 1795215780.0;
    st.apply(Change::Intent { submission: sub.clone() }).expect("intent");
    let from = sub.state();
    sub.set_state(IntentState::Submitted { job_id: JobId::from(format!("{}", 1000 + task).as_str()) });
    st.apply(Change::Move { from, submission: sub.clone() }).expect("submitted");
    let job_id = Some(JobId::from(format!("{}", 1001 + task).as_str()));
    let observed = Change::Observed {
        submission: sub.id.clone(),
        task: 0,
        configs: sub.tasks.clone(),
        state,
        detail: None,
        job_id,
    };
    st.apply(observed).expect("polled");
    if let Some(result) = result {
        let worker = WorkerOutcome::Result(result.status);
        let read = EventsRead { worker, offset: 0, mine: true, live: None, result: Some(result), chain: None };
        st.apply(Change::Events { hash, read }).expect("events read");
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    sweep: crate::sweep::Sweep,
    records: BTreeMap<String, ConfigRecord>,
}

/// dit_S_p8's events: every phase ended, `ok`.
fn ok_events(name: &str, h: &str) -> Vec<String> {
    vec![
        start(name, h),
        format!(r#"{{"event":"phase_end","t":1795215786.0,"phase":"model","peak_bytes":{},"seconds":0.5}}"#, GIB_U),
        format!(
            r#"{{"event":"heartbeat","t":1795215786.5,"phase":"fwd","current_bytes":{},"peak_bytes":{}}}"#,
            8 * GIB_U,
            9 * GIB_U
        ),
        format!(r#"{{"event":"phase_end","t":1795215787.0,"phase":"fwd","peak_bytes":{},"seconds":1.0}}"#, 12 * GIB_U),
        format!(r#"{{"event":"phase_end","t":1795215788.0,"phase":"bwd","peak_bytes":{},"seconds":1.0}}"#, 20 * GIB_U),
        format!(
            r#"{{"event":"result","t":1795215789.0,"status":"ok","params":32912384,"peaks":{{"model":{},"fwd":{},"bwd":{},"step":{}}},"peak_bytes":{},"wall_s":3.1}}"#,
            GIB_U,
            12 * GIB_U,
            20 * GIB_U,
            5 * GIB_U,
            20 * GIB_U
        ),
    ]
}

/// dit_B_p8's events: out of memory in `bwd`.
fn oom_events(name: &str, h: &str) -> Vec<String> {
    vec![
        start(name, h),
        format!(r#"{{"event":"phase_end","t":1795215786.0,"phase":"model","peak_bytes":{},"seconds":0.5}}"#, 2 * GIB_U),
        format!(
            r#"{{"event":"result","t":1795215789.0,"status":"oom","params":130000000,"peaks":{{"model":{},"fwd":{}}},"peak_bytes":{},"phase":"bwd","message":"allocation of 2147483648 bytes refused (limit 85899345920)","wall_s":2.0}}"#,
            2 * GIB_U,
            40 * GIB_U,
            70 * GIB_U
        ),
    ]
}

/// dit_L_p8's events: still running, the last line torn mid-write.
fn running_events(name: &str, h: &str) -> Vec<String> {
    vec![
        start(name, h),
        format!(
            r#"{{"event":"heartbeat","t":1795215786.5,"phase":"fwd","current_bytes":{},"peak_bytes":{}}}"#,
            8 * GIB_U,
            9 * GIB_U
        ),
        r#"{"event":"heartbeat","t":1795215787.5,"pha"#.to_string(),
    ]
}

/// unet_3L's result as the record keeps it (its events not pulled yet).
fn stored_result() -> facts::event::RunResult {
    serde_json::from_value(serde_json::json!({
        "event": "result", "t": 1795215789.0, "status": "ok", "params": 1234567,
        "peaks": {"model": GIB_U / 2, "fwd": 3 * GIB_U, "bwd": 4 * GIB_U, "step": GIB_U},
        "peak_bytes": 4 * GIB_U, "wall_s": 9.5
    }))
    .expect("a result")
}

/// Writes the state a submit + status would leave: sweep.json, a record per
/// config with the precheck's verdict, attempts, events files.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("state");
    let sweep = crate::sweep::parse(Path::new("rep.yaml"), SWEEP, &[]).expect("sweep parses");
    let mut st = StateDir::open(&root, "rep", Duration::ZERO).expect("state opens");
    st.save_sweep(&StoredSweep { cluster: "local".into(), sweep: sweep.clone(), clusters_file: None })
        .expect("sweep.json");
    let p = Predictor::pytorch();
    for (task, c) in sweep.configs.iter().enumerate() {
        let v = if c.is_valid() {
            p.verdict(&c.config, Some(60.0))
        } else {
            crate::precheck::Verdict::Invalid { reasons: vec![] }
        };
        let h = &c.hash;
        let (state, events) = match c.name.as_str() {
            "dit_S_p8" => (SlurmState::Completed, Some(ok_events(&c.name, h))),
            "dit_B_p8" => (SlurmState::Completed, Some(oom_events(&c.name, h))),
            "dit_L_p8" => (SlurmState::Running, Some(running_events(&c.name, h))),
            "dit_XL_p8" => (SlurmState::Failed, None),
            // Events not pulled (yet): the record's copy of the result is used.
            "unet_3L" => (SlurmState::Completed, None),
            _ => {
                // dit_XL_p2 (predicted oom, never submitted), dit_S_p3 (invalid)
                record(&mut st, c, &v, None);
                continue;
            }
        };
        let text = events.map(|lines| lines.join("\n") + "\n");
        let result = match &text {
            Some(text) => crate::submit::last_result(text),
            None if c.name == "unet_3L" => Some(stored_result()),
            None => None,
        };
        record(&mut st, c, &v, Some((task as u32, state, result)));
        if let Some(text) = text {
            let r = st.record(h).expect("recorded");
            let rel = r.latest().and_then(|a| r.events_rel(a)).expect("a run directory");
            st.keep_events(&rel, "", 0, text.as_bytes()).expect("events");
        }
    }
    let records = st.records().values().map(|r| (r.name().to_string(), r.clone())).collect();
    drop(st);
    Fixture { _dir: dir, root, sweep, records }
}

fn row<'a>(rep: &'a Report, name: &str) -> &'a Row {
    rep.rows.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("no row {name}"))
}

#[test]
fn rows_match_the_state_directory() {
    let f = fixture();
    // Another orchestrator holding the lock does not block a report. (Taking
    // it may wait: a child another test forks in this process holds a copy of
    // the fixture's lock until it execs.)
    let _lock = StateDir::open(&f.root, "rep", Duration::from_secs(10)).expect("lock free again");
    let rep = from_state(&f.root, "rep", Some(&Predictor::pytorch())).expect("report");
    assert_eq!(rep.rows.len(), f.sweep.configs.len(), "one row per config, none dropped");
    let names: Vec<&str> = rep.rows.iter().map(|r| r.name.as_str()).collect();
    let sweep_names: Vec<&str> = f.sweep.configs.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, sweep_names, "sweep order");
    for r in &rep.rows {
        let rec = &f.records[&r.name];
        assert_eq!(r.id, rec.hash().as_str());
        assert_eq!(Some(r.verdict), rec.verdict(), "{}", r.name);
        if r.status != Status::Invalid {
            assert_eq!(r.predicted_gib, rec.predicted_gib(), "{}: the prediction submit decided on", r.name);
        }
    }
    each_status_reads_as_its_files_say(&rep);
    header_groups_and_summary_follow_the_rows(&rep);
    markdown_shows_the_rows(&rep);
}

/// One row per kind of config the fixture holds: ok, oom, running, failed,
/// skipped, invalid, and a result kept only in the record.
fn each_status_reads_as_its_files_say(rep: &Report) {
    let ok = row(rep, "dit_S_p8");
    assert_eq!(ok.status, Status::Ok);
    assert_eq!((ok.model_gib, ok.fwd_gib, ok.bwd_gib, ok.peak_gib), (Some(1.0), Some(12.0), Some(20.0), Some(20.0)));
    assert_eq!(ok.params, Some(32912384));
    assert_eq!(ok.tokens, Some(20 * 32 * 32));
    assert_eq!(ok.group, "DiT-S");
    let pred = ok.predicted_gib.expect("predicted");
    let err = ok.error_pct().expect("error");
    assert!((err - (pred - 20.0) / 20.0 * 100.0).abs() < 1e-9);

    let oom = row(rep, "dit_B_p8");
    assert_eq!(oom.status, Status::Oom);
    assert_eq!(oom.peak_gib, None);
    assert_eq!(oom.oom_at_gib, Some(70.0));
    assert_eq!(oom.detail.as_deref(), Some("in bwd"));

    let running = row(rep, "dit_L_p8");
    assert_eq!(running.status, Status::Running);
    assert!(
        running.detail.as_deref().is_some_and(|d| d.contains("in fwd") && d.contains("9.00 GiB")),
        "{:?}",
        running.detail
    );

    let failed = row(rep, "dit_XL_p8");
    assert_eq!(failed.status, Status::Failed);
    assert!(failed.detail.as_deref().is_some_and(|d| d.contains("FAILED")));

    let skipped = row(rep, "dit_XL_p2");
    assert_eq!(skipped.verdict, "oom", "DiT-XL at 2.6M tokens cannot fit 80 GB");
    assert_eq!(skipped.status, Status::SkippedOom);

    let invalid = row(rep, "dit_S_p3");
    assert_eq!(invalid.status, Status::Invalid);
    assert!(invalid.detail.as_deref().is_some_and(|d| d.contains('3')), "{:?}", invalid.detail);

    let unet = row(rep, "unet_3L");
    assert_eq!(unet.status, Status::Ok);
    assert_eq!(unet.peak_gib, Some(4.0));
    assert_eq!(unet.group, "UNet, 3 levels");
}

fn header_groups_and_summary_follow_the_rows(rep: &Report) {
    // Header from the worker's start events.
    assert!(rep.env.devices.contains("NVIDIA A100-SXM4-80GB"));
    assert!(rep.env.drivers.contains("550.54.15"));
    assert!(rep.env.backends.contains("vulkan"));
    assert_eq!(rep.budget_gib, 60.0);

    // Grouping as the reports do: by variant, UNets by levels.
    let groups: Vec<String> = rep.groups().into_iter().map(|((_, g), _)| g).collect();
    assert_eq!(groups, ["DiT-S", "DiT-B", "DiT-L", "DiT-XL", "UNet, 3 levels"]);

    let s = rep.summary();
    assert_eq!(s.never_run, ["dit_S_p3", "dit_XL_p2"]);
    assert_eq!(s.best.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(), ["dit_S_p8", "unet_3L"]);
    assert_eq!(s.largest_tokens.len(), 1);
    assert_eq!(s.largest_tokens[0].tokens, 20480);
    assert_eq!(s.measured, 2);
    assert_eq!(s.counts["OK"], 2);
}

fn markdown_shows_the_rows(rep: &Report) {
    let md = markdown::render(rep, &[], Path::new("."));
    assert!(md.contains("| dit_S_p8 | 256x256x160 | 8 | 20,480 | 32.9M | 1.0G | 12.0G | 20.0G | 20.0G |"), "{md}");
    assert!(md.contains("OK (59.2GB free)"));
    assert!(md.contains("OOM (at 70.0G, in bwd)"));
    assert!(md.contains("skipped: predicted OOM"));
    assert!(md.contains("| Driver | 550.54.15 |"));
    assert!(md.contains("| unet_3L | [32, 64, 64] | FFT |"), "{md}");
    assert!(md.contains("### Never run"));
}

#[test]
fn writes_markdown_json_and_plots() {
    let f = fixture();
    let rep = from_state(&f.root, "rep", Some(&Predictor::pytorch())).expect("report");
    let out = f.root.join("rep/report");
    match write(&rep, &out) {
        Ok((md, plots)) => {
            assert!(md.ends_with("report.md"));
            let text = std::fs::read_to_string(&md).expect("md");
            assert!(text.contains("![predicted_vs_measured.png](predicted_vs_measured.png)"));
            let names: Vec<String> =
                plots.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
            for want in
                ["predicted_vs_measured.svg", "predicted_vs_measured.png", "peak_vs_tokens.png", "verdict_map_dit.png"]
            {
                assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
            }
            let png = std::fs::read(out.join("verdict_map_dit.png")).expect("png");
            assert_eq!(&png[1..4], b"PNG");
            let svg = std::fs::read_to_string(out.join("verdict_map_dit.svg")).expect("svg");
            assert!(svg.contains("DiT-XL") && svg.contains("not run"));
        }
        // A machine without any TrueType font: the error must say how to fix it.
        Err(ReportError::Plot(why)) => assert!(why.contains("ORCHESTRATOR_FONT"), "{why}"),
        Err(e) => panic!("{e}"),
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap_or_default())
            .unwrap_or_else(|_| json(&rep));
    assert_eq!(v["rows"].as_array().map(Vec::len), Some(7));
    assert_eq!(v["rows"][0]["status"], "ok");
    assert_eq!(v["summary"]["never_run"][1], "dit_XL_p2");
}

#[test]
fn unknown_experiment_says_where_it_looked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = from_state(dir.path(), "nope", None).expect_err("no state");
    assert!(e.to_string().contains("no state for experiment `nope`"), "{e}");
    assert!(matches!(from_state(dir.path(), "../x", None), Err(ReportError::State(_))));
}

const RECORDS: &str = r#"{"id":"t/4L_large","table":"exp9 4x","family":"unet","framework":"pytorch","gpu":"A100-SXM4-80GB","precision":"bf16-amp","grad_ckpt":false,"batch":1,"in_channels":8,"out_channels":4,"spatial":[40,64,64],"channels":[256,512,1024,2048],"attention_levels":[false,false,true,true],"num_res_blocks":2,"num_head_channels":64,"params_m":2664.6,"peak_gb":49.7,"model_gb":10.0,"fwd_gb":31.0,"bwd_gb":31.0,"status":"ok","config_name":"4L_large"}
{"id":"t/dit_xl_p2","table":"exp13","family":"dit","framework":"pytorch","gpu":"A100-SXM4-80GB","precision":"bf16-amp","grad_ckpt":false,"batch":1,"in_channels":1,"out_channels":1,"spatial":[80,64,64],"variant":"XL","patch":2,"tokens":40960,"params_m":498.7,"peak_gb":62.1,"status":"over_budget","config_name":"XL p2"}
{"id":"t/dit_xl_p2_big","table":"exp14","family":"dit","framework":"pytorch","gpu":"A100-SXM4-80GB","precision":"bf16-amp","grad_ckpt":false,"batch":1,"in_channels":1,"out_channels":1,"spatial":[160,128,128],"variant":"XL","patch":2,"tokens":327680,"peak_gb":null,"oom_reported_gb":78.9,"status":"oom","config_name":"XL p2 128"}
"#;

#[test]
fn records_mode_rows_and_predictions() {
    let recs = facts::record::read_jsonl(RECORDS).expect("records");
    let rep = from_records(&recs, "inline".into(), &Predictor::pytorch());
    assert_eq!(rep.rows.len(), 3);
    let unet = &rep.rows[0];
    assert_eq!((unet.status, unet.peak_gib, unet.params), (Status::Ok, Some(49.7), Some(2_664_600_000)));
    assert_eq!(unet.group, "UNet, 4 levels");
    assert_eq!(unet.section, "exp9 4x");
    assert!(unet.predicted_gib.is_some_and(|p| (p - 49.7).abs() < 0.25 * 49.7), "{:?}", unet.predicted_gib);
    assert_eq!(rep.rows[1].status, Status::OverBudget);
    assert_eq!(rep.rows[1].tokens, Some(40960));
    let oom = &rep.rows[2];
    assert_eq!((oom.status, oom.oom_at_gib), (Status::Oom, Some(78.9)));
    assert_eq!(oom.verdict, "oom", "the precheck calls the measured OOM");
    assert_eq!(rep.sections().len(), 3);
    assert!(rep.env.backends.contains("pytorch"));
    let md = markdown::render(&rep, &[], Path::new("."));
    assert!(md.contains("## exp13") && md.contains("### DiT-XL"));
    assert!(
        md.contains("| 4L_large | [256, 512, 1024, 2048] | FFTT | 2664.6M | 10.0G | 31.0G | 31.0G | 49.7G |"),
        "{md}"
    );
    assert!(md.contains("over budget (>60GB)"));
    // Predicted vs measured has the two that ran and the OOM (at the capacity).
    assert_eq!(plot::PredVsMeasured::new(&rep).len(), 3);
}

#[test]
fn records_mode_on_the_groups_data() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/vram-measurements.jsonl");
    if !path.exists() {
        eprintln!("skipping: {} not present", path.display());
        return;
    }
    let recs = read_records_files(std::slice::from_ref(&path)).expect("records");
    let rep = from_records(&recs, path.display().to_string(), &Predictor::pytorch());
    assert_eq!(rep.rows.len(), recs.len(), "every record a row");
    assert!(rep.rows.iter().all(|r| r.predicted_gib.is_some()), "every record predicted");
    let s = rep.summary();
    let measured = recs.iter().filter(|r| r.peak_gb.is_some()).count();
    assert_eq!(s.measured, measured);
    // The shipped calibration is fitted on these: the report must show that.
    assert!(s.median_abs_error_pct.is_some_and(|m| m < 10.0), "{:?}", s.median_abs_error_pct);
    assert!(!s.largest_tokens.is_empty() && !s.best.is_empty());
    let oom_records = recs.iter().filter(|r| r.status == MeasuredStatus::Oom).count();
    assert_eq!(rep.rows.iter().filter(|r| r.status == Status::Oom).count(), oom_records);
}

/// A report of the given rows (plots' unit tests build rows directly).
pub(super) fn report_of(rows: Vec<Row>) -> Report {
    Report {
        title: "t".into(),
        description: String::new(),
        source: "inline".into(),
        gpus: ["A100-40GB".to_string()].into(),
        capacity_gib: rows.first().map(|r| r.capacity_gib).unwrap_or(39.4),
        host_memory: false,
        budget_gib: 60.0,
        budget_set: false,
        precisions: BTreeSet::new(),
        predictor: "burn-flex/fp32".into(),
        predicted_by: BTreeSet::new(),
        active: None,
        env: Environment::default(),
        rows,
        twins: Vec::new(),
        layout: ReportLayout::Project,
    }
}

#[test]
fn an_oom_under_a_worker_memory_limit_is_at_that_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("state");
    let text = SWEEP.replace("budget_gb: 60\n", "budget_gb: 60\nworker: {memory_limit: 512MiB}\n");
    let sweep = crate::sweep::parse(Path::new("rep.yaml"), &text, &[]).expect("sweep parses");
    let mut st = StateDir::open(&root, "rep", Duration::ZERO).expect("state opens");
    st.save_sweep(&StoredSweep { cluster: "local".into(), sweep: sweep.clone(), clusters_file: None })
        .expect("sweep.json");
    let c = &sweep.configs[0];
    let result = serde_json::from_value(serde_json::json!({
        "event": "result", "t": 1795215789.0, "status": "oom", "params": 32912384,
        "peaks": {"model": 1 << 20}, "peak_bytes": 500 << 20, "phase": "fwd", "wall_s": 0.2
    }))
    .expect("a result");
    let fits = Verdict::Fits { predicted_gib: 1.5, available_gib: 80.0 };
    record(&mut st, c, &fits, Some((0, SlurmState::Completed, Some(result))));
    drop(st);
    let rep = from_state(&root, "rep", Some(&Predictor::pytorch())).expect("report");
    let oom = row(&rep, "dit_S_p8");
    assert_eq!(oom.status, Status::Oom);
    assert_eq!(oom.limit_gib, 0.5, "512 MiB, not the GPU's {} GiB", oom.capacity_gib);
    assert_eq!(row(&rep, "dit_B_p8").limit_gib, 0.5, "the limit applies to every run of the sweep");
}

/// Two configs of one model under two names (the group's `4L_maisi` is
/// `4L_small`): the sweep plans it once, the report keeps both rows, measured
/// once and reported under each name, in the project's layout and the group's;
/// the counts and summaries count it once.
#[test]
fn a_model_under_two_names_is_reported_under_each() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("state");
    let twin = "    - {name: unet_3L_again, model: {family: unet, channels: [32, 64, 64], attention_levels: [false, false, true], num_res_blocks: 1, num_head_channels: 32}}\n";
    let text = format!("{SWEEP}{twin}");
    let sweep = crate::sweep::parse(Path::new("rep.yaml"), &text, &[]).expect("sweep parses");
    assert_eq!(sweep.collapsed, [("unet_3L_again".to_string(), "unet_3L".to_string())]);
    let mut st = StateDir::open(&root, "rep", Duration::ZERO).expect("state opens");
    st.save_sweep(&StoredSweep { cluster: "local".into(), sweep: sweep.clone(), clusters_file: None })
        .expect("sweep.json");
    let c = sweep.get("unet_3L").expect("kept under its first name");
    let fits = Verdict::Fits { predicted_gib: 4.0, available_gib: 80.0 };
    record(&mut st, c, &fits, Some((0, SlurmState::Completed, Some(stored_result()))));
    drop(st);
    let mut rep = from_state(&root, "rep", Some(&Predictor::pytorch())).expect("report");
    assert_eq!(rep.rows.len(), sweep.configs.len(), "one row per model");
    assert_eq!(rep.twins, [Twin { name: "unet_3L_again".into(), same_as: "unet_3L".into() }]);

    let md = markdown::render(&rep, &[], Path::new("."));
    let first = md.lines().find(|l| l.starts_with("| unet_3L |")).expect("the measured row");
    let again = md.lines().find(|l| l.starts_with("| unet_3L_again ")).expect("its second name");
    assert_eq!(again, first.replacen("| unet_3L |", "| unet_3L_again (same model as unet_3L) |", 1));
    assert!(md.contains(&format!("\n{} configs: ", sweep.configs.len())), "counted once");
    assert!(md.contains("1 more under a second name, each the same model as a config above: measured once, reported under each name (unet_3L_again = unet_3L)."), "{md}");
    assert_eq!(json(&rep)["twins"][0]["same_as"], "unet_3L");

    rep.layout = ReportLayout::LatentUnet;
    let group = group::render(&rep);
    let first = group.lines().find(|l| l.starts_with("| unet_3L |")).expect("the measured row");
    assert!(first.ends_with("| 1.2M | 0.5G | 3.0G | 4.0G | 4.0G | OK |"), "{first}");
    let again = group.lines().find(|l| l.starts_with("| unet_3L_again |")).expect("its second name");
    assert_eq!(again, first.replacen("unet_3L", "unet_3L_again", 1));
}
