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

/// The failpoints inside the built-in clusters' `sbatch`, where a submission
/// is half made: `local`'s runner started, its job not yet recorded, then
/// recorded but the runner not yet told; `replay`'s first task answered, the
/// others not.
pub const BUILTIN_SBATCH: [&str; 3] = ["local:runner-started", "local:job-recorded", "replay:task-answered"];

/// The failpoint `ORCHESTRATOR_FAILPOINT` names, read once; `None` when unset.
#[cfg(debug_assertions)]
fn armed() -> Option<&'static str> {
    static ARMED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ARMED.get_or_init(|| std::env::var("ORCHESTRATOR_FAILPOINT").ok()).as_deref()
}

#[cfg(debug_assertions)]
fn die(name: &str) {
    eprintln!("failpoint {name}: dying by SIGKILL");
    // SAFETY: raising a signal on our own process.
    unsafe {
        libc::raise(libc::SIGKILL);
    }
}

/// Dies here if `ORCHESTRATOR_FAILPOINT` names this point.
#[cfg(debug_assertions)]
pub fn hit(name: &str) {
    if armed() == Some(name) {
        die(name);
    }
}

/// [`hit`] for step `step` of a state directory change `op`: `op:step`.
#[cfg(debug_assertions)]
pub fn hit_at(op: &str, step: &str) {
    if armed().and_then(|a| a.split_once(':')) == Some((op, step)) {
        die(&format!("{op}:{step}"));
    }
}

/// Release builds: nothing (see the module).
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn hit(_name: &str) {}

/// Release builds: nothing (see the module).
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn hit_at(_op: &str, _step: &str) {}
