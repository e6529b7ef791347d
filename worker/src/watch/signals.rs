//! Forwarding SIGUSR1 and SIGTERM to the watched command. The handlers are
//! installed before the command starts: a signal that comes before it runs
//! is held and delivered once it does, never lost and never fatal to the worker.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use signal_hook::consts::{SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::{Handle, Signals};

/// The signals forwarded.
pub const FORWARDED: [i32; 3] = [SIGUSR1, SIGUSR2, SIGTERM];

#[derive(Default)]
struct State {
    /// The command's pid once it runs; `None` before and after.
    child: Option<i32>,
    /// Signals that came before the command ran.
    pending: Vec<i32>,
    /// Signals delivered to the command, in order.
    forwarded: Vec<i32>,
}

impl State {
    fn deliver(&mut self, sig: i32) {
        match self.child {
            Some(pid) => {
                // SAFETY: kill has no memory preconditions; a gone pid is an error we ignore.
                unsafe { libc::kill(pid, sig) };
                self.forwarded.push(sig);
            }
            None => self.pending.push(sig),
        }
    }
}

pub struct Forwarder {
    state: Arc<Mutex<State>>,
    handle: Handle,
    thread: Option<JoinHandle<()>>,
}

impl Forwarder {
    /// Take SIGUSR1 and SIGTERM from now on.
    pub fn install() -> std::io::Result<Forwarder> {
        let mut signals = Signals::new(FORWARDED)?;
        let handle = signals.handle();
        let state = Arc::new(Mutex::new(State::default()));
        let s = state.clone();
        let thread = std::thread::spawn(move || {
            for sig in signals.forever() {
                eprintln!("worker: received {}, forwarding it to the command", signal_name(sig));
                s.lock().unwrap_or_else(|p| p.into_inner()).deliver(sig);
            }
        });
        Ok(Forwarder { state, handle, thread: Some(thread) })
    }

    /// The command runs as `pid`: deliver what came before, and what comes.
    /// After `after`, delivers `sig` as if it had come, unless it came (or
    /// was delivered) before: the chain's warning where SLURM sends none
    /// (a site or API that drops `--signal=B:…`).
    pub fn warn_at(&self, sig: i32, after: std::time::Duration) {
        let state = self.state.clone();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
            if s.child.is_some() && !s.forwarded.contains(&sig) && !s.pending.contains(&sig) {
                eprintln!("worker: no {} from SLURM by now: sending it to the command itself", signal_name(sig));
                s.deliver(sig);
            }
        });
    }

    pub fn to_child(&self, pid: u32) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.child = i32::try_from(pid).ok();
        for sig in std::mem::take(&mut s.pending) {
            s.deliver(sig);
        }
    }

    /// The command ended: stop forwarding; the signals it was sent.
    pub fn finish(mut self) -> Vec<i32> {
        let forwarded = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            s.child = None;
            s.forwarded.clone()
        };
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        forwarded
    }
}

/// `SIGUSR1`, `SIGTERM`, …: a signal's name, else `signal N`.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}
