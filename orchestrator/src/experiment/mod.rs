//! The experiment file: what a user writes in `experiments/*.yaml`.
//!
//! Loading keeps every error to one line naming `file:line:column` and the key
//! path, whether the bad value sits in the base config, in a sweep axis or in
//! a command-line override. See [`crate::sweep`] for the expansion.

mod command;
mod layout;
pub mod locate;
mod overrides;

pub use command::{Chain, ChainSignal, CommandRuntime};
pub use layout::ReportLayout;

pub use overrides::Override;
pub(crate) use overrides::{get as overrides_get, set as overrides_set};

use facts::model::Family;
use facts::{Gpu, Input, Mode, ModelSpec, Precision};
use serde::{Deserialize, Serialize};
use serde_yaml::Value;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::precheck::Runtime;

use locate::{KeyPath, Locations, Seg};

/// SLURM resources of every job of the experiment (one job array shares them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmResources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// Wall-time limit in SLURM's syntax (`00:30:00`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_task: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<String>,
    /// Generic resources (`gpu:a100:1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gres: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<String>,
    /// Further `#SBATCH` directives, verbatim after `#SBATCH ` (each is quoted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra: Vec<String>,
}

/// How the worker runs every config of the experiment (`worker:` in the file),
/// passed to `worker run` as extra arguments by the template (`worker_args`).
/// Experiment-level because one job array shares one script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerOptions {
    /// Burn backend; absent: the worker's default (its first GPU backend, else `flex`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<WorkerBackend>,
    /// Live bytes above which the worker refuses allocations and records `oom`
    /// (`512MiB`, `2GiB`, `64G` or a number of bytes). This is how an
    /// out-of-memory result is produced on purpose, e.g. on a CPU-only test cluster.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::util::size::optional")]
    pub memory_limit: Option<u64>,
    /// How many configs one array task runs, in turn, in one worker process
    /// (1: one per task). Later configs of a task find the kernel cache warm;
    /// the manifest carries it to the worker, not `worker_args`.
    #[serde(default = "one", skip_serializing_if = "is_one", deserialize_with = "at_least_one")]
    pub configs_per_task: u32,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions { backend: None, memory_limit: None, configs_per_task: 1 }
    }
}

fn is_one(k: &u32) -> bool {
    *k == 1
}

/// `configs_per_task`: a whole number of at least 1.
fn at_least_one<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let k = u32::deserialize(d)
        .map_err(|_| serde::de::Error::custom("expected a whole number of configs per array task (1 or more)"))?;
    if k == 0 {
        return Err(serde::de::Error::custom("0 configs per array task would run nothing: use 1 or more"));
    }
    Ok(k)
}

/// The backends a worker may be built with (see worker/README.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerBackend {
    Flex,
    Wgpu,
    Vulkan,
    Cuda,
}

impl WorkerBackend {
    pub fn name(self) -> &'static str {
        match self {
            WorkerBackend::Flex => "flex",
            WorkerBackend::Wgpu => "wgpu",
            WorkerBackend::Vulkan => "vulkan",
            WorkerBackend::Cuda => "cuda",
        }
    }
}

impl WorkerOptions {
    pub fn is_default(&self) -> bool {
        *self == WorkerOptions::default()
    }

    /// The `worker run` arguments these options add, one word each.
    pub fn args(&self) -> Vec<String> {
        let mut v = Vec::new();
        if let Some(b) = self.backend {
            v.extend(["--backend".to_string(), b.name().to_string()]);
        }
        if let Some(m) = self.memory_limit {
            v.extend(["--memory-limit".to_string(), m.to_string()]);
        }
        v
    }
}

/// The experiment-level settings (everything but the per-config run fields).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Experiment {
    pub name: String,
    pub description: String,
    /// Cluster name from the clusters file; `None` means the built-in `local` one.
    pub cluster: Option<String>,
    pub gpu: Gpu,
    /// The group's memory policy (e.g. 60 GiB): above it a config is "over budget".
    pub budget_gb: Option<f64>,
    pub slurm: SlurmResources,
    /// sbatch template name under `templates/` (default `profile`).
    pub template: Option<String>,
    /// At most this many array tasks run at once (`--array=0-N%K`).
    pub array_parallelism: Option<u32>,
    /// Extra worker settings (absent in sweeps stored before it existed).
    #[serde(default, skip_serializing_if = "WorkerOptions::is_default")]
    pub worker: WorkerOptions,
    /// Which runtime the precheck predicts for: `pytorch` (the group's training
    /// code, default) or `burn-flex` (this project's worker on CPU).
    #[serde(default)]
    pub runtime: Runtime,
    /// The tables `report` writes: the project's, or those of the group's
    /// script the sweep follows (absent in sweeps stored before it existed).
    #[serde(default, skip_serializing_if = "ReportLayout::is_project")]
    pub report_layout: ReportLayout,
    /// The user's own command each config runs under `worker watch`
    /// (`command:`); absent: the profiling worker (docs/training-sweeps.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<CommandRuntime>,
}

/// The file as written. Per-config fields sit beside experiment-level ones, so
/// one struct checks them all and rejects unknown keys.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
// The per-config fields are read here only to check the file whole; each
// combination's values are read through `RawConfig`.
#[allow(dead_code)]
pub(crate) struct RawExperiment {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub cluster: Option<String>,
    pub gpu: Gpu,
    #[serde(default = "bf16_amp")]
    pub precision: Precision,
    #[serde(default)]
    pub grad_ckpt: bool,
    #[serde(default = "one")]
    pub batch: u32,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default = "one")]
    pub steps: u32,
    /// What a `mode: train` run holds besides the step (facts::training).
    #[serde(default)]
    pub training: Option<facts::Training>,
    #[serde(default)]
    pub budget_gb: Option<f64>,
    pub input: Input,
    pub output_channels: u32,
    /// Typed per family by [`model_from_value`], which keeps the error's path.
    pub model: Value,
    #[serde(default)]
    pub slurm: SlurmResources,
    #[serde(default)]
    pub template: Option<String>,
    #[serde(default)]
    pub array_parallelism: Option<u32>,
    #[serde(default)]
    pub worker: WorkerOptions,
    #[serde(default)]
    pub runtime: Runtime,
    #[serde(default)]
    pub report_layout: ReportLayout,
    #[serde(default)]
    pub command: Option<CommandRuntime>,
    /// Expanded by [`crate::sweep`].
    #[serde(default)]
    pub sweep: Option<Value>,
}

/// The per-config fields of [`RawExperiment`], as one combination of a sweep
/// sets them (the rest of the file is checked once, as a whole, and a sweep
/// sets only these keys). `model` is typed from the document by
/// [`model_from_value`], so it is only required here.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RawConfig {
    pub gpu: Gpu,
    #[serde(default = "bf16_amp")]
    pub precision: Precision,
    #[serde(default)]
    pub grad_ckpt: bool,
    #[serde(default = "one")]
    pub batch: u32,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default = "one")]
    pub steps: u32,
    #[serde(default)]
    pub training: Option<facts::Training>,
    pub input: Input,
    pub output_channels: u32,
    #[allow(dead_code)]
    pub model: serde::de::IgnoredAny,
}

fn bf16_amp() -> Precision {
    Precision::Bf16Amp
}
fn one() -> u32 {
    1
}

/// Keys a sweep may vary per config; the rest are shared by the job array.
pub const PER_CONFIG_KEYS: &[&str] =
    &["model", "input", "output_channels", "batch", "precision", "grad_ckpt", "mode", "steps", "training", "gpu"];

impl RawExperiment {
    pub(crate) fn experiment(&self) -> Experiment {
        Experiment {
            name: self.name.clone(),
            description: self.description.clone(),
            cluster: self.cluster.clone(),
            gpu: self.gpu,
            budget_gb: self.budget_gb,
            slurm: self.slurm.clone(),
            template: self.template.clone(),
            array_parallelism: self.array_parallelism,
            worker: self.worker.clone(),
            runtime: self.runtime.clone(),
            report_layout: self.report_layout,
            command: self.command.clone(),
        }
    }
}

/// A file that cannot be read or understood. The message is one line.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Not a `#[source]`: the message already says it, and `{:#}` would repeat it.
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{}:{line}:{col}: {key}: {message}", file.display())]
    At { file: PathBuf, line: usize, col: usize, key: String, message: String },
    #[error("{}: {key}: {message}", file.display())]
    NoPosition { file: PathBuf, key: String, message: String },
    #[error("command-line override `{arg}`: {message}")]
    Override { arg: String, message: String },
}

/// Where a value came from, so an error in it points at the right place.
#[derive(Debug, Clone)]
pub(crate) enum Origin {
    /// A place in the YAML file.
    File(KeyPath),
    /// The N-th command-line override.
    Cli(String),
}

/// A loaded file: its text index and the parsed document.
pub(crate) struct Source {
    pub file: PathBuf,
    pub loc: Locations,
    pub doc: Value,
}

impl Source {
    pub fn read(file: &Path) -> Result<Self, LoadError> {
        let bytes = std::fs::read(file).map_err(|error| LoadError::Io { path: file.to_path_buf(), error })?;
        let text = std::str::from_utf8(&bytes).map_err(|e| not_utf8(file, &bytes, e))?;
        Self::parse(file, text)
    }

    pub fn parse(file: &Path, text: &str) -> Result<Self, LoadError> {
        let at = |line: usize, col: usize, key: &str, message: String| LoadError::At {
            file: file.to_path_buf(),
            line,
            col,
            key: key.into(),
            message,
        };
        let loc = Locations::index(text);
        // serde_yaml refuses a repeated key without a position; the index has both.
        if let Some(d) = loc.duplicates().first() {
            return Err(at(
                d.repeat.line,
                d.repeat.col,
                &d.path.to_string(),
                format!(
                    "duplicate key (first at line {}, column {}); a key may appear once per mapping",
                    d.first.line, d.first.col
                ),
            ));
        }
        let doc: Value = serde_yaml::from_str(text).map_err(|e| {
            let (line, col) = e.location().map(|l| (l.line(), l.column())).unwrap_or((1, 1));
            at(line, col, "(syntax)", e.to_string().split(" at line ").next().unwrap_or_default().to_string())
        })?;
        if doc.is_null() {
            return Err(at(
                1,
                1,
                "(document)",
                "the file is empty: an experiment needs at least `name`, `gpu`, `input`, `output_channels` and `model`"
                    .into(),
            ));
        }
        Ok(Source { file: file.to_path_buf(), loc, doc })
    }

    /// An error at `path` in the document, whose value came from `origin`.
    pub fn error_at(&self, path: &KeyPath, origin: Option<&(KeyPath, Origin)>, message: String) -> LoadError {
        match origin {
            Some((target, Origin::Cli(arg))) if path.starts_with(target) => {
                LoadError::Override { arg: arg.clone(), message: format!("{path}: {message}") }
            }
            Some((target, Origin::File(from))) if path.starts_with(target) => {
                let mut at = from.clone();
                at.0.extend(path.0[target.0.len()..].iter().cloned());
                self.error_in_file(&at, format!("{message} (sets {path})"))
            }
            _ => self.error_in_file(path, message),
        }
    }

    pub fn error_in_file(&self, path: &KeyPath, message: String) -> LoadError {
        match self.loc.find(path) {
            Some(p) => {
                LoadError::At { file: self.file.clone(), line: p.line, col: p.col, key: path.to_string(), message }
            }
            None => LoadError::NoPosition { file: self.file.clone(), key: path.to_string(), message },
        }
    }
}

/// One line for a file that is not text: where the first bad byte sits.
fn not_utf8(file: &Path, bytes: &[u8], e: std::str::Utf8Error) -> LoadError {
    let good = &bytes[..e.valid_up_to()];
    let line = 1 + good.iter().filter(|&&b| b == b'\n').count();
    let line_start = good.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let col = 1 + String::from_utf8_lossy(&good[line_start..]).chars().count();
    let byte = bytes.get(e.valid_up_to()).copied().unwrap_or_default();
    LoadError::At {
        file: file.to_path_buf(),
        line,
        col,
        key: "(file)".into(),
        message: format!("not UTF-8 text (byte 0x{byte:02x}): an experiment file is YAML text"),
    }
}

/// Deserialize `T` from a value, returning the failing key path (relative to
/// the value) and the message. Unknown-field errors point at the unknown key.
pub(crate) fn typed<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, (KeyPath, String)> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let mut path = KeyPath::default().join_serde(e.path());
        let message = e.inner().to_string();
        if let Some(rest) = message.strip_prefix("unknown field `") {
            if let Some(field) = rest.split('`').next() {
                let key = Seg::Key(field.to_string());
                if path.0.last() != Some(&key) {
                    path.0.push(key);
                }
            }
        }
        (path, message)
    })
}

/// [`typed`] without consuming `v`, and without tracking the path unless it
/// fails (then it is read again, tracked, for the error's path).
pub(crate) fn typed_ref<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, (KeyPath, String)> {
    T::deserialize(v).or_else(|_| typed(v.clone()))
}

/// The model block, typed by its `family` with the error's path kept.
pub(crate) fn model_from_value(v: &Value) -> Result<ModelSpec, (KeyPath, String)> {
    let here = KeyPath::default();
    let Some(map) = v.as_mapping() else {
        return Err((here, "expected a mapping with a `family` key".into()));
    };
    let Some(family) = map.get("family") else {
        return Err((here, "missing field `family` (unet, dit, hdit, uvit or mamba)".into()));
    };
    let family: Family = serde_yaml::from_value(family.clone()).map_err(|_| {
        (
            here.clone().key("family"),
            format!("unknown family {}, expected unet, dit, hdit, uvit or mamba", show(family)),
        )
    })?;
    let mut rest = map.clone();
    rest.remove("family");
    let rest = Value::Mapping(rest);
    Ok(match family {
        Family::Unet => ModelSpec::Unet(typed(rest)?),
        Family::Dit => ModelSpec::Dit(typed(rest)?),
        Family::Hdit => ModelSpec::Hdit(typed(rest)?),
        Family::Uvit => ModelSpec::Uvit(typed(rest)?),
        Family::Mamba => ModelSpec::Mamba(typed(rest)?),
    })
}

/// A YAML value shown compactly in messages.
pub(crate) fn show(v: &Value) -> String {
    serde_yaml::to_string(v).map(|s| s.trim().replace('\n', " ")).unwrap_or_else(|_| "?".into())
}

impl fmt::Display for Experiment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}", self.name, self.gpu)
    }
}
