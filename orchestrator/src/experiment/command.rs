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
        None
    }
}
