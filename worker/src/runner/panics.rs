//! Panics on any thread while a run sets its device up or runs a phase.
//!
//! A backend often fails on a thread of its own: CubeCL creates the device on
//! its device-runner thread (`DSD-…`), and when that panics ("Unable to
//! acquire wgpu device: AdapterUnavailable …") the thread that asked only
//! sees its channel close, and panics in turn with "called `Result::unwrap()`
//! on an `Err` value: RecvError". The first message is the cause; without
//! this hook it reached only stderr. The hook, chained to the one before it
//! (which still prints the panic and its backtrace to the job's log), keeps
//! the first panic of each [`Watch`] with its thread's name and place.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once};
use std::thread::ThreadId;

/// A panic the hook saw: where, on which thread, saying what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Caught {
    pub thread: String,
    pub thread_id: ThreadId,
    /// `file:line` where it panicked, when known.
    pub location: Option<String>,
    pub message: String,
}

/// Whether a watch is open: the hook records only then.
static WATCHING: AtomicBool = AtomicBool::new(false);
/// The first panic since the open watch began.
static FIRST: Mutex<Option<Caught>> = Mutex::new(None);

/// Install the recording hook once per process, in front of the one already set.
fn install() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if WATCHING.load(Ordering::SeqCst) {
                let thread = std::thread::current();
                let caught = Caught {
                    thread: thread.name().map_or_else(|| format!("{:?}", thread.id()), str::to_string),
                    thread_id: thread.id(),
                    location: info.location().map(|l| format!("{}:{}", l.file(), l.line())),
                    message: super::failure::panic_message(info.payload()),
                };
                let mut first = FIRST.lock().unwrap_or_else(|p| p.into_inner());
                first.get_or_insert(caught);
            }
            previous(info);
        }));
    });
}

/// Panics are recorded from [`Watch::start`] until the watch is dropped.
pub(super) struct Watch(());

impl Watch {
    /// Forget any earlier panic and record the first from now on, on any thread.
    pub fn start() -> Watch {
        install();
        *FIRST.lock().unwrap_or_else(|p| p.into_inner()) = None;
        WATCHING.store(true, Ordering::SeqCst);
        Watch(())
    }

    /// The first panic since the watch began.
    pub fn first(&self) -> Option<Caught> {
        FIRST.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// What a failure of this thread (`own`: its panic's or error's text)
    /// comes from: `own`, unless another thread panicked first; then that
    /// panic, its thread and place, and `own` after it as what followed.
    pub fn explain(&self, own: &str) -> String {
        match self.first() {
            Some(c) if c.thread_id != std::thread::current().id() => {
                let at = c.location.map(|l| format!(" at {l}")).unwrap_or_default();
                format!("{} (panicked on thread '{}'{at}; then on this thread: {own})", c.message, c.thread)
            }
            _ => own.to_string(),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        WATCHING.store(false, Ordering::SeqCst);
    }
}
