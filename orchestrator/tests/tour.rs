//! docs/tour.md, run for real: the group's sweep replayed, then plan, submit
//! and follow the demo sweep on the built-in `local` cluster (the Burn worker
//! of this build runs each config as a local process), then report on the
//! state it left and on the group's
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

    // Every excerpt of a report the tour quotes is what that report wrote.
    let excerpts = report_excerpts(&lines);
    assert!(excerpts.len() >= 3, "the tour quotes the demo's report twice and the records report once");
    for (report, first_line, excerpt) in excerpts {
        let written = std::fs::read_to_string(scratch.path().join(&report)).unwrap_or_else(|e| panic!("{report}: {e}"));
        let written: Vec<&str> = written.lines().collect();
        assert!(
            (0..written.len()).any(|at| excerpt_matches(&excerpt, &written, at)),
            "docs/tour.md:{first_line}: the excerpt of {report} there is not what it wrote:\n{}",
            written.join("\n")
        );
    }
}

/// Per quoted block (`> ` lines) after a console block that ran `report`: the
/// report file its output names (`report: PATH (open it`), the block's first
/// line number and its lines unquoted.
fn report_excerpts(lines: &[&str]) -> Vec<(String, usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut report: Option<String> = None;
    let mut i = 0;
    while i < lines.len() {
        if let Some(path) = lines[i].strip_prefix("report: ").and_then(|r| r.split(" (open it").next()) {
            report = Some(path.to_string());
        }
        if lines[i].starts_with("$ ") && !lines[i].contains(" report ") {
            report = None;
        }
        if lines[i].starts_with('>') {
            let first = i + 1;
            let mut quoted = Vec::new();
            while i < lines.len() && lines[i].starts_with('>') {
                let l = lines[i].trim_start_matches('>');
                quoted.push(l.strip_prefix(' ').unwrap_or(l).to_string());
                i += 1;
            }
            let report =
                report.clone().unwrap_or_else(|| panic!("docs/tour.md:{first}: a quote after no report command"));
            out.push((report, first, quoted));
            continue;
        }
        i += 1;
    }
    out
}

/// `excerpt` is `written` from line `at` on: `[..]` stands for the rest of a
/// line's text up to what follows it, `...` on a line of its own for any lines.
fn excerpt_matches(excerpt: &[String], written: &[&str], at: usize) -> bool {
    match excerpt.split_first() {
        None => true,
        Some((dots, rest)) if dots == "..." => (at..=written.len()).any(|i| excerpt_matches(rest, written, i)),
        Some((line, rest)) => {
            at < written.len() && line_matches(line, written[at]) && excerpt_matches(rest, written, at + 1)
        }
    }
}

fn line_matches(pattern: &str, line: &str) -> bool {
    match pattern.split_once("[..]") {
        None => pattern == line,
        Some((head, rest)) => {
            let Some(line) = line.strip_prefix(head) else { return false };
            // `[..]` takes as little or as much as the rest of the pattern needs.
            line.char_indices().map(|(i, _)| i).chain([line.len()]).any(|i| line_matches(rest, &line[i..]))
        }
    }
}

#[test]
fn excerpts_match_with_elisions() {
    let written = ["# t", "", "| a | 0.080G | OK |", "x", "y", "| b | 0.052G | OK |"];
    let ex = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let found = |e: &[&str]| (0..written.len()).any(|at| excerpt_matches(&ex(e), &written, at));
    assert!(found(&["| a | [..] | OK |", "...", "| b | [..]"]));
    assert!(found(&["", "| a | 0.080G | OK |"]));
    assert!(!found(&["| a | 0.084G | OK |"]), "a figure the report does not have");
    assert!(!found(&["| a | [..] | OK |", "| b | [..]"]), "lines between are not skipped without `...`");
    assert!(line_matches("| a | [..] | OK |", "| a | 1 | OK | 2 | OK |"), "`[..]` takes what the rest needs");
    assert!(!line_matches("| a | [..] |", "| b | 1 |"));
}

/// The percentages the tour's prose would state (an error, a fit's p90):
/// each with its line number. Console blocks (run) and `> ` quotes (each an
/// excerpt of the report it follows) are checked above; prose is not.
fn prose_percentages(tour: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_block = false;
    for (i, line) in tour.lines().enumerate() {
        if line.starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block || line.starts_with('>') {
            continue;
        }
        let bytes = line.as_bytes();
        for (at, _) in line.match_indices('%') {
            let start = bytes[..at].iter().rposition(|b| !(b.is_ascii_digit() || *b == b'.')).map_or(0, |p| p + 1);
            if start < at {
                out.push((i + 1, line[start..=at].to_string()));
            }
        }
    }
    out
}

/// A figure in the tour comes from a command the tour runs: no error figure
/// in its prose, where nothing checks it (it said the demo shows the fit's
/// 45.7% p90 while the demo showed +237%).
#[test]
fn the_tours_figures_come_from_its_commands() {
    assert_eq!(prose_percentages("a 45.7% p90\n```console\n0.4%\n```\n> 7.4%\n"), [(1, "45.7%".to_string())]);
    let tour = std::fs::read_to_string(docs_common::repo_root().join("docs/tour.md")).expect("docs/tour.md");
    let stated = prose_percentages(&tour);
    assert!(stated.is_empty(), "docs/tour.md states figures no command of it shows: {stated:?}");
}
