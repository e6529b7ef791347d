//! `submit --active` on the built-in `replay` cluster (the group's records):
//! the same submit, state, status and report path as a real cluster, and
//! every output says it replays.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::orchestrator;
use orchestrator::state::StateFile;

/// The names of an experiment file's configs, as the sweep plans them.
fn config_names(file: &str) -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let sweep = orchestrator::sweep::load(&root.join(file), &[]).expect("experiment file");
    sweep.configs.into_iter().map(|c| c.name).collect()
}

/// Whether a markdown table row is one of `names`' (its first cell a config name).
fn is_config_row(row: &str, names: &BTreeSet<String>) -> bool {
    row.strip_prefix("| ").and_then(|r| r.split(" | ").next()).is_some_and(|name| names.contains(name))
}

#[test]
fn an_active_sweep_on_the_replay_cluster_measures_a_few_and_predicts_the_rest() {
    let d = tempfile::tempdir().expect("tempdir");
    let state = d.path().join("state");
    let args = ["submit", "experiments/exp13.yaml", "--cluster", "replay", "--active", "--poll-interval", "0.2"];
    let text = orchestrator(&state, &args);
    let names = config_names("experiments/exp13.yaml");
    let n = names.len();
    assert!(text.contains("round 1:"), "{text}");
    let (measured, predicted) = text.split_once("predicted (not run):").expect("measured and predicted apart");
    let n_measured = measured.lines().filter(|l| l.starts_with("  ")).count();
    let n_predicted = predicted.lines().filter(|l| l.starts_with("  ") && l.contains(", predicted ")).count();
    assert!(n_measured >= 1 && n_measured + n_predicted == n, "{text}");
    assert!(n_predicted > n_measured, "most of the sweep is predicted:\n{text}");
    assert!(text.contains(&format!("{n} configs: {n_measured} measured, {n_predicted} predicted")), "{text}");
    // Run again: everything is settled, nothing is submitted.
    let again = orchestrator(&state, &args);
    assert!(!again.contains("round "), "{again}");
    // status and report read the replayed runs as any others; the events say they were replayed.
    let status = orchestrator(&state, &["status", "exp13"]);
    let completed = status.lines().filter(|l| l.split_whitespace().nth(4) == Some("COMPLETED")).count();
    assert_eq!(completed, n_measured, "{status}");
    let runs = std::fs::read_dir(state.join("exp13/runs")).expect("runs").count();
    assert_eq!(runs, n_measured);
    for e in std::fs::read_dir(state.join("exp13/runs")).expect("runs") {
        let events = std::fs::read_to_string(e.expect("run").path().join("events.jsonl")).expect("events");
        assert!(events.contains("\"host\":\"replay\"") && events.contains("replayed: record"), "{events}");
    }
    assert!(status.contains("replayed from recorded measurements: no SLURM, no GPU run"), "{status}");
    // The progress line counts the predictions as the table does, not as configs never submitted.
    let both = format!("{n} configs: {n_measured} COMPLETED, {n_predicted} predicted by the active sweep");
    assert_eq!(status.matches(&both).count(), 2, "the table's and the progress line's counts:\n{status}");
    assert!(!status.contains("not submitted"), "{status}");
    // status and the report show both kinds of answer and the savings.
    assert!(
        status.contains(&format!("active sweep: {n_measured} measured, {n_predicted} predicted without a run")),
        "{status}"
    );
    orchestrator(&state, &["report", "exp13"]);
    let md = std::fs::read_to_string(state.join("exp13/report/report.md")).expect("report.md");
    assert!(md.contains("## Active sweep"), "{md}");
    assert!(md.contains(&format!("{n} configs: {n_measured} measured, {n_predicted} predicted without a run")), "{md}");
    // The section lists each predicted config with its interval and calibration.
    let section = md.split("## Active sweep").nth(1).and_then(|s| s.split("\n## ").next()).expect("section");
    let predicted_rows = section.lines().filter(|l| is_config_row(l, &names)).count();
    assert_eq!(predicted_rows, n_predicted, "each predicted config's row says so:\n{md}");
    let json: serde_json::Value = serde_json::from_str(
        &orchestrator(&state, &["report", "exp13", "--json"])
            .lines()
            .take_while(|l| !l.starts_with("wrote "))
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .expect("report --json");
    assert_eq!(json["active"]["savings"]["predicted"], n_predicted);
    every_file_is_the_store_s(&state.join("exp13"));
}

/// Every file a sweep left under `state/<experiment>/` is one the store
/// knows ([`StateFile`]); and this sweep (submitted, measured, answered
/// actively, reported) left each kind but `missing.json` and `render/`.
fn every_file_is_the_store_s(dir: &Path) {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, &mut files);
    let mut kinds = BTreeSet::new();
    for f in &files {
        let rel = f.strip_prefix(dir).expect("under the directory");
        match StateFile::of(rel) {
            Some(k) => kinds.insert(format!("{k:?}")),
            None => panic!("{} is no file the store knows", rel.display()),
        };
    }
    let expected = [
        "Active",
        "Events",
        "Journal",
        "Lock",
        "Measurements",
        "Record",
        "Report",
        "SentCopy",
        "Submission",
        "Sweep",
        "TaskLog",
    ];
    assert_eq!(kinds, expected.iter().map(|k| k.to_string()).collect(), "{files:?}");
}

/// An experiment file in `dir` whose configs the group's records do not
/// have (DiT-S on 8x8x8 and 16x16x16 inputs): every replayed run fails.
fn unrecorded(dir: &std::path::Path) -> std::path::PathBuf {
    let file = dir.join("norecord.yaml");
    std::fs::write(
        &file,
        "name: norecord\ndescription: configs no record has\ngpu: A100-SXM4-80GB\nprecision: bf16-amp\n\
         input: {channels: 1, spatial: [8, 8, 8]}\noutput_channels: 1\n\
         model: {family: dit, variant: S, patch: 2}\n\
         sweep:\n  grid:\n    model.patch: [1, 2]\n    input.spatial: [[8, 8, 8], [16, 16, 16]]\n",
    )
    .expect("experiment file");
    file
}

#[test]
fn a_loop_whose_runs_all_fail_stops_after_that_round_and_saves_nothing() {
    let d = tempfile::tempdir().expect("tempdir");
    let state = d.path().join("state");
    let file = unrecorded(d.path());
    let f = file.to_string_lossy().into_owned();
    let args = ["submit", &f, "--cluster", "replay", "--active", "--poll-interval", "0.2", "--round-size", "2"];
    let text = orchestrator(&state, &args);
    // One round, then the stop with its cause; never a success.
    assert_eq!(text.matches("round 1:").count(), 2, "the round chosen, then what it measured:\n{text}");
    assert!(!text.contains("round 2:"), "a worker that fails every config is not asked again:\n{text}");
    assert!(text.contains("round 1: 0 measured, 2 could not be measured"), "{text}");
    assert!(text.contains("stopped after 1 round: every run of the last round failed"), "{text}");
    assert!(!text.contains("Settled") && !text.contains("settled by its prediction"), "{text}");
    assert!(text.contains("2 configs could not be measured:\n  2 configs ("), "{text}");
    assert!(text.contains("has no record of these configs\n"), "the cause, grouped:\n{text}");
    assert!(text.contains("; 0 runs saved"), "{text}");
    let status = orchestrator(&state, &["status", "norecord"]);
    assert!(status.contains("2 could not be measured (0 runs saved)"), "{status}");
    // Run again (the cause fixed, say): one new round, then the same stop.
    let again = orchestrator(&state, &args);
    assert!(again.contains("round 2:") && !again.contains("round 3:"), "{again}");
    assert!(again.contains("stopped after 2 rounds: every run of the last round failed"), "{again}");
}

#[test]
fn resume_after_an_active_sweep_submits_only_what_it_left_open() {
    let d = tempfile::tempdir().expect("tempdir");
    let state = d.path().join("state");
    let args = ["submit", "experiments/exp13.yaml", "--cluster", "replay", "--active", "--poll-interval", "0.2"];
    let text = orchestrator(&state, &args);
    let names = config_names("experiments/exp13.yaml");
    let runs = || std::fs::read_dir(state.join("exp13/runs")).map(|d| d.count()).unwrap_or(0);
    let measured = runs();
    let answers: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join("exp13/active.json")).expect("active.json")).expect("json");
    let settled = answers["answers"]
        .as_object()
        .expect("answers")
        .values()
        .filter(|a| a["source"] == "predicted" && a["settled"] == true)
        .count();
    assert!(settled > 0, "{text}");
    // A plain resume spends none of the runs the loop saved, and says why.
    let resumed = orchestrator(&state, &["resume", "exp13"]);
    assert_eq!(runs(), measured, "{resumed}");
    assert_eq!(resumed.matches("answered by the active sweep: ").count(), settled, "{resumed}");
    assert!(resumed.contains("(`resume --all` runs it)"), "{resumed}");
    // status and the report give the predicted answers beside the measured ones.
    let status = orchestrator(&state, &["status", "exp13"]);
    assert!(status.contains(&format!("{settled} predicted by the active sweep")), "{status}");
    assert!(status.contains(&format!("({settled} runs saved)")), "{status}");
    let rows: Vec<serde_json::Value> = orchestrator(&state, &["status", "exp13", "--json"])
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(
        rows.iter().filter(|r| r["answer"]["source"] == "predicted").count(),
        names.len() - measured,
        "{rows:?}"
    );
    // The project's layout (exp13's own is the group DiT script's tables).
    orchestrator(&state, &["report", "exp13", "--layout", "project"]);
    let md = std::fs::read_to_string(state.join("exp13/report/report.md")).expect("report.md");
    let best = md.split("### Best viable config per variant").nth(1).expect("best section");
    let best = best.split("\n###").next().unwrap_or(best);
    assert!(best.contains("(predicted)"), "a settled prediction counts, marked:\n{best}");
    let never = md.split("### Never run").nth(1).expect("never run");
    assert!(!never.contains("not submitted"), "predictions are not 'never run':\n{md}");
    // An interval narrower than its digits is said as a band, never `2.5G–2.5G`.
    let section = md.split("## Active sweep").nth(1).and_then(|s| s.split("\n## ").next()).expect("section");
    for row in section.lines().filter(|l| is_config_row(l, &names)) {
        let interval = row.split(" | ").nth(2).expect("interval cell");
        let ends: Vec<&str> = interval.trim_end_matches('G').split('–').collect();
        assert!(ends.len() == 1 || ends[0] != ends[1], "{row}");
    }
    // Running the predicted rest is asked for: it says how many GPU jobs first,
    // and counts only what it sends (a predicted OOM still waits for `--force`).
    let all = orchestrator(&state, &["resume", "exp13", "--all"]);
    let held = all.lines().filter(|l| l.starts_with("skip ") && l.ends_with("predicted oom (use --force)")).count();
    let sent = settled - held;
    let first = all.lines().next().unwrap_or_default();
    assert_eq!(
        first,
        format!("resume --all: also submitting the {sent} configs the active sweep answered by a prediction: {sent} GPU jobs"),
        "{all}"
    );
    assert!(all.contains(&format!("submitted {sent} configs")), "{all}");
    let status = orchestrator(&state, &["status", "exp13"]);
    let saved = match held {
        1 => "1 run saved".to_string(),
        n => format!("{n} runs saved"),
    };
    assert!(
        status.contains(&format!(", {sent} of them run since ({saved})")),
        "only what was not run is saved:\n{status}"
    );
}

/// exp15 (U-ViT): the group's records hold 5 of its 12 configs. On the replay
/// the loop chooses among those first, so it measures before a round of
/// configs without a record can end it (before: 0 measured, 2 failed runs).
#[test]
fn on_the_replay_the_loop_measures_the_recorded_configs_first() {
    let d = tempfile::tempdir().expect("tempdir");
    let state = d.path().join("state");
    let args = ["submit", "experiments/exp15.yaml", "--cluster", "replay", "--active", "--poll-interval", "0.2"];
    let text = orchestrator(&state, &args);
    let measured: usize = text
        .split_once("12 configs: ")
        .and_then(|(_, rest)| rest.split_once(" measured"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("the answer's counts:\n{text}"));
    assert!(measured >= 1, "{text}");
    let first =
        text.lines().find(|l| l.starts_with("round 1: ") && l.contains(" measured")).expect("round 1's outcome");
    assert!(first.starts_with("round 1: ") && !first.contains("round 1: 0 measured"), "{text}");
}

/// `plan` names the cluster `submit` and `resume` would use (issue 34): after
/// a sweep went to the replay, the replay and why; `--cluster` picks another;
/// a name no clusters file declares is said at `plan`, not first at `submit`.
#[test]
fn plan_names_the_cluster_submit_would_use() {
    let d = tempfile::tempdir().expect("tempdir");
    let state = d.path().join("state");
    let before = orchestrator(&state, &["plan", "experiments/exp13.yaml"]);
    assert!(before.contains("cluster: local (none named: the built-in cluster, this machine's CPU)\n"), "{before}");
    orchestrator(&state, &["submit", "experiments/exp13.yaml", "--cluster", "replay"]);
    let after = orchestrator(&state, &["plan", "experiments/exp13.yaml"]);
    assert!(after.contains("cluster: replay (where the experiment was first submitted)\n"), "{after}");
    assert!(!after.contains("will not run it on this CPU"), "{after}");
    let typo = orchestrator(&state, &["plan", "experiments/exp13.yaml", "--cluster", "idunn"]);
    assert!(typo.contains("cluster: idunn (from --cluster)\nnote: unknown cluster `idunn` ("), "{typo}");
    assert!(typo.contains(": `submit` will refuse it\n"), "{typo}");
}
