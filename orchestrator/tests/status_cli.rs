//! `orchestrator status FILE`: the experiment file is accepted where an
//! experiment name is (issue 14), through the real binary.

use std::path::Path;
use std::process::Command;

fn status(state: &Path, arg: &Path) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .arg("status")
        .arg(arg)
        .arg("--state-dir")
        .arg(state)
        .output()
        .expect("orchestrator runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn status_of_a_file_never_submitted_lists_its_configs() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments/demo.yaml");
    let sweep = orchestrator::sweep::load(&file, &[]).expect("demo loads");
    let (ok, out, err) = status(tmp.path(), &file);
    assert!(ok, "status FILE: {err}");
    for c in &sweep.configs {
        assert!(out.contains(&c.name), "{} missing:\n{out}", c.name);
    }
    assert!(out.contains("experiment `demo` has not been submitted"), "{out}");
    assert!(!err.contains("no state for experiment"), "{err}");
}

#[test]
fn status_of_a_submitted_file_uses_its_state() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments/demo.yaml");
    let sweep = orchestrator::sweep::load(&file, &[]).expect("demo loads");
    let stored = orchestrator::state::StoredSweep { cluster: "local".into(), sweep, clusters_file: None };
    orchestrator::fsio::write_json(&tmp.path().join("demo").join("sweep.json"), &stored).expect("sweep.json");
    let (ok, out, err) = status(tmp.path(), &file);
    assert!(ok, "status FILE with state: {err}");
    assert!(!out.contains("has not been submitted"), "{out}");
    assert!(out.contains("local processes, no SLURM"), "the state was polled: {out}");
}
