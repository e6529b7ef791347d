//! A runtime's calibration: the coefficients that scale the walks' byte
//! counts to what the allocator reports, and the file that ships them per
//! runtime (`orchestrator/calibration/runtimes.json`) with their bands.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use facts::Precision;

use super::uncertainty::Uncertainty;
use super::{Dtypes, PrecheckError, BUILTIN_CALIBRATION};

/// Physically meaningful coefficients of one runtime. Byte counts from the walks
/// are what the tensors hold; these absorb what a walk does not see (allocator
/// rounding, kernel workspaces, small tensors) and the runtime's own choices.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Coefficients {
    /// Multiplier on the walked in-block activation bytes saved for backward
    /// (explicit single tensors such as skips and checkpointed inputs are exact).
    pub act_scale: f64,
    /// Gradient buffers live at the backward peak, in multiples of the largest
    /// block's saved activations.
    pub bwd_transient: f64,
    /// Bytes per materialised attention-score element held for backward
    /// (fp32 softmax output + bf16 copy for the second matmul + what the kernel keeps).
    pub score_saved_bytes: f64,
    /// Extra bytes per score element of the largest attention block while it runs
    /// (scaled logits, fp32 upcast, softmax gradient).
    pub score_transient_bytes: f64,
    /// Parameter-sized temporaries of the optimizer step (foreach AdamW: ~1).
    pub opt_temp: f64,
    /// Full-resolution fp32 volumes alive (input, noise, noisy input, prediction, loss).
    pub data_tensors: f64,
    /// Fixed allocator-visible overhead (cuBLAS/cuDNN workspaces, RNG state, small buffers), GiB.
    pub overhead_gib: f64,
    /// Bytes materialised while one checkpointed block is recomputed and
    /// back-propagated, as a multiple of its walked saved bytes.
    pub recompute_scale: f64,
    /// Whether transformer attention keeps heads x N x N scores for backward
    /// (Burn's decomposed attention does; PyTorch's SDPA and this project's
    /// worker, with its memory-efficient attention, do not).
    #[serde(default)]
    pub transformer_scores_materialised: bool,
    /// Bytes of f32 scores one chunk of a chunked memory-efficient attention
    /// computes at a time (this project's worker: 64 MiB; 0 for kernels that
    /// hold no score tile worth counting, PyTorch's SDPA). While the largest
    /// block runs, `score_transient_bytes` per element of that chunk is live.
    #[serde(default)]
    pub attention_chunk_bytes: f64,
    /// Whether the runtime has autocast (PyTorch, and this project's worker
    /// since its `amp` module); without it an `-amp` precision runs entirely in
    /// the half type, weights and optimizer state included.
    #[serde(default = "yes")]
    pub autocast: bool,
    /// Whether the runtime computes in f32 whatever precision is asked (wgpu's
    /// WGSL kernels have no bf16; the worker falls back and says so).
    #[serde(default)]
    pub f32_only: bool,
    /// Relative uncertainty of the peak (p90 of the fit's absolute relative
    /// error): the band where the calibration file has no per-family bands.
    pub rel_uncertainty: f64,
}

impl Coefficients {
    /// The fitted coefficients in a fixed order (the calibrator's search space).
    pub const FITTED: [&'static str; 8] = [
        "act_scale",
        "bwd_transient",
        "score_saved_bytes",
        "score_transient_bytes",
        "opt_temp",
        "data_tensors",
        "overhead_gib",
        "recompute_scale",
    ];
    pub fn get(&self, i: usize) -> f64 {
        match i {
            0 => self.act_scale,
            1 => self.bwd_transient,
            2 => self.score_saved_bytes,
            3 => self.score_transient_bytes,
            4 => self.opt_temp,
            5 => self.data_tensors,
            6 => self.overhead_gib,
            _ => self.recompute_scale,
        }
    }
    pub fn set(&mut self, i: usize, v: f64) {
        match i {
            0 => self.act_scale = v,
            1 => self.bwd_transient = v,
            2 => self.score_saved_bytes = v,
            3 => self.score_transient_bytes = v,
            4 => self.opt_temp = v,
            5 => self.data_tensors = v,
            6 => self.overhead_gib = v,
            _ => self.recompute_scale = v,
        }
    }
    /// Starting point of a fit: the bare physics (walk counts as is, no extras).
    pub fn physical() -> Self {
        Coefficients {
            act_scale: 1.0,
            bwd_transient: 1.0,
            score_saved_bytes: 6.0,
            score_transient_bytes: 10.0,
            opt_temp: 1.0,
            data_tensors: 4.0,
            overhead_gib: 0.1,
            recompute_scale: 1.0,
            transformer_scores_materialised: false,
            attention_chunk_bytes: 0.0,
            autocast: true,
            f32_only: false,
            rel_uncertainty: 0.15,
        }
    }

    /// The bytes per element this runtime really uses at `precision`.
    pub(crate) fn dtypes(&self, precision: Precision) -> Dtypes {
        let runs_as = match precision {
            _ if self.f32_only => Precision::Fp32,
            Precision::Bf16Amp | Precision::Fp16Amp if !self.autocast => Precision::Bf16,
            p => p,
        };
        Dtypes::of(runs_as)
    }
}

fn yes() -> bool {
    true
}

/// The calibration file: coefficients per runtime key (`pytorch/bf16-amp`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// What was fitted on, for humans reading the file.
    #[serde(default)]
    pub note: String,
    pub runtimes: BTreeMap<String, Coefficients>,
    /// Per runtime: cross-validated bands per family and regime, and what the
    /// records covered.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub uncertainty: BTreeMap<String, Uncertainty>,
}

/// What the precheck predicts for: a runtime of the calibration (`pytorch`,
/// the group's training code; `burn-flex`, this project's worker on CPU; …),
/// as an experiment names it (checked against the shipped calibration when
/// the experiment is loaded, kept as written).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Runtime(String);

impl Runtime {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether it predicts for a run on a CPU (`burn-flex`): an experiment
    /// that says so may run on this machine without being told to.
    pub fn is_cpu(&self) -> bool {
        self.0 == "burn-flex"
    }
}

impl Default for Runtime {
    /// `pytorch`: the group's runtime.
    fn default() -> Self {
        Runtime("pytorch".into())
    }
}

impl std::ops::Deref for Runtime {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Runtime {
    fn from(s: &str) -> Runtime {
        Runtime(s.to_string())
    }
}

/// The runtime key of a framework and precision: `pytorch/bf16-amp`, `burn-cuda/bf16`.
pub fn runtime_key(framework: &str, precision: Precision) -> String {
    format!("{}/{}", framework, precision.name())
}

impl Calibration {
    pub fn from_json(text: &str) -> Result<Self, PrecheckError> {
        Ok(serde_json::from_str(text)?)
    }
    /// The calibration shipped in the repository.
    pub fn builtin() -> Self {
        // The embedded file is checked by a unit test; a parse failure is a build defect.
        Self::from_json(BUILTIN_CALIBRATION).expect("embedded calibration/runtimes.json parses")
    }
    /// Coefficients of `framework` at `precision` (see [`Calibration::resolve`]).
    pub fn coefficients(&self, framework: &str, precision: Precision) -> Result<Coefficients, PrecheckError> {
        self.resolve(framework, precision).map(|r| r.coefficients)
    }

    /// Which shipped fit answers for `framework` at `precision`, and how: its
    /// own fit; else the framework's fit at another precision (the walk counts
    /// the asked precision's bytes per element, PyTorch's dtype model); else,
    /// for a runtime this project knows but ships no fit of (its records all
    /// superseded, or none yet), the `pytorch` fit, whose memory the worker
    /// reproduces, said to be a stand-in.
    pub fn resolve(&self, framework: &str, precision: Precision) -> Result<Resolved, PrecheckError> {
        let asked = runtime_key(framework, precision);
        if let Some(c) = self.runtimes.get(&asked) {
            return Ok(Resolved { key: asked.clone(), asked, fit: Fit::Fitted, coefficients: *c });
        }
        let sibling = |framework: &str| {
            nearest(precision)
                .into_iter()
                .map(|p| runtime_key(framework, p))
                .find_map(|k| self.runtimes.get(&k).map(|c| (k, *c)))
        };
        if let Some((key, coefficients)) = sibling(framework) {
            return Ok(Resolved { asked, key, fit: Fit::OtherPrecision, coefficients });
        }
        if KNOWN.contains(&framework) {
            let exact = runtime_key(STAND_IN, precision);
            let found = self.runtimes.get(&exact).map(|c| (exact, *c)).or_else(|| sibling(STAND_IN));
            if let Some((key, coefficients)) = found {
                return Ok(Resolved { asked, key, fit: Fit::StandIn, coefficients });
            }
        }
        Err(PrecheckError::UnknownRuntime(asked, self.runtimes.keys().cloned().collect::<Vec<_>>().join(", ")))
    }
}

impl Calibration {
    /// [`Calibration::resolve`] of a runtime key (`burn-vulkan/fp32`).
    pub fn resolve_key(&self, key: &str) -> Option<Resolved> {
        let (framework, precision) = key.rsplit_once('/')?;
        let precision: Precision = serde_json::from_value(serde_json::Value::String(precision.into())).ok()?;
        self.resolve(framework, precision).ok()
    }
}

/// The runtimes this project knows, whether or not a fit of them ships:
/// PyTorch (the group's training code) and the worker on each backend it builds.
pub const KNOWN: [&str; 5] = ["pytorch", "burn-flex", "burn-vulkan", "burn-wgpu", "burn-cuda"];
/// The runtime whose fit predicts for a known runtime that ships none.
pub const STAND_IN: &str = "pytorch";

/// The other precisions, nearest first: the other autocast type (the same
/// bytes), then fp32, then the uniform half type.
fn nearest(p: Precision) -> [Precision; 3] {
    use Precision::*;
    match p {
        Bf16Amp => [Fp16Amp, Fp32, Bf16],
        Fp16Amp => [Bf16Amp, Fp32, Bf16],
        Bf16 => [Bf16Amp, Fp16Amp, Fp32],
        Fp32 => [Bf16Amp, Fp16Amp, Bf16],
    }
}

/// How a runtime's coefficients were found (see [`Calibration::resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// Fitted on records of this runtime at this precision.
    Fitted,
    /// The same runtime's fit at another precision.
    OtherPrecision,
    /// No fit of this runtime ships: the `pytorch` fit stands in.
    StandIn,
}

/// The shipped fit that answers for a runtime key.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The runtime key asked for (`burn-flex/bf16-amp`).
    pub asked: String,
    /// The key whose coefficients answer.
    pub key: String,
    pub fit: Fit,
    pub coefficients: Coefficients,
}

impl Resolved {
    /// What answers, in a few words, as a record keeps it beside its
    /// prediction: `shipped burn-flex/fp32`, `burn-flex/fp32 derived for
    /// fp16-amp`, `stand-in pytorch/bf16-amp for burn-vulkan/fp32`.
    pub fn label(&self) -> String {
        match self.fit {
            Fit::Fitted => format!("shipped {}", self.key),
            Fit::OtherPrecision => format!("derived: {} for {}", self.key, self.asked),
            Fit::StandIn => format!("stand-in: {} for {}", self.key, self.asked),
        }
    }

    /// The same, with the records behind the fit and what the derivation means.
    pub fn describe(&self, records: Option<usize>) -> String {
        let fitted = match records {
            Some(n) => format!("{}, fitted on {n} records", self.key),
            None => self.key.clone(),
        };
        let framework = self.asked.split('/').next().unwrap_or_default();
        match self.fit {
            Fit::Fitted => format!("shipped {fitted}"),
            Fit::OtherPrecision => format!(
                "derived: {fitted}, scaled by the pytorch dtype model (no {} fit ships: no runs of it measured)",
                self.asked
            ),
            Fit::StandIn => format!(
                "stand-in: {fitted}, the PyTorch run the worker reproduces (no {framework} fit ships: no current \
                 records of it; measure it with scripts/gpu-check.sh or a sweep, then `orchestrator calibrate`, \
                 docs/gpu.md)"
            ),
        }
    }
}
