//! `submit --active` on the built-in `replay` cluster (the group's records):
//! the same submit, state, status and report path as a real cluster, and
//! every output says it replays.

mod common;

use common::orchestrator;

#[test]
fn an_active_sweep_on_the_replay_cluster_measures_a_few_and_predicts_the_rest() {
    let d = tempfile::tempdir().expect("tempdir");
    let state = d.path().join("state");
    let args = ["submit", "experiments/exp13.yaml", "--cluster", "replay", "--active", "--poll-interval", "0.2"];
    let text = orchestrator(&state, &args);
    assert!(text.contains("round 1:"), "{text}");
    let (measured, predicted) = text.split_once("predicted (not run):").expect("measured and predicted apart");
    let n_measured = measured.lines().filter(|l| l.starts_with("  ")).count();
    let n_predicted = predicted.lines().filter(|l| l.starts_with("  ") && l.contains(" GiB [")).count();
    assert!(n_measured >= 1 && n_measured + n_predicted == 12, "{text}");
    assert!(n_predicted > n_measured, "most of the sweep is predicted:\n{text}");
    assert!(text.contains(&format!("12 configs: {n_measured} measured, {n_predicted} predicted")), "{text}");
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
    // status and the report show both kinds of answer and the savings.
    assert!(
        status.contains(&format!("active sweep: {n_measured} measured, {n_predicted} predicted without a run")),
        "{status}"
    );
    orchestrator(&state, &["report", "exp13"]);
    let md = std::fs::read_to_string(state.join("exp13/report/report.md")).expect("report.md");
    assert!(md.contains("## Active sweep"), "{md}");
    assert!(md.contains(&format!("12 configs: {n_measured} measured, {n_predicted} predicted without a run")), "{md}");
    // The section lists each predicted config with its interval and calibration.
    let section = md.split("## Active sweep").nth(1).and_then(|s| s.split("\n## ").next()).expect("section");
    let predicted_rows = section.lines().filter(|l| l.starts_with("| DiT")).count();
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
}
