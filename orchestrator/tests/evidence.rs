//! The replay evidence table in README.md is what `orchestrator evidence`
//! prints: every table of the group's records, its calibration refitted
//! without it, an active sweep over its configs on the replay cluster.

use std::path::Path;

use orchestrator::active::{parse_share, Settings, DEFAULT_TARGET_ERROR};
use orchestrator::evidence::{run, Tally};

#[test]
fn the_readme_evidence_table_is_what_the_command_prints() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let (_, rest) = readme.split_once("<!-- evidence:begin -->\n").expect("the evidence table's start marker");
    let (shown, _) = rest.split_once("<!-- evidence:end -->").expect("its end marker");
    // The command as README shows it: `submit --active`'s default target, no flag.
    assert!(readme.contains("orchestrator evidence --records data/vram-measurements.jsonl\n"));
    let target_error = parse_share(DEFAULT_TARGET_ERROR).expect("the default target parses");
    let settings = Settings { runtime: Default::default(), target_error, max_runs: None, round_size: None };
    let work = tempfile::tempdir().expect("tempdir");
    let runs = run(&root.join("data/vram-measurements.jsonl"), &settings, work.path()).expect("evidence");
    let printed = Tally(&runs).to_string();
    assert_eq!(shown, printed, "README.md's evidence table is stale: rerun the command and paste its output");
    // The goal, overall: at most 30% measured and no wrong verdict.
    let measured: usize = runs.iter().map(|t| t.score.measured).sum();
    let configs: usize = runs.iter().map(|t| t.score.configs).sum();
    assert!(measured * 10 <= configs * 3, "{measured} of {configs} measured");
    assert!(runs.iter().all(|t| t.score.wrong.is_empty()), "{printed}");
}
