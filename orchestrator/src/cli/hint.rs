//! The commands the tool prints for the user to run next (`status --watch`
//! follows it, `submit FILE --active` goes on, `resume --retry-cancelled`):
//! each runs as printed, from any directory. A state root or a clusters file
//! other than the defaults travels with the hint, and every path in it is
//! absolute once one does (a hint without them runs where the sweep's
//! `./state` is, as the command that printed it did).

use std::path::{Path, PathBuf};

use crate::util::shell::sh_quote;

/// The flags a printed command carries so that it reaches the same sweep.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Hint {
    /// `--state-dir`, absolute, when not the default `state`.
    state_dir: Option<PathBuf>,
    /// `--clusters`, absolute, when one was named.
    clusters: Option<PathBuf>,
    /// `--cluster` as given (only `submit` carries it: a stored sweep keeps its own).
    cluster: Option<String>,
    /// `--templates`, absolute, when one was named.
    templates: Option<PathBuf>,
}

impl Hint {
    /// The hint flags of a command run with these `--state-dir`, `--clusters`,
    /// `--cluster` and `--templates`.
    pub(super) fn new(
        state_dir: &Path,
        clusters: Option<&Path>,
        cluster: Option<&str>,
        templates: Option<&Path>,
    ) -> Hint {
        Hint {
            state_dir: (state_dir != Path::new("state")).then(|| absolute(state_dir)),
            clusters: clusters.map(absolute),
            cluster: cluster.map(String::from),
            templates: templates.map(absolute),
        }
    }

    /// Only the state root: for commands that read the state alone (`report`).
    pub(super) fn state_only(&self) -> Hint {
        Hint { state_dir: self.state_dir.clone(), ..Hint::default() }
    }

    /// Whether every path must be absolute (a flag names a place).
    fn placed(&self) -> bool {
        self.state_dir.is_some() || self.clusters.is_some() || self.templates.is_some()
    }

    /// `path` as a printed command names it: absolute once the hint carries
    /// a place (it may run elsewhere), else as the user wrote it.
    pub(super) fn path(&self, path: &Path) -> String {
        let p = if self.placed() { absolute(path) } else { path.to_path_buf() };
        sh_quote(&p.to_string_lossy())
    }

    /// `orchestrator <words>` and the flags that reach this sweep's state and
    /// clusters file (` --state-dir DIR --clusters FILE`).
    pub(super) fn command(&self, words: &str) -> String {
        let mut s = format!("orchestrator {words}");
        if let Some(d) = &self.state_dir {
            s += &format!(" --state-dir {}", sh_quote(&d.to_string_lossy()));
        }
        if let Some(c) = &self.clusters {
            s += &format!(" --clusters {}", sh_quote(&c.to_string_lossy()));
        }
        if let Some(t) = &self.templates {
            s += &format!(" --templates {}", sh_quote(&t.to_string_lossy()));
        }
        s
    }

    /// `orchestrator submit FILE OVERRIDES --active` with the loop's own
    /// flags (`loop_flags`: `--round-size 2`, ...) and `--cluster`, as
    /// [`Hint::command`]: what goes on with an active sweep stopped.
    pub(super) fn submit_active(&self, file: &Path, overrides: &[String], loop_flags: &[String]) -> String {
        let mut words = format!("submit {}", self.path(file));
        for o in overrides {
            words += &format!(" {}", sh_quote(o));
        }
        words += " --active";
        for f in loop_flags {
            words += &format!(" {}", sh_quote(f));
        }
        if let Some(c) = &self.cluster {
            words += &format!(" --cluster {}", sh_quote(c));
        }
        self.command(&words)
    }
}

/// `p` made absolute against the working directory (unchanged when that
/// cannot be read: the hint is then no worse than the path as given).
fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_add_nothing_and_a_place_makes_every_path_absolute() {
        let plain = Hint::default();
        assert_eq!(plain.command("status e --watch"), "orchestrator status e --watch");
        assert_eq!(plain.submit_active(Path::new("e.yaml"), &[], &[]), "orchestrator submit e.yaml --active");
        let placed = Hint {
            state_dir: Some("/s t/runs".into()),
            clusters: Some("/c/clusters.yaml".into()),
            cluster: Some("rp".into()),
            templates: None,
        };
        let cwd = std::env::current_dir().expect("cwd");
        assert_eq!(
            placed.submit_active(Path::new("e.yaml"), &["model.x=1".into()], &["--round-size".into(), "2".into()]),
            format!(
                "orchestrator submit {}/e.yaml model.x=1 --active --round-size 2 --cluster rp --state-dir '/s t/runs' \
                 --clusters /c/clusters.yaml",
                cwd.display()
            )
        );
    }
}
