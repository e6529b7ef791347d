//! One fully resolved config: what the precheck predicts, what a job runs.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;

use crate::training::Training;
use crate::{Gpu, Input, ModelSpec};

/// Numeric precision of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Precision {
    /// fp32 weights, bf16 autocast for matmuls/convs (the group's default).
    #[serde(rename = "bf16-amp")]
    Bf16Amp,
    #[serde(rename = "fp16-amp")]
    Fp16Amp,
    /// Everything in bf16 (what Burn's `FloatDType::BF16` gives: no autocast).
    #[serde(rename = "bf16")]
    Bf16,
    #[serde(rename = "fp32")]
    Fp32,
}

impl Precision {
    /// Bytes of one activation element saved for backward.
    pub fn activation_bytes(self) -> u32 {
        match self {
            Precision::Fp32 => 4,
            _ => 2,
        }
    }
    /// Bytes of one weight (master weights stay fp32 under autocast).
    pub fn weight_bytes(self) -> u32 {
        match self {
            Precision::Bf16 => 2,
            _ => 4,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Precision::Bf16Amp => "bf16-amp",
            Precision::Fp16Amp => "fp16-amp",
            Precision::Bf16 => "bf16",
            Precision::Fp32 => "fp32",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a job does with the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One forward + backward + optimizer step, peak memory per phase (the reports).
    #[default]
    Profile,
    /// Repeated steps with AdamW state and an EMA copy.
    Train,
}

/// A fully resolved config: everything that determines the model and its memory.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The experiment it belongs to (`exp9`).
    pub experiment: String,
    /// Its name in the sweep (`4L_large`, or a generated one).
    pub name: String,
    pub model: ModelSpec,
    pub input: Input,
    pub out_channels: u32,
    pub batch: u32,
    pub precision: Precision,
    pub grad_ckpt: bool,
    #[serde(default)]
    pub mode: Mode,
    /// Optimizer steps in `train` mode (profile runs one).
    #[serde(default = "one")]
    pub steps: u32,
    /// The GPU the experiment targets (capacity for verdicts).
    pub gpu: Gpu,
    /// What a `mode: train` run holds besides the step (the experiment
    /// file's `training:` block); `None` is the group's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<Training>,
}

fn one() -> u32 {
    1
}

/// Stable short hash of what a config computes (not of its name), so renaming a
/// config never makes it look new, and the cluster's job comment identifies it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ConfigHash(pub String);

impl fmt::Display for ConfigHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl ConfigHash {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Read as text where text is wanted (a path component, a job comment).
impl std::ops::Deref for ConfigHash {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// Maps keyed by hash are looked up by a hash read as text (a job comment,
/// an events file name, a command-line argument).
impl std::borrow::Borrow<str> for ConfigHash {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for ConfigHash {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for ConfigHash {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl From<&str> for ConfigHash {
    fn from(s: &str) -> ConfigHash {
        ConfigHash(s.to_string())
    }
}

impl RunConfig {
    /// A profile run of `model` on `input`: one output channel, batch 1, fp32,
    /// no checkpointing, one step, judged on an 80 GB A100. Tests, the
    /// worker's warm-up and examples change the rest with `..`.
    pub fn profile(experiment: &str, name: &str, model: ModelSpec, input: Input) -> RunConfig {
        RunConfig {
            experiment: experiment.into(),
            name: name.into(),
            model,
            input,
            out_channels: 1,
            batch: 1,
            precision: Precision::Fp32,
            grad_ckpt: false,
            mode: Mode::Profile,
            steps: 1,
            gpu: Gpu::A100Sxm80,
            training: None,
        }
    }

    /// 12 hex digits of SHA-256 over the canonical JSON of everything but the
    /// names: compact, keys sorted at every level (`{"batch":1,"grad_ckpt":false,
    /// "input":{...},"mode":"profile","model":{...},"out_channels":4,
    /// "precision":"bf16-amp","steps":1}`), written into the hasher piece by piece.
    /// The model is its one notation ([`crate::canonical`]) and a profile run's
    /// `steps` 1: one model written two ways is one config. A config written in
    /// that notation hashes as it did before the notation was made one.
    pub fn hash(&self) -> ConfigHash {
        fn scalar<T: Serialize>(h: &mut Sha256, key: &[u8], v: &T) {
            h.update(key);
            serde_json::to_writer(&mut *h, v).expect("JSON of plain data into a hasher cannot fail");
        }
        // Structs and enums through `serde_json::Value`, whose maps sort their keys.
        fn sorted<T: Serialize>(h: &mut Sha256, key: &[u8], v: &T) {
            let value = serde_json::to_value(v).expect("plain data is JSON");
            scalar(h, key, &value);
        }
        let mut h = Sha256::new();
        scalar(&mut h, b"{\"batch\":", &self.batch);
        scalar(&mut h, b",\"grad_ckpt\":", &self.grad_ckpt);
        sorted(&mut h, b",\"input\":", &self.input);
        sorted(&mut h, b",\"mode\":", &self.mode);
        sorted(&mut h, b",\"model\":", &self.model.canonical());
        scalar(&mut h, b",\"out_channels\":", &self.out_channels);
        sorted(&mut h, b",\"precision\":", &self.precision);
        let steps = if self.mode == Mode::Profile { 1 } else { self.steps };
        scalar(&mut h, b",\"steps\":", &steps);
        // Training facts change what a train run holds: a config with them
        // is another config. Without them the hash is what it always was.
        if let Some(t) = &self.training {
            sorted(&mut h, b",\"training\":", t);
        }
        h.update(b"}");
        ConfigHash(hex::encode(&h.finalize()[..6]))
    }
}

impl RunConfig {
    /// Where this run's events go, relative to `<state>/<experiment>/`:
    /// `runs/<hash>/events.jsonl`. Runs are kept by what ran, not by name: an
    /// edited config never appends to its earlier version's run, and a
    /// renamed one keeps its own.
    pub fn events_rel(&self) -> String {
        events_rel(&self.hash())
    }
}

/// `runs/<hash>/events.jsonl`: see [`RunConfig::events_rel`].
pub fn events_rel(hash: &ConfigHash) -> String {
    format!("runs/{hash}/events.jsonl")
}

/// What the orchestrator hands a job array: the experiment's resolved configs.
/// SLURM array task `i` runs `configs_per_task` configs, starting at
/// `configs[(i - task_offset) * configs_per_task]`, in turn in one process, so
/// an array that starts at a non-zero index (a resubmission of some configs)
/// needs no renumbering.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub experiment: String,
    /// The array index of the task that runs `configs[0]` (0 unless the array starts elsewhere).
    #[serde(default)]
    pub task_offset: u32,
    /// How many configs one array task runs (1 unless the experiment asks
    /// for more: `worker: {configs_per_task: K}`).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub configs_per_task: u32,
    /// The experiment's `worker: {memory_limit}` in bytes: the worker records
    /// `oom` above it, as with `--memory-limit` (which wins when both are
    /// given), so a `worker run --manifest` by hand measures what the job did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<u64>,
    pub configs: Vec<RunConfig>,
}

fn is_one(k: &u32) -> bool {
    *k == 1
}

impl Manifest {
    /// The configs SLURM array task `task_id` runs, in order (at most
    /// `configs_per_task`); `None` when the task is outside the manifest.
    pub fn task(&self, task_id: u32) -> Option<&[RunConfig]> {
        let k = self.configs_per_task.max(1) as usize;
        let first = (task_id.checked_sub(self.task_offset)? as usize).checked_mul(k)?;
        if first >= self.configs.len() {
            return None;
        }
        Some(&self.configs[first..(first + k).min(self.configs.len())])
    }

    /// How many array tasks run these configs.
    pub fn tasks(&self) -> u32 {
        self.configs.len().div_ceil(self.configs_per_task.max(1) as usize) as u32
    }
}

#[cfg(test)]
mod manifest_tests {
    use super::*;

    fn manifest(n: usize, task_offset: u32, configs_per_task: u32) -> Manifest {
        let model = serde_json::json!({"family": "dit", "hidden": 64, "heads": 4, "depth": 2, "patch": 2});
        let configs = (0..n)
            .map(|i| RunConfig {
                experiment: "t".into(),
                name: format!("c{i}"),
                model: serde_json::from_value(model.clone()).unwrap(),
                input: crate::Input { channels: 1, spatial: crate::Spatial::new(8, 8, 8) },
                out_channels: 1,
                batch: 1,
                precision: crate::Precision::Bf16Amp,
                grad_ckpt: false,
                mode: Default::default(),
                steps: 1,
                gpu: crate::Gpu::A100Sxm80,
                training: None,
            })
            .collect();
        Manifest { experiment: "t".into(), task_offset, configs_per_task, memory_limit: None, configs }
    }

    fn names(m: &Manifest, task: u32) -> Option<Vec<String>> {
        m.task(task).map(|cs| cs.iter().map(|c| c.name.clone()).collect())
    }

    #[test]
    fn one_config_per_task_by_default() {
        let m = manifest(3, 5, 1);
        assert_eq!(m.tasks(), 3);
        assert_eq!(names(&m, 4), None);
        assert_eq!(names(&m, 5).unwrap(), ["c0"]);
        assert_eq!(names(&m, 7).unwrap(), ["c2"]);
        assert_eq!(names(&m, 8), None);
        // Written without the field, read back with it.
        let json = serde_json::to_value(&m).unwrap();
        assert!(json.get("configs_per_task").is_none());
        assert_eq!(serde_json::from_value::<Manifest>(json).unwrap(), m);
    }

    #[test]
    fn k_configs_per_task_the_last_task_takes_the_rest() {
        let m = manifest(5, 2, 2);
        assert_eq!(m.tasks(), 3);
        assert_eq!(names(&m, 2).unwrap(), ["c0", "c1"]);
        assert_eq!(names(&m, 3).unwrap(), ["c2", "c3"]);
        assert_eq!(names(&m, 4).unwrap(), ["c4"]);
        assert_eq!(names(&m, 5), None);
        assert_eq!(names(&m, u32::MAX), None);
        let json = serde_json::to_value(&m).unwrap();
        assert_eq!(json["configs_per_task"], 2);
    }
}
