//! A tracking global allocator: the exact live-byte count of the process, its
//! peak since the last reset, and an optional limit.
//!
//! On CPU backends this *is* the memory measurement: every tensor buffer goes
//! through the global allocator, so the peak is exact (PyTorch's
//! `max_memory_allocated` analogue), not sampled.
//!
//! The limit makes allocation failure testable. Rust cannot recover from a
//! failed allocation on stable (`set_alloc_error_hook` is unstable, and an
//! unwinding allocator is undefined behaviour), so the allocator instead calls
//! a registered *OOM hook* when an allocation would cross the limit. The hook
//! must not allocate; the runner's hook writes the `oom` result line with raw
//! `write(2)` calls and ends the process with `_exit(2)` (see `runner`). The
//! hook also runs when the system allocator itself fails without a limit (the
//! node is out of memory), so that is recorded as `oom` too, not an abort. If
//! no hook is set the allocator returns null and Rust aborts as usual.
//!
//! A *trace* ([`trace_start`], [`trace_stop`]) records every allocation and
//! free in order, with phase marks, for replaying through a model of another
//! allocator ([`crate::caching`]: what PyTorch's CUDA allocator would count).
//! It lives in memory mapped outside this allocator, so it is never counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use facts::event::Phase;

/// Live bytes now.
static CURRENT: AtomicU64 = AtomicU64::new(0);
/// Highest `CURRENT` since the last [`reset_peak`].
static PEAK: AtomicU64 = AtomicU64::new(0);
/// 0 = no limit.
static LIMIT: AtomicU64 = AtomicU64::new(0);
/// `fn(requested_bytes, live_bytes)` as a usize, 0 = none.
static OOM_HOOK: AtomicUsize = AtomicUsize::new(0);

/// The global allocator of every binary linking this crate (the worker and its tests).
pub struct TrackingAllocator;

#[global_allocator]
static GLOBAL: TrackingAllocator = TrackingAllocator;

/// Called instead of returning null when an allocation would exceed the limit.
/// It must not allocate, and should not return (if it does, the allocation fails).
pub type OomHook = fn(requested: u64, live: u64);

/// The system allocator failed: account nothing and let the hook record it.
#[cold]
fn system_failed(size: u64) {
    let live = CURRENT.fetch_sub(size, Ordering::Relaxed) - size;
    let hook = OOM_HOOK.load(Ordering::Acquire);
    if hook != 0 {
        // SAFETY: only `set_oom_hook` stores here, always from an `OomHook`.
        let hook: OomHook = unsafe { std::mem::transmute::<usize, OomHook>(hook) };
        hook(size, live);
    }
}

impl TrackingAllocator {
    /// Account `size` more bytes; false (nothing accounted) when over the limit.
    #[inline]
    fn reserve(size: u64) -> bool {
        let before = CURRENT.fetch_add(size, Ordering::Relaxed);
        let now = before + size;
        let limit = LIMIT.load(Ordering::Relaxed);
        if limit != 0 && now > limit {
            CURRENT.fetch_sub(size, Ordering::Relaxed);
            let hook = OOM_HOOK.load(Ordering::Acquire);
            if hook != 0 {
                // SAFETY: only `set_oom_hook` stores here, always from an `OomHook`.
                let hook: OomHook = unsafe { std::mem::transmute::<usize, OomHook>(hook) };
                hook(size, before);
            }
            return false;
        }
        PEAK.fetch_max(now, Ordering::Relaxed);
        true
    }
}

// SAFETY: every call forwards to `System` with the same layout; the counters
// are plain atomics and never allocate.
unsafe impl GlobalAlloc for TrackingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !Self::reserve(layout.size() as u64) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            system_failed(layout.size() as u64);
        }
        record(ALLOC, p as u64, layout.size() as u64);
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !Self::reserve(layout.size() as u64) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            system_failed(layout.size() as u64);
        }
        record(ALLOC, p as u64, layout.size() as u64);
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Recorded before the block is returned, so its next owner's record comes after.
        record(FREE, ptr as u64, layout.size() as u64);
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size() as u64, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size() as u64;
        let new = new_size as u64;
        if new > old && !Self::reserve(new - old) {
            return std::ptr::null_mut();
        }
        record(FREE, ptr as u64, old);
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        record(ALLOC, if p.is_null() { ptr } else { p } as u64, if p.is_null() { old } else { new });
        if p.is_null() {
            if new > old {
                system_failed(new - old);
            }
        } else if new < old {
            CURRENT.fetch_sub(old - new, Ordering::Relaxed);
        }
        p
    }
}

/// Live heap bytes of the process.
pub fn current() -> u64 {
    CURRENT.load(Ordering::Relaxed)
}

/// Peak live bytes since the last [`reset_peak`] (or process start).
pub fn peak() -> u64 {
    PEAK.load(Ordering::Relaxed)
}

/// Start a new peak window at the current live bytes (like
/// `torch.cuda.reset_peak_memory_stats` at a phase start).
pub fn reset_peak() {
    PEAK.store(CURRENT.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Refuse allocations that would take live bytes above `bytes` (`None`: no limit).
pub fn set_limit(bytes: Option<u64>) {
    LIMIT.store(bytes.unwrap_or(0), Ordering::Relaxed);
}

/// The current limit.
pub fn limit() -> Option<u64> {
    match LIMIT.load(Ordering::Relaxed) {
        0 => None,
        b => Some(b),
    }
}

/// Register the hook run when the limit is hit (see the module docs).
pub fn set_oom_hook(hook: Option<OomHook>) {
    OOM_HOOK.store(hook.map(|h| h as usize).unwrap_or(0), Ordering::Release);
}

/// One step of a [`Trace`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceEvent {
    Alloc {
        addr: u64,
        size: u64,
    },
    Free {
        addr: u64,
        size: u64,
    },
    /// A phase's peak window opens (the runner's `reset_peak`)...
    Open(Phase),
    /// ...and closes (its peak is taken).
    Close,
}

/// The allocations of a stretch of the process, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// Live bytes when the trace started.
    pub live_before: u64,
    pub events: Vec<TraceEvent>,
}

/// Events a trace holds at most (16 bytes each, mapped lazily: a run's
/// trace touches only what it writes). A run with more has no trace.
const TRACE_CAPACITY: usize = 1 << 25;
const ALLOC: u64 = 1 << 62;
const FREE: u64 = 2 << 62;
const MARK: u64 = 3 << 62;
const TAG: u64 = 3 << 62;

static TRACING: AtomicBool = AtomicBool::new(false);
/// Two words an event: the address (a mark: 0 = close, phase + 1 = open),
/// then the tag and size.
static TRACE_BUF: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());
static TRACE_LEN: AtomicUsize = AtomicUsize::new(0);
static TRACE_BEFORE: AtomicU64 = AtomicU64::new(0);

#[inline]
fn record(tag: u64, addr: u64, size: u64) {
    if !TRACING.load(Ordering::Relaxed) {
        return;
    }
    let i = TRACE_LEN.fetch_add(1, Ordering::Relaxed);
    let buf = TRACE_BUF.load(Ordering::Relaxed);
    if i < TRACE_CAPACITY && !buf.is_null() {
        // SAFETY: the buffer holds 2 * TRACE_CAPACITY words and is never unmapped.
        unsafe {
            (*buf.add(2 * i)).store(addr, Ordering::Relaxed);
            (*buf.add(2 * i + 1)).store(tag | size, Ordering::Release);
        }
    }
}

/// Start recording every allocation and free: a new trace (none if its
/// memory cannot be mapped; [`trace_stop`] then gives `None`).
pub fn trace_start() {
    if TRACE_BUF.load(Ordering::Acquire).is_null() {
        let bytes = TRACE_CAPACITY * 16;
        // SAFETY: an anonymous private mapping, no file; checked for failure.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return;
        }
        TRACE_BUF.store(p.cast(), Ordering::Release);
    }
    TRACE_LEN.store(0, Ordering::SeqCst);
    TRACE_BEFORE.store(current(), Ordering::SeqCst);
    TRACING.store(true, Ordering::SeqCst);
}

/// Mark where a phase's peak window opens (`Some`) or closes (`None`).
pub fn trace_mark(open: Option<Phase>) {
    let code = open.map_or(0, |p| Phase::ALL.iter().position(|&q| q == p).map_or(0, |i| i as u64 + 1));
    record(MARK, code, 0);
}

/// Stop recording and take the trace (`None`: none was started, or it ran past
/// its capacity).
pub fn trace_stop() -> Option<Trace> {
    if !TRACING.swap(false, Ordering::SeqCst) {
        return None;
    }
    let len = TRACE_LEN.load(Ordering::SeqCst);
    let buf = TRACE_BUF.load(Ordering::Acquire);
    if len > TRACE_CAPACITY || buf.is_null() {
        return None;
    }
    let events = (0..len)
        .filter_map(|i| {
            // SAFETY: as in `record`; a slot still being written reads as empty.
            let (addr, word) =
                unsafe { ((*buf.add(2 * i)).load(Ordering::Relaxed), (*buf.add(2 * i + 1)).load(Ordering::Acquire)) };
            let size = word & !TAG;
            match word & TAG {
                ALLOC => Some(TraceEvent::Alloc { addr, size }),
                FREE => Some(TraceEvent::Free { addr, size }),
                MARK if addr == 0 => Some(TraceEvent::Close),
                MARK => Phase::ALL.get(addr as usize - 1).map(|&p| TraceEvent::Open(p)),
                _ => None,
            }
        })
        .collect();
    // Clear what was written, also by an allocation still in flight when the
    // trace stopped, so a slot a later trace has not written reads as empty.
    for i in 0..TRACE_LEN.load(Ordering::SeqCst).min(TRACE_CAPACITY) {
        // SAFETY: as in `record`.
        unsafe { (*buf.add(2 * i + 1)).store(0, Ordering::Relaxed) };
    }
    Some(Trace { live_before: TRACE_BEFORE.load(Ordering::SeqCst), events })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_a_large_buffer_exactly() {
        // Other test threads allocate too, so look only at a difference far above their noise.
        reset_peak();
        let before = current();
        let v = vec![1u8; 64 << 20];
        let during = current();
        assert!(during >= before + (64 << 20) - (1 << 20), "{before} → {during}");
        assert!(peak() >= during - (1 << 20));
        drop(v);
        assert!(current() < during - (60 << 20));
    }
}
