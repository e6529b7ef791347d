//! Docs that cannot go stale: every command README.md, docs/*.md and each GPU
//! check's data/gpu-check/*/RUN.md show with its output (```console blocks:
//! `$ command`, then what it prints) runs here
//! against this build's `orchestrator` and must print exactly that. `...` on a
//! line of its own stands for any lines, `[..]` for the rest of a line
//! (timings, paths); nothing else is loose. A changed output fails this test
//! until the docs say the same (`TRYCMD=overwrite cargo test -p orchestrator
//! --test docs` rewrites them; review the diff).
//!
//! The commands run in a scratch copy of the repository's inputs
//! (experiments/, templates/, data/, docs/), so what they write (`--plot`
//! files, `state/`, reports) never touches the checkout. `target/release/orchestrator`
//! in the README (the binary `scripts/demo.sh` builds) is this build's binary.
//!
//! docs/tour.md, which needs the Burn worker to run a sweep, is tests/tour.rs.

mod docs_common;

#[test]
fn readme_and_docs_show_what_the_binary_prints() {
    let scratch = docs_common::scratch_copy();
    // trycmd runs the commands in the process's directory: this file's only test.
    std::env::set_current_dir(scratch.path()).expect("cd into the scratch copy");
    let root = docs_common::repo_root();
    let cases = docs_common::cases();
    // Every Markdown page a reader is sent to; a new page in docs/ is covered
    // without anyone remembering to list it (tour.md runs in tests/tour.rs).
    let mut pages = vec![root.join("README.md"), root.join("worker/README.md"), root.join("data/README.md")];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
        let path = entry.expect("docs/ entry").path();
        if path.extension().is_some_and(|e| e == "md") && !path.ends_with("tour.md") {
            pages.push(path);
        }
    }
    // Each GPU check's RUN.md shows its tables as the script prints them.
    let checks = root.join("data/gpu-check");
    let before = pages.len();
    for entry in std::fs::read_dir(&checks).expect("data/gpu-check/") {
        let run = entry.expect("data/gpu-check/ entry").path().join("RUN.md");
        if run.is_file() {
            pages.push(run);
        }
    }
    assert!(pages.len() - before >= 4, "the GPU checks' RUN.md pages: {pages:?}");
    assert!(pages.len() >= 5, "{pages:?}");
    for page in &pages {
        cases.case(page);
    }
    cases.run();
}
