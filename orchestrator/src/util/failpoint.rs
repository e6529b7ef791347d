//! Named crash points, for the tests that prove a crash anywhere in the
//! submit protocol loses nothing and duplicates nothing.
//!
//! `ORCHESTRATOR_FAILPOINT=NAME` makes the process die by SIGKILL when it
//! reaches the point so named, as `kill -9` or a power cut would leave it:
//! no destructor runs, nothing is flushed. A debug build only: in a release
//! build [`hit`] is an empty inline function and the variable is never read.

/// Every failpoint, in the order one submission passes them: the intent
/// (`submission.json`, then its journal line, then the records' attempts
/// one by one), `sbatch`'s answer, and the move to `submitted` (the same
/// three writes).
pub const SUBMIT_PROTOCOL: [&str; 8] = [
    "intent:before",
    "intent:submission-written",
    "intent:journaled",
    "intent:between-records",
    "sbatch:answered",
    "move:submission-written",
    "move:journaled",
    "move:between-records",
];

/// Dies here if `ORCHESTRATOR_FAILPOINT` names this point.
#[cfg(debug_assertions)]
pub fn hit(name: &str) {
    static ARMED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let armed = ARMED.get_or_init(|| std::env::var("ORCHESTRATOR_FAILPOINT").ok());
    if armed.as_deref() == Some(name) {
        eprintln!("failpoint {name}: dying by SIGKILL");
        // SAFETY: raising a signal on our own process.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}

/// Release builds: nothing (see the module).
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn hit(_name: &str) {}

/// [`hit`] for a step of a state directory change: `op:step`.
pub fn hit_at(op: &str, step: &str) {
    if cfg!(debug_assertions) {
        hit(&format!("{op}:{step}"));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_failpoint_is_named_once() {
        let mut names = super::SUBMIT_PROTOCOL.to_vec();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), super::SUBMIT_PROTOCOL.len());
    }
}
