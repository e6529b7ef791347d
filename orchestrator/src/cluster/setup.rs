//! Site setup before the worker runs: a cluster's `setup:` in the clusters
//! file, rendered into every job script that cluster runs (the profiling
//! arrays and the warm-up job) after `set -euo pipefail`, before the worker.
//!
//! ```yaml
//! setup:
//!   module_purge: true             # `module purge` first
//!   modules: [CUDA/12.4.0]         # `module load CUDA/12.4.0`, one line each, in order
//!   env:                           # `export NAME=value`, sorted by name
//!     VK_DRIVER_FILES: /etc/vulkan/icd.d/nvidia_icd.json
//! ```
//!
//! The user writes data, never a line of shell: the command (`module load`,
//! `export`) is the template's, a module name or a value reaches the script as
//! one single-quoted word (`$(…)`, `;`, quotes stay text; so a value is
//! literal: `$HOME` is not expanded), and a variable name only when it is a
//! shell identifier. The group's launchers load their site modules the same
//! way, after a `module purge` (`IDUN/profiling/profile_dit_memory.slurm@0ee6133:25-26`
//! in ModeS7/AIS4900_master), and export one allocator variable
//! (`IDUN/profiling/profile_s2d_3d.slurm@0ee6133:35`).

use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

/// What a cluster's job scripts do before the worker starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSetup {
    /// `module purge` before any `module load` (the site's default modules unloaded).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub module_purge: bool,
    /// Modules to load, in order: one `module load NAME` each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<String>,
    /// Environment variables to export (a string, number or boolean each).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty", deserialize_with = "scalar_values")]
    pub env: BTreeMap<String, String>,
}

impl JobSetup {
    pub fn is_empty(&self) -> bool {
        *self == JobSetup::default()
    }

    /// Why the setup cannot be rendered, naming the field (`setup.env`, …).
    pub fn check(&self) -> Result<(), String> {
        for m in &self.modules {
            module_name_ok(m).map_err(|why| format!("`setup.modules`: {why}"))?;
        }
        for (name, value) in &self.env {
            env_name_ok(name).map_err(|why| format!("`setup.env`: {why}"))?;
            if value.contains('\0') {
                return Err(format!("`setup.env.{name}`: a value cannot hold a NUL character"));
            }
        }
        Ok(())
    }
}

/// Whether `name` may be exported by a job script: a shell identifier, and
/// not one of SLURM's own variables (the worker reads `SLURM_ARRAY_TASK_ID`).
pub fn env_name_ok(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!(
            "{name:?} is not a shell variable name (ASCII letters, digits and `_`, not starting with a digit)"
        ));
    }
    if name.starts_with("SLURM_") {
        return Err(format!("`{name}` is SLURM's to set for the job (the worker reads SLURM_ARRAY_TASK_ID)"));
    }
    Ok(())
}

/// Whether `name` is one module name: not empty, no whitespace or control
/// character (one name a list item), not an option (`-…`).
fn module_name_ok(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("an empty module name".into());
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{name:?} is not one module name (one name a list item, no spaces)"));
    }
    if name.starts_with('-') {
        return Err(format!("{name:?} is an option, not a module name"));
    }
    Ok(())
}

/// `env:` values as written: a string, or a number or boolean read as its text
/// (`OMP_NUM_THREADS: 4`).
fn scalar_values<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let raw = BTreeMap::<String, serde_yaml::Value>::deserialize(d)?;
    raw.into_iter()
        .map(|(name, v)| {
            let text = match v {
                serde_yaml::Value::String(s) => s,
                serde_yaml::Value::Number(n) => n.to_string(),
                serde_yaml::Value::Bool(b) => b.to_string(),
                _ => {
                    return Err(serde::de::Error::custom(format!(
                        "`{name}`: a value must be a string, number or boolean"
                    )))
                }
            };
            Ok((name, text))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<JobSetup, String> {
        let s: JobSetup = serde_yaml::from_str(yaml).map_err(|e| e.to_string())?;
        s.check().map(|()| s)
    }

    #[test]
    fn names_values_and_numbers_are_read_as_written() {
        let s = parse("module_purge: true\nmodules: [CUDA/12.4.0, Vulkan]\nenv: {OMP_NUM_THREADS: 4, _X: 'a b'}\n")
            .expect("valid");
        assert!(s.module_purge);
        assert_eq!(s.modules, ["CUDA/12.4.0", "Vulkan"]);
        assert_eq!(s.env.get("OMP_NUM_THREADS").map(String::as_str), Some("4"));
        assert_eq!(s.env.get("_X").map(String::as_str), Some("a b"));
        assert!(parse("{}\n").expect("empty").is_empty());
    }

    #[test]
    fn bad_names_are_refused_naming_the_field() {
        let cases = [
            ("env: {1X: a}\n", "`setup.env`: \"1X\" is not a shell variable name"),
            ("env: {A-B: a}\n", "\"A-B\" is not a shell variable name"),
            ("env: {\"A;rm -rf ~\": a}\n", "is not a shell variable name"),
            ("env: {SLURM_ARRAY_TASK_ID: 3}\n", "`SLURM_ARRAY_TASK_ID` is SLURM's to set"),
            ("env: {A: \"x\\0y\"}\n", "`setup.env.A`: a value cannot hold a NUL"),
            ("modules: [\"a b\"]\n", "`setup.modules`: \"a b\" is not one module name"),
            ("modules: [\"-f\"]\n", "is an option"),
            ("modules: [\"\"]\n", "an empty module name"),
            ("env: {A: [1]}\n", "`A`: a value must be a string, number or boolean"),
            ("module: [x]\n", "unknown field `module`"),
        ];
        for (yaml, want) in cases {
            let e = parse(yaml).expect_err(yaml);
            assert!(e.contains(want), "{yaml}: {e}");
        }
    }
}
