//! Helpers of the stall test (`cluster_ssh.rs`): a stopped or paused
//! slurmctld that is always brought back, and bounded waits.

use super::Env;
use std::time::{Duration, Instant};

/// Resumes slurmctld when dropped, so a failing stall test never leaves the
/// shared test cluster's controller stopped.
pub struct Stall<'a> {
    env: &'a Env,
    paused: bool,
    stopped: bool,
}

impl<'a> Stall<'a> {
    pub fn new(env: &'a Env) -> Self {
        Stall { env, paused: false, stopped: false }
    }
    pub fn stop(&mut self) {
        self.env.script(&["stop-slurmctld"]);
        self.stopped = true;
    }
    pub fn start(&mut self) {
        self.env.script(&["start-slurmctld"]);
        self.stopped = false;
    }
    pub fn pause(&mut self) {
        self.env.script(&["pause-slurmctld"]);
        self.paused = true;
    }
    pub fn resume(&mut self) {
        self.env.script(&["resume-slurmctld"]);
        self.paused = false;
    }
}

impl Drop for Stall<'_> {
    fn drop(&mut self) {
        if self.paused {
            self.env.script(&["resume-slurmctld"]);
        }
        if self.stopped {
            self.env.script(&["start-slurmctld"]);
        }
    }
}

/// Waits for a child with a deadline (killing it past the deadline).
pub fn wait_bounded(mut child: std::process::Child, limit: Duration, what: &str) -> std::process::Output {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!("{what} did not finish within {limit:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until `submit` has written its intent: sbatch runs next.
pub fn wait_for_intent(journal: &std::path::Path) {
    let start = Instant::now();
    while !std::fs::read_to_string(journal).unwrap_or_default().contains("\"op\":\"intent\"") {
        assert!(start.elapsed() < Duration::from_secs(60), "submit never wrote its intent");
        std::thread::sleep(Duration::from_millis(2));
    }
}
