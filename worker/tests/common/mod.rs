//! What the end-to-end worker tests share: run the `worker` binary on one
//! config and read back its events.

use std::path::Path;
use std::process::{Command, ExitStatus};

use spec::event::Event;
use spec::RunConfig;

/// Run `cfg` with `worker run` (CPU backend) under `dir`; its exit status and events.
pub fn run_worker(dir: &Path, cfg: &RunConfig) -> (ExitStatus, Vec<Event>) {
    let path = dir.join(format!("{}.json", cfg.name));
    std::fs::write(&path, serde_json::to_string(cfg).unwrap()).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_worker"))
        .args(["run", "--config"])
        .arg(&path)
        .arg("--state-dir")
        .arg(dir)
        .status()
        .unwrap();
    let events = dir.join(&cfg.experiment).join(cfg.events_rel());
    let text = std::fs::read_to_string(events).unwrap();
    (status, text.lines().map(|l| serde_json::from_str(l).unwrap()).collect())
}
