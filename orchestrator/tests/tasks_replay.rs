//! Several configs per array task (`worker: {configs_per_task: K}`) through
//! the built-in `replay` cluster: the submit, state, status and resume path
//! of a real cluster, with each task answering its configs from the group's
//! records and exiting as the worker does (0 all ok, 1 one failed, 3 an oom).
//! The real worker on the real test cluster: `cluster_tasks.rs`.

mod common;

use common::orchestrator;

/// Three DiTs the group measured (batch 1), each followed by the same DiT at
/// batch 7, which no record has: tasks of two run one of each.
const EXPERIMENT: &str = "\
name: ktasks
gpu: A100-SXM4-80GB
precision: bf16-amp
input: {channels: 1, spatial: [40, 64, 64]}
output_channels: 1
model: {family: dit, variant: S, patch: 8}
worker: {configs_per_task: 2}
sweep:
  name: \"{model.variant}_b{batch}\"
  grid:
    model.variant: [S, B, L]
    batch: [1, 7]
";

#[test]
fn tasks_of_two_configs_keep_each_configs_result_and_regroup_the_leftovers() {
    let d = tempfile::tempdir().expect("tempdir");
    let (state, file) = (d.path().join("state"), d.path().join("ktasks.yaml"));
    std::fs::write(&file, EXPERIMENT).expect("experiment file");
    let file = file.to_str().expect("utf-8 path");
    let text = orchestrator(&state, &["submit", file, "--cluster", "replay"]);
    assert!(text.contains("submitted 6 configs, 2 per task, in 1 job array(s)"), "{text}");

    // One array of 3 tasks; config i runs in task i / 2; the manifest says K.
    let subs = common::submissions(&state, "ktasks");
    assert_eq!(subs.len(), 1);
    let first = &subs[0];
    assert_eq!((first.array.as_str(), first.configs_per_task, first.tasks.len()), ("0-2", 2, 6));
    let sub_dir = state.join("ktasks/submissions").join(&first.id);
    let manifest: facts::run::Manifest =
        serde_json::from_slice(&std::fs::read(sub_dir.join("manifest.json")).expect("manifest")).expect("json");
    assert_eq!((manifest.configs_per_task, manifest.tasks()), (2, 3));
    let script = std::fs::read_to_string(sub_dir.join("job.sbatch")).expect("script");
    assert!(script.contains("#SBATCH --array=0-2\n") && script.contains("K = 2"), "{script}");

    // Each config keeps its own result though its task FAILED (its partner had no record).
    orchestrator(&state, &["status", "ktasks"]);
    let recs = common::records(&state, "ktasks");
    for (i, variant) in ["S", "B", "L"].into_iter().enumerate() {
        let (ok, unknown) = (&recs[&format!("{variant}_b1")], &recs[&format!("{variant}_b7")]);
        for r in [ok, unknown] {
            let a = &r.attempts()[0];
            assert_eq!((a.task_id(), a.state().map(|s| s.name())), (i as u32, Some("FAILED")), "{}", r.name());
        }
        assert_eq!(ok.result().map(|v| v.status.name()), Some("ok"), "{}", ok.name());
        assert_eq!(unknown.result().map(|v| v.status.name()), Some("failed"), "{}", unknown.name());
    }

    // resume leaves the measured ones alone; the failed need --retry-failed.
    let text = orchestrator(&state, &["resume", "ktasks"]);
    assert!(text.contains("submitted 0 configs: nothing left to send (6 skipped)"), "{text}");
    assert!(!text.contains("0 job array(s) []"), "{text}");
    let text = orchestrator(&state, &["resume", "ktasks", "--retry-failed"]);
    assert!(text.contains("submitted 3 configs, 2 per task, in 1 job array(s)"), "{text}");
    let mut subs = common::submissions(&state, "ktasks");
    subs.sort_by(|a, b| a.id.cmp(&b.id));
    let again = &subs[1];
    let names = |hashes: &[facts::run::ConfigHash]| -> Vec<String> {
        hashes.iter().map(|h| recs.values().find(|r| r.hash() == h).expect("a record").name().to_string()).collect()
    };
    // Three leftovers, two a task: two tasks.
    assert_eq!(again.array, "0-1");
    assert_eq!(names(again.configs_of(0)), ["S_b7", "B_b7"]);
    assert_eq!(names(again.configs_of(1)), ["L_b7"]);
    orchestrator(&state, &["status", "ktasks"]);
    let recs = common::records(&state, "ktasks");
    for v in ["S", "B", "L"] {
        assert_eq!(recs[&format!("{v}_b1")].attempts().len(), 1, "measured once, never resubmitted");
        let r = &recs[&format!("{v}_b7")];
        assert_eq!(r.attempts().len(), 2, "{}", r.name());
        assert_eq!(r.attempts()[1].task_id(), u32::from(v == "L"), "{}", r.name());
    }
    // One measurement per measured config: nothing lost, nothing twice.
    let ms = std::fs::read_to_string(state.join("ktasks/measurements.jsonl")).expect("measurements");
    let ms = facts::record::read_jsonl(&ms).expect("records parse");
    let mut measured: Vec<&str> = ms.iter().filter_map(|m| m.config_name.as_deref()).collect();
    measured.sort();
    assert_eq!(measured, ["B_b1", "L_b1", "S_b1"]);
}
