//! What the pages say beside their tested blocks agrees with them (issue 52):
//! a page that installs the orchestrator says how to install the worker it
//! runs; `WARN` lines inside a generated table are explained on the page; and
//! docs/precheck.md's prose on held-out tables agrees with its savings table.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// README.md and every docs/*.md, with their text.
fn pages() -> Vec<(PathBuf, String)> {
    let mut paths = vec![root().join("README.md")];
    for e in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "md") {
            paths.push(p);
        }
    }
    paths.into_iter().map(|p| (p.clone(), std::fs::read_to_string(&p).expect("page"))).collect()
}

#[test]
fn a_page_that_installs_the_orchestrator_says_how_to_install_the_worker() {
    for (path, text) in pages().iter().filter(|(_, t)| t.contains("cargo install --path orchestrator")) {
        let flat = text.replace('\n', " ");
        assert!(flat.contains("cargo install --path worker"), "{} installs no worker", path.display());
    }
}

#[test]
fn warn_lines_in_a_generated_table_are_explained_on_its_page() {
    for (path, text) in pages() {
        let mut rest = text.as_str();
        while let Some(at) = rest.find(":begin -->") {
            let block = &rest[at..];
            let end = block.find(":end -->").unwrap_or(block.len());
            let warns = block[..end].lines().filter(|l| l.trim_start().starts_with("WARN ")).count();
            let after = &block[end..];
            let words = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"];
            let named = words.get(warns).map(|w| format!("{w} `WARN` lines")).unwrap_or_default();
            assert!(
                warns == 0 || (warns == 1 && after.contains("`WARN` line")) || after.contains(&named),
                "{}: {warns} WARN lines in a generated block, not explained after it",
                path.display()
            );
            rest = &block[end..];
        }
    }
}

#[test]
fn the_held_out_prose_agrees_with_the_savings_table() {
    let text = std::fs::read_to_string(root().join("docs/precheck.md")).expect("docs/precheck.md");
    let all = text.lines().find(|l| l.starts_with("| **all**")).expect("the savings table's total");
    let held_back: usize = all.trim_end_matches('|').rsplit('|').next().and_then(|c| c.trim().parse().ok()).expect("n");
    let flat = text.replace('\n', " ");
    let says_none = flat.contains("the same holds when each source table in turn is treated as a new experiment");
    assert!(
        !(says_none && held_back > 0),
        "the prose says no run that ran is held back on a new table; the table holds back {held_back}"
    );
}
