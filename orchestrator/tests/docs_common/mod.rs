//! Shared by tests/docs.rs and tests/tour.rs: a scratch copy of the
//! repository's inputs to run documented commands in, and the trycmd setup.

use std::path::{Path, PathBuf};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

/// A temporary directory holding copies of what the documented commands read.
pub fn scratch_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("scratch dir");
    let root = repo_root();
    for sub in ["experiments", "templates", "data", "docs", "scripts"] {
        copy_dir(&root.join(sub), &dir.path().join(sub));
    }
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display())) {
        let entry = entry.expect("directory entry");
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if src.is_dir() {
            copy_dir(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap_or_else(|e| panic!("{} -> {}: {e}", src.display(), dst.display()));
        }
    }
}

/// trycmd with the names the docs call the binary by, all this build's, and
/// `python3` (docs/gpu.md's tables of a GPU check come from a Python script of
/// the standard library alone).
pub fn cases() -> trycmd::TestCases {
    let bin = Path::new(env!("CARGO_BIN_EXE_orchestrator"));
    let cases = trycmd::TestCases::new();
    let python = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("python3"))
        .find(|p| p.is_file())
        .expect("python3 on PATH (docs/gpu.md runs scripts/gpu_check/summary.py)");
    cases
        .register_bin("python3", python)
        .register_bin("orchestrator", bin)
        .register_bin("target/release/orchestrator", bin)
        // Plain text whatever the terminal: no colours, no progress bars.
        .env("NO_COLOR", "1")
        .env("TERM", "dumb")
        .env("RUST_LOG", "warn")
        .timeout(std::time::Duration::from_secs(300));
    cases
}
