//! docs/tour.md, run for real: plan, submit and follow the demo sweep on the
//! built-in `local` cluster (the Burn worker of this build runs each config as a
//! local process), then report on the state it left and on the group's
//! measurements. Every console block of the tour must print what it shows;
//! measured peaks and timings are `[..]`; the records report it quotes must
//! have the lines quoted.
//!
//! The tour's commands run in two halves: up to `submit`, then, once every
//! config has ended (`status --watch`, as scripts/demo.sh waits), the rest.
//! Each half is the tour with the other half's lines blanked, so a failure
//! names the tour's own line numbers.
//!
//! The worker is the `worker` binary of this build, found beside this build's
//! `orchestrator` as the local cluster finds it (built first if a bare
//! `cargo test` has not: tests/common).

mod common;
mod docs_common;

use std::process::Command;

/// The line after which the sweep must have ended: the first block after `submit`.
const SPLIT_BEFORE: &str = "$ orchestrator status demo";

fn blank(lines: &[&str]) -> String {
    lines.iter().map(|_| "\n").collect()
}

#[test]
fn the_tour_runs_as_written() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_orchestrator"));
    assert_eq!(
        common::worker_binary(),
        bin.with_file_name("worker"),
        "the local cluster runs the worker beside the orchestrator"
    );
    let tour = std::fs::read_to_string(docs_common::repo_root().join("docs/tour.md")).expect("docs/tour.md");
    let lines: Vec<&str> = tour.lines().collect();
    let split = lines.iter().position(|l| l.starts_with(SPLIT_BEFORE)).expect("the tour shows `status demo`");
    // The split falls between blocks: back up to the fence that opens this one.
    let split = lines[..split].iter().rposition(|l| l.starts_with("```")).expect("a console block");
    let first = lines[..split].join("\n") + "\n" + &blank(&lines[split..]);
    let second = blank(&lines[..split]) + &lines[split..].join("\n") + "\n";

    let scratch = docs_common::scratch_copy();
    // trycmd runs the commands in the process's directory: this file's only test.
    std::env::set_current_dir(scratch.path()).expect("cd into the scratch copy");
    let (a, b) = (scratch.path().join("tour-until-submit.md"), scratch.path().join("tour-after-submit.md"));
    std::fs::write(&a, first).expect("first half");
    std::fs::write(&b, second).expect("second half");

    docs_common::cases().case(&a).run();
    // Every config ended: what a person waits for with `status --watch`.
    let watched = Command::new(bin)
        .args(["status", "demo", "--watch", "--interval", "0.2", "--max-interval", "1"])
        .output()
        .expect("status --watch runs");
    assert!(watched.status.success(), "{}", String::from_utf8_lossy(&watched.stderr));
    common::assert_journal_replays(&scratch.path().join("state"), "demo");
    docs_common::cases().case(&b).run();

    // The excerpt of the records report the tour quotes is what was written.
    let written = std::fs::read_to_string(scratch.path().join("records-report/report.md")).expect("records report");
    let from =
        lines.iter().position(|l| l.contains("orchestrator report --records")).expect("the records report command");
    let quoted: Vec<&str> = lines[from..]
        .iter()
        .skip_while(|l| !l.starts_with('>'))
        .take_while(|l| l.starts_with('>'))
        .map(|l| l.trim_start_matches('>').trim_start())
        .filter(|l| !l.is_empty())
        .collect();
    assert!(quoted.len() >= 5, "the tour quotes the records report: {quoted:?}");
    for q in quoted {
        assert!(written.lines().any(|w| w == q), "docs/tour.md quotes a line the records report does not have:\n{q}");
    }
}
