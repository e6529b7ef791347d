//! The run's progress in atomics, and the result lines written where nothing
//! may allocate: the allocator's OOM hook and the crash-signal handler.
//!
//! Both write the `result` event as `serde_json` would write the spec's
//! `RunResult` (the one definition of that line; a test reads them back as one),
//! formatted into a stack buffer and written with one `write(2)`, then end the
//! process. Whoever flips [`Progress::finished`] first writes the run's one result.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, Ordering};

use facts::event::{Phase, PhasePeaks};

use super::EXIT_OOM;
use crate::alloc;

/// Progress of the run in this process, readable without locks or allocation
/// (by the OOM hook, the crash handler, the signal thread and the heartbeat).
pub(super) struct Progress {
    pub phase: AtomicU8,
    /// Peak per phase, `NONE` = not reached.
    pub peaks: [AtomicU64; 4],
    pub params: AtomicU64,
    pub start_bits: AtomicU64,
    pub fd: AtomicI32,
    pub finished: AtomicBool,
    pub gpu: AtomicBool,
    /// `--memory-limit` (0 = none), for the OOM message on either meter.
    pub limit: AtomicU64,
    /// NVML's peak over the run so far (0 = no NVML).
    pub nvml_peak: AtomicU64,
    /// The GPU pool's peak in the open phase window, mirrored by the meter.
    pub pool_window_peak: AtomicU64,
}

pub(super) const NONE: u64 = u64::MAX;
/// `Progress::phase` while the device is set up, before the first phase.
pub(super) const SETUP: u8 = u8::MAX;

pub(super) static PROGRESS: Progress = Progress {
    phase: AtomicU8::new(SETUP),
    peaks: [AtomicU64::new(NONE), AtomicU64::new(NONE), AtomicU64::new(NONE), AtomicU64::new(NONE)],
    params: AtomicU64::new(0),
    start_bits: AtomicU64::new(0),
    fd: AtomicI32::new(-1),
    finished: AtomicBool::new(false),
    gpu: AtomicBool::new(false),
    limit: AtomicU64::new(0),
    nvml_peak: AtomicU64::new(0),
    pool_window_peak: AtomicU64::new(0),
};

pub(super) fn phase_index(p: Phase) -> usize {
    match p {
        Phase::Model => 0,
        Phase::Fwd => 1,
        Phase::Bwd => 2,
        Phase::Step => 3,
    }
}

/// The phase under way; `None` while the device is set up.
pub(super) fn current_phase() -> Option<Phase> {
    Phase::ALL.get(PROGRESS.phase.load(Ordering::Relaxed) as usize).copied()
}

/// Where a run is, for a message ("the fwd phase", "device setup"); writing
/// it allocates nothing.
struct Where(Option<Phase>);

impl std::fmt::Display for Where {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(p) => write!(f, "the {} phase", p.name()),
            None => f.write_str("device setup"),
        }
    }
}

/// Phase peaks so far, the open window of phase `open` included
/// (`live_peak`; with no phase open, device setup, in the overall peak only).
pub(super) fn peaks_so_far(open: Option<Phase>, live_peak: u64) -> (PhasePeaks, u64) {
    let cur = open.map(phase_index);
    let mut v = [None; 4];
    for (i, slot) in v.iter_mut().enumerate() {
        let p = PROGRESS.peaks[i].load(Ordering::Relaxed);
        let p = if p == NONE { None } else { Some(p) };
        *slot = if Some(i) == cur { Some(p.unwrap_or(0).max(live_peak)) } else { p };
    }
    let overall = v.iter().flatten().copied().max().unwrap_or(0).max(live_peak);
    (PhasePeaks { model: v[0], fwd: v[1], bwd: v[2], step: v[3] }, overall)
}

/// The open window's peak as the allocation-free writers can see it.
fn open_window_peak() -> u64 {
    if PROGRESS.gpu.load(Ordering::Relaxed) {
        PROGRESS.pool_window_peak.load(Ordering::Relaxed)
    } else {
        alloc::peak()
    }
}

/// A fixed buffer implementing `fmt::Write`, for formatting without allocating.
struct StackBuf {
    buf: [u8; 1024],
    len: usize,
}

impl std::fmt::Write for StackBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        if end > self.buf.len() {
            return Err(std::fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

fn epoch_seconds() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// A result line as `serde_json` would write `Event::Result`, without allocating;
/// `message` writes the message's text (no quotes or backslashes in it).
fn format_result(
    out: &mut StackBuf,
    status: &str,
    phase: Option<Phase>,
    live_peak: u64,
    message: impl FnOnce(&mut StackBuf) -> std::fmt::Result,
) -> std::fmt::Result {
    let t = epoch_seconds();
    let (peaks, overall) = peaks_so_far(phase, live_peak);
    let start = f64::from_bits(PROGRESS.start_bits.load(Ordering::Relaxed));
    let params = PROGRESS.params.load(Ordering::Relaxed);
    write!(out, "{{\"event\":\"result\",\"t\":{t},\"status\":\"{status}\",\"params\":{params},\"peaks\":{{")?;
    let mut first = true;
    for (name, v) in [("model", peaks.model), ("fwd", peaks.fwd), ("bwd", peaks.bwd), ("step", peaks.step)] {
        if let Some(v) = v {
            write!(out, "{}\"{name}\":{v}", if first { "" } else { "," })?;
            first = false;
        }
    }
    write!(out, "}},\"peak_bytes\":{overall},")?;
    if let Some(phase) = phase {
        write!(out, "\"phase\":\"{}\",", phase.name())?;
    }
    write!(out, "\"message\":\"")?;
    message(out)?;
    writeln!(out, "\",\"wall_s\":{}}}", (t - start).max(0.0))
}

/// Write a formatted line to the event file and to stderr (best effort, async-signal-safe).
fn write_line(out: &StackBuf, note: &[u8]) {
    let fd = PROGRESS.fd.load(Ordering::Relaxed);
    // SAFETY: plain write(2) of initialised buffers; no allocation, async-signal-safe.
    unsafe {
        if fd >= 0 {
            libc::write(fd, out.buf.as_ptr().cast(), out.len);
        }
        libc::write(2, note.as_ptr().cast(), note.len());
    }
}

/// Held by the one OOM hook call that decides this process's ending: the
/// backend allocates on several threads, and two can cross the limit together.
static OOM_PEN: AtomicBool = AtomicBool::new(false);

/// The allocator's OOM hook (and the GPU sampler's over-limit callback).
pub(super) fn oom_hook(requested: u64, live: u64) {
    // A second thread over the limit waits here for the first, which writes
    // the result and ends the process: returning at once would fail its
    // allocation, and Rust would abort the process mid-write (seen in CI: a
    // signal instead of exit 3).
    while OOM_PEN.swap(true, Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    if PROGRESS.finished.swap(true, Ordering::SeqCst) {
        // A result is written, or being written by a signal's or a crash's
        // handler (which ends the process): fail the allocation.
        OOM_PEN.store(false, Ordering::SeqCst);
        return;
    }
    let live_peak = if PROGRESS.gpu.load(Ordering::Relaxed) { live } else { alloc::peak() };
    let limit = PROGRESS.limit.load(Ordering::Relaxed);
    let mut out = StackBuf { buf: [0; 1024], len: 0 };
    let formatted = format_result(&mut out, "oom", current_phase(), live_peak, |out| {
        if limit == 0 {
            write!(out, "host allocation of {requested} bytes failed with {live} bytes live and no limit set: the node ran out of memory")
        } else {
            write!(out, "allocation of {requested} bytes refused: {live} bytes live, limit {limit}")
        }
    });
    if formatted.is_ok() {
        write_line(&out, b"worker: memory limit reached, recorded as oom\n");
    }
    // SAFETY: _exit skips destructors and atexit handlers, which could allocate.
    unsafe { libc::_exit(EXIT_OOM) }
}

/// Signals that end the process inside native code: a driver or shader compiler
/// that crashes (seen: lavapipe's `vkCreateComputePipelines`), an abort in C++.
const CRASH_SIGNALS: [(libc::c_int, &str); 5] = [
    (libc::SIGSEGV, "SIGSEGV (invalid memory access)"),
    (libc::SIGBUS, "SIGBUS (bus error)"),
    (libc::SIGABRT, "SIGABRT (abort)"),
    (libc::SIGILL, "SIGILL (illegal instruction)"),
    (libc::SIGFPE, "SIGFPE (arithmetic fault)"),
];

/// On a crash signal: write a `failed` result naming the signal and the phase,
/// then die of the same signal (the default action: a core dump where enabled),
/// so SLURM and the shell still see the crash.
extern "C" fn crash_handler(sig: libc::c_int) {
    if !PROGRESS.finished.swap(true, Ordering::SeqCst) {
        let name = CRASH_SIGNALS.iter().find(|(s, _)| *s == sig).map(|(_, n)| *n).unwrap_or("a fatal signal");
        let mut out = StackBuf { buf: [0; 1024], len: 0 };
        let formatted = format_result(&mut out, "failed", current_phase(), open_window_peak(), |out| {
            write!(
                out,
                "the worker crashed with {name} in {}: a fault inside native code (the GPU driver, its shader compiler or a kernel), not a memory limit",
                Where(current_phase())
            )
        });
        if formatted.is_ok() {
            write_line(&out, b"worker: crashed; recorded as failed\n");
        }
    }
    // SAFETY: restoring the default action and re-raising are async-signal-safe.
    // The re-raised signal is delivered when this handler returns.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Install [`crash_handler`] for the crash signals (once per process). The
/// handler runs on the crashing thread's own stack: the alternate stacks Rust
/// gives its threads (a few KiB, for its stack-overflow message) are too small
/// for the formatting, and a fault there would end the process with nothing
/// written. The price: a stack overflow itself (rare here) leaves no result.
pub(super) fn install_crash_handlers() {
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return;
    }
    for (sig, _) in CRASH_SIGNALS {
        // SAFETY: a zeroed sigaction with a plain handler and an empty mask; the
        // handler only touches atomics and async-signal-safe calls.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = crash_handler as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use facts::event::{RunResult, RunStatus};

    /// The line as the spec's result type reads it (a `result` event or an error).
    fn parse(out: &StackBuf) -> RunResult {
        let line = std::str::from_utf8(&out.buf[..out.len]).unwrap();
        assert!(line.ends_with('\n'));
        serde_json::from_str::<RunResult>(line.trim_end()).unwrap()
    }

    /// The allocation-free lines parse as the `result` event serde writes.
    #[test]
    fn allocation_free_result_lines_parse_as_result_events() {
        let mut out = StackBuf { buf: [0; 1024], len: 0 };
        format_result(&mut out, "oom", Some(Phase::Bwd), 3 << 19, |o| {
            write!(o, "allocation of {} bytes refused", 4096)
        })
        .unwrap();
        let r = parse(&out);
        assert_eq!(r.status, RunStatus::Oom);
        assert_eq!(r.phase, Some(Phase::Bwd));
        assert!(r.peak_bytes >= 3 << 19);
        assert!(r.message.unwrap().contains("4096 bytes refused"));
        let mut out = StackBuf { buf: [0; 1024], len: 0 };
        format_result(&mut out, "failed", None, 0, |o| write!(o, "the worker crashed with {}", CRASH_SIGNALS[0].1))
            .unwrap();
        let r = parse(&out);
        assert_eq!(r.status, RunStatus::Failed);
        assert_eq!(r.phase, None, "device setup: no phase");
        assert!(r.message.unwrap().contains("SIGSEGV"));
    }
}
