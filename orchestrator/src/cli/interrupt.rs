//! What the commands that wait (`status --watch`, `submit --active`) say
//! when Ctrl-C stops them, and the second Ctrl-C that leaves at once
//! ([`crate::submit::Interrupt`] listens).

use std::path::Path;

use super::hint::Hint;
use crate::submit::active::Stopped;

/// Running configs named in the summary; more are counted.
const NAMED: usize = 10;

/// A second Ctrl-C: out at once (exit 130), saying what goes on without this process.
pub(super) fn leave_at_once(name: &str, hint: &Hint) -> ! {
    eprintln!(
        "Ctrl-C again: leaving at once; what was submitted runs on (`{}` follows it, `{}` stops it)",
        hint.command(&format!("status {name} --watch")),
        hint.command(&format!("cancel {name}"))
    );
    std::process::exit(130)
}

/// What `submit --active` says when Ctrl-C stopped it: no new round, what
/// still runs and how to follow or stop it, how to go on (the sweep of
/// `file` with `overrides` and the loop's `loop_flags`, each command with the flags of `hint`).
pub(super) fn stopped_text(
    s: &Stopped,
    (file, overrides, loop_flags): (&Path, &[String], &[String]),
    hint: &Hint,
) -> String {
    let name = &s.experiment;
    let mut t = match s.rounds {
        0 => "interrupted: no round is chosen; ".to_string(),
        n => format!("interrupted after round {n}: no new round is chosen; "),
    };
    t += &match s.running.len() {
        0 => "nothing is running.".to_string(),
        n => {
            let mut names = s.running.iter().take(NAMED).cloned().collect::<Vec<_>>().join(", ");
            if n > NAMED {
                names += &format!(" and {} more", n - NAMED);
            }
            format!(
                "still running: {n} config{} ({names}); `{}` follows them, `{}` stops them.",
                if n == 1 { "" } else { "s" },
                hint.command(&format!("status {name} --watch")),
                hint.command(&format!("cancel {name}")),
            )
        }
    };
    t + &format!("\n`{}` goes on from here.", hint.submit_active(file, overrides, loop_flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stopped(rounds: u32, running: usize) -> Stopped {
        Stopped { experiment: "e".into(), rounds, running: (0..running).map(|i| format!("c{i:02}")).collect() }
    }

    #[test]
    fn the_summary_names_what_runs_and_how_to_follow_it() {
        let file = Path::new("e.yaml");
        assert_eq!(
            stopped_text(&stopped(0, 0), (file, &[], &[]), &Hint::default()),
            "interrupted: no round is chosen; nothing is running.\n`orchestrator submit e.yaml --active` goes on from here."
        );
        let one = stopped_text(&stopped(2, 1), (file, &[], &[]), &Hint::default());
        assert!(
            one.starts_with("interrupted after round 2: no new round is chosen; still running: 1 config (c00); "),
            "{one}"
        );
        assert!(one.contains("`orchestrator status e --watch` follows them, `orchestrator cancel e` stops them."));
        let many = stopped_text(&stopped(1, 12), (file, &[], &[]), &Hint::default());
        assert!(
            many.contains("still running: 12 configs (c00, c01, c02, c03, c04, c05, c06, c07, c08, c09 and 2 more);"),
            "{many}"
        );
    }
}
