//! Ctrl-C (SIGINT) for the commands that wait (`status --watch`, `submit
//! --active`): the first asks the command to stop at its next safe point (a
//! wait ends at once; a poll or a submission in flight finishes, so the state
//! stays whole; no new poll, no new round); a second leaves at once.
//!
//! One listener for the whole command, made before its first step: a signal
//! that comes while it polls, chooses or submits is kept for the next check.
//! (A listener made anew at each wait missed those, while tokio's handler had
//! already replaced the default action: the command went on as if nothing was
//! pressed.)

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

/// Ctrl-C presses since the command began listening.
#[derive(Debug, Clone)]
pub struct Interrupt {
    presses: watch::Receiver<u32>,
}

impl Interrupt {
    /// Listens for SIGINT from now on (inside the command's runtime);
    /// `on_press` gets each press's number before the command sees it (the
    /// command line says what the first does, and at the second leaves: exit
    /// 130). `None`, with a warning, when it cannot be caught: then Ctrl-C
    /// ends the process at once, as it does by default.
    pub fn listen(on_press: impl Fn(u32) + Send + 'static) -> Option<Interrupt> {
        let mut sig = signal(SignalKind::interrupt())
            .map_err(|e| tracing::warn!("Ctrl-C cannot be caught ({e}): it ends the command at once"))
            .ok()?;
        let (tx, presses) = watch::channel(0u32);
        tokio::spawn(async move {
            while sig.recv().await.is_some() {
                let n = *tx.borrow() + 1;
                on_press(n);
                if tx.send(n).is_err() {
                    break;
                }
            }
        });
        Some(Interrupt { presses })
    }

    /// Whether Ctrl-C was pressed.
    pub fn pressed(&self) -> bool {
        *self.presses.borrow() > 0
    }

    /// Resolves once Ctrl-C was pressed (at once if it was already).
    pub async fn wait(&self) {
        let mut rx = self.presses.clone();
        if rx.wait_for(|n| *n > 0).await.is_err() {
            // The listener is gone: no press can come any more.
            std::future::pending::<()>().await;
        }
    }

    /// A test's Ctrl-C at a named step (debug builds): when
    /// `ORCHESTRATOR_SIGNAL_AT` names `step`, the first time it is reached
    /// this process sends itself SIGINT (`ORCHESTRATOR_SIGNALS` times, 1 by
    /// default), each seen by the listener before it goes on: the signal
    /// lands in that step, as a person's Ctrl-C would.
    #[cfg(debug_assertions)]
    pub async fn at(&self, step: &str) {
        use std::sync::atomic::{AtomicBool, Ordering};
        static FIRED: AtomicBool = AtomicBool::new(false);
        if std::env::var("ORCHESTRATOR_SIGNAL_AT").ok().as_deref() != Some(step) || FIRED.swap(true, Ordering::SeqCst) {
            return;
        }
        let times: u32 = std::env::var("ORCHESTRATOR_SIGNALS").ok().and_then(|n| n.parse().ok()).unwrap_or(1);
        eprintln!("signal point {step}: sending SIGINT {times} time(s)");
        for i in 1..=times {
            // SAFETY: raising a signal on our own process; the listener handles it.
            unsafe {
                libc::raise(libc::SIGINT);
            }
            let mut rx = self.presses.clone();
            let seen = rx.wait_for(|n| *n >= i);
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), seen).await;
        }
    }

    /// Release builds: nothing (see the debug build's).
    #[cfg(not(debug_assertions))]
    pub async fn at(&self, _step: &str) {}
}
