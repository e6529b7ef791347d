//! A state directory written before one model had one hash reads on.
//!
//! `fixtures/legacy-state/` was written by the orchestrator of commit
//! f2dd9db (`submit legacy.yaml --cluster replay`): `3L_small` is written
//! with `num_res_blocks: [2, 2, 2]`, keyed then by the hash of that list
//! (`7bcaf9625552`) and now by that of `2`; `3L_tiny`, written with a
//! scalar, kept its hash. Read by this build, the moved config is found
//! under its hash now with its run and result, nothing is submitted again,
//! and the journal still replays to the directory.

mod common;

use std::path::Path;

use common::{assert_journal_replays, orchestrator, records};

const OLD: &str = "7bcaf9625552";
const KEPT: &str = "41e5d17b9131";

fn copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("fixture") {
        let p = e.expect("entry").path();
        let dest = to.join(p.file_name().expect("a name"));
        if p.is_dir() {
            copy(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).expect("copy");
        }
    }
}

/// The fixture copied into a scratch directory: (its root, the state root).
fn legacy() -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().expect("tempdir");
    copy(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/legacy-state"), d.path());
    let state = d.path().join("state");
    (d, state)
}

/// The hash this build gives the fixture's config `name`.
fn hash_now(dir: &Path, name: &str) -> String {
    let sweep = orchestrator::sweep::load(&dir.join("legacy.yaml"), &[]).expect("the fixture's experiment");
    sweep.get(name).expect("the config").config.hash().0
}

#[test]
fn a_state_directory_of_the_old_hashes_reads_on_under_the_new() {
    let (d, state) = legacy();
    let new = hash_now(d.path(), "3L_small");
    assert_ne!(new, OLD, "the list notation's hash moved");
    assert_eq!(hash_now(d.path(), "3L_tiny"), KEPT, "the scalar notation's hash did not");

    // Read without the lock (nothing written): the report finds the run.
    orchestrator(&state, &["report", "legacy"]);
    let md = std::fs::read_to_string(state.join("legacy/report/report.md")).expect("report.md");
    assert!(md.contains("3L_small") && md.contains("1.5"), "{md}");
    assert!(state.join(format!("legacy/configs/{OLD}.json")).exists(), "a report changes nothing");

    // Opened (status): the record moved to its hash now, its run read where its worker wrote it.
    let status = orchestrator(&state, &["status", "legacy"]);
    let row = status.lines().find(|l| l.starts_with("3L_small")).unwrap_or_else(|| panic!("{status}"));
    assert!(row.contains(&new) && row.contains("COMPLETED") && row.contains("ok 1.5G"), "{status}");
    assert!(!state.join(format!("legacy/configs/{OLD}.json")).exists());
    let r = &records(&state, "legacy")["3L_small"];
    assert_eq!(r.hash().as_str(), new);
    let rel = r.events_rel(&r.attempts()[0]).expect("a run directory");
    assert_eq!(rel, format!("runs/{OLD}/events.jsonl"));
    assert!(state.join("legacy").join(&rel).exists());
    assert_eq!(records(&state, "legacy")["3L_tiny"].hash(), KEPT);
    let subs = common::submissions(&state, "legacy");
    assert_eq!(subs.len(), 1);
    assert_eq!(subs[0].tasks, [new.as_str(), KEPT], "the submission's task list moved with it");
    let sweep = std::fs::read_to_string(state.join("legacy/sweep.json")).expect("sweep.json");
    assert!(sweep.contains(&new) && !sweep.contains(OLD), "sweep.json moved too");
    assert_journal_replays(&state, "legacy");

    // The experiment again: the measured config is not run twice.
    let file = d.path().join("legacy.yaml");
    let again = orchestrator(&state, &["submit", file.to_str().expect("utf-8"), "--cluster", "replay"]);
    assert!(again.contains("skip   3L_small: completed"), "{again}");
    assert_eq!(records(&state, "legacy")["3L_small"].attempts().len(), 1, "{again}");
    // Opened once more: nothing left to move, no second journal line for it.
    orchestrator(&state, &["status", "legacy"]);
    let journal = std::fs::read_to_string(state.join("legacy/journal.jsonl")).expect("journal");
    assert_eq!(journal.matches("\"op\":\"rehash\"").count(), 1, "{journal}");
    assert_journal_replays(&state, "legacy");
}
