//! `orchestrator`: plan, precheck, submit and follow GPU memory-profiling sweeps.
//! The commands live in `orchestrator::cli`; this is the process's edge:
//! parse, logging, SIGPIPE, the exit status.

use clap::Parser;
use std::io::IsTerminal;

use orchestrator::cli::{self, Cli};

fn main() {
    let cli = Cli::parse();
    if cli.command.offline() {
        restore_default_sigpipe();
    }
    init_logging(cli.verbose);
    if let Err(e) = cli::run(cli.command) {
        eprintln!("error: {}", chain(&e));
        std::process::exit(1);
    }
}

/// The error and its causes, `: `-joined, each said once (many messages
/// already end with their cause's text).
fn chain(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !out.contains(&c) {
            out = format!("{out}: {c}");
        }
    }
    out
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only for a person at a terminal: a file or a pipe gets plain text.
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    // A warning for a person needs no timestamp; -v logs (for following a run) keep it.
    if verbose == 0 {
        fmt.without_time().init();
    } else {
        fmt.init();
    }
}

/// Rust ignores SIGPIPE, so a closed stdout turns `println!` into a panic
/// (exit 101). The default action ends the process silently, like any Unix filter.
fn restore_default_sigpipe() {
    // SAFETY: called once at start-up, before any thread exists; setting a
    // signal's disposition to SIG_DFL has no other effect on the process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
