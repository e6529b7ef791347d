//! `command:` in an experiment file: each config runs a command of the
//! user's (the group's training script) under `worker watch` instead of the
//! profiling worker. The model block still describes the network, so `plan`
//! and the precheck judge every config as for a profiling sweep.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The command a config runs, the lines before it and its environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandRuntime {
    /// One command line, a handlebars template over the config's fields
    /// (`{{model.channels}}`, `{{batch}}`, `{{name}}`, …): each value is
    /// shell-quoted as it is put in; a list is written `[a,b,c]`.
    pub run: String,
    /// Shell lines run before the command (`module load …`, `conda activate …`), verbatim.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setup: Vec<String>,
    /// Environment of the command (`PYTORCH_CUDA_ALLOC_CONF`), each value quoted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// A run longer than the time limit, as segments (absent: one job a config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<Chain>,
}

/// `chain:`: how a config's run goes on across time limits. SLURM signals
/// the job `signal` before its limit; the worker forwards it to the command,
/// which saves `checkpoint` and exits; the worker records the segment and
/// asks SLURM to requeue the job; the next segment runs the command again
/// with `resume` added. The chain ends when `marker` exists after a segment,
/// when the command exits 0 without having been signalled, or at
/// `max_segments` (docs/training-sweeps.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chain {
    /// `USR1@120`: the signal and how many seconds before the limit (sbatch
    /// `--signal=B:USR1@120`: to the batch shell, which is the worker).
    pub signal: ChainSignal,
    /// Segments at most (the group's `CHAIN_MAX`).
    #[serde(default = "default_max_segments")]
    pub max_segments: u32,
    /// The checkpoint the command saves, relative to the config's run
    /// directory (`checkpoint_latest.pt`): `resume` is added once it exists.
    pub checkpoint: String,
    /// The argument that resumes (`training.resume_from={{checkpoint}}`), a
    /// template over the config's fields, `run_dir` and `checkpoint` (its
    /// full path); one word.
    pub resume: String,
    /// A file in the run directory whose presence says the run is complete
    /// (`.training_complete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marker: Option<String>,
    /// A regular expression for the command's progress lines (`Epoch \d+/\d+`):
    /// the last match is shown by `status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
}

fn default_max_segments() -> u32 {
    20
}

/// sbatch's `--signal` for a chain: a signal name and the seconds before the
/// time limit it comes, written `USR1@120` (`SIG` and `B:` may be written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ChainSignal {
    /// Without `SIG`: `USR1` or `USR2` (those the worker forwards and no
    /// one else sends: SLURM's own SIGTERM at the limit or at `scancel` must
    /// not read as "save and go on").
    pub name: String,
    pub before_s: u32,
}

impl ChainSignal {
    /// The signals a chain may use.
    pub const NAMES: [&'static str; 2] = ["USR1", "USR2"];

    /// sbatch's value: `B:USR1@120`.
    pub fn sbatch(&self) -> String {
        format!("B:{}@{}", self.name, self.before_s)
    }
}

impl TryFrom<String> for ChainSignal {
    type Error = String;
    fn try_from(s: String) -> Result<ChainSignal, String> {
        let bad = || format!("chain signal {s:?}: write NAME@SECONDS, e.g. USR1@120 (NAME one of {:?})", Self::NAMES);
        let body = s.trim().strip_prefix("B:").unwrap_or(s.trim());
        let (name, secs) = body.split_once('@').ok_or_else(bad)?;
        let name = name.strip_prefix("SIG").unwrap_or(name);
        let before_s: u32 = secs.parse().map_err(|_| bad())?;
        if !Self::NAMES.contains(&name) || before_s == 0 {
            return Err(bad());
        }
        Ok(ChainSignal { name: name.to_string(), before_s })
    }
}

impl From<ChainSignal> for String {
    fn from(s: ChainSignal) -> String {
        format!("{}@{}", s.name, s.before_s)
    }
}

impl Chain {
    /// What is wrong with it, if anything.
    fn problem(&self) -> Option<String> {
        if self.max_segments == 0 {
            return Some("`chain.max_segments` must be at least 1".into());
        }
        let in_run_dir = |what: &str, f: &str| {
            (f.is_empty() || f.starts_with('/') || f.split('/').any(|p| p == "..")).then(|| {
                format!("`chain.{what}` ({f:?}) must be a file in the config's run directory: a relative path, no `..`")
            })
        };
        if let Some(p) = in_run_dir("checkpoint", &self.checkpoint) {
            return Some(p);
        }
        if let Some(p) = self.marker.as_deref().and_then(|m| in_run_dir("marker", m)) {
            return Some(p);
        }
        if self.resume.trim().is_empty() || self.resume.contains('\n') {
            return Some("`chain.resume` must be one argument (`training.resume_from={{checkpoint}}`)".into());
        }
        if let Some(Err(e)) = self.progress.as_deref().map(regex_lite::Regex::new) {
            return Some(format!("`chain.progress` is not a regular expression: {e}"));
        }
        None
    }
}

impl CommandRuntime {
    /// What is wrong with it, if anything: a `run:` that is not one line or
    /// that would put a value in unquoted (`{{{x}}}`, `{{&x}}`), a setup line
    /// over several lines. (Its environment's names are checked where the
    /// script is rendered, as the cluster's `setup.env` names are.)
    pub fn problem(&self) -> Option<String> {
        if self.run.trim().is_empty() {
            return Some("`run:` is empty: give the command line".into());
        }
        if self.run.contains('\n') || self.run.contains('\r') {
            return Some("`run:` must be one line (a folded `>` block, or one quoted string)".into());
        }
        if self.run.contains("{{{") || self.run.contains("{{&") || self.run.contains("{{~{") {
            return Some("`run:` may not use `{{{x}}}` or `{{&x}}`: every value is quoted, write `{{x}}`".into());
        }
        if let Some(l) = self.setup.iter().find(|l| l.contains('\n')) {
            return Some(format!("setup line {l:?} holds a newline: one line each"));
        }
        self.chain.as_ref().and_then(Chain::problem)
    }
}
