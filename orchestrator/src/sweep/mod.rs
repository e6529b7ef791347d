//! Sweep expansion: one experiment file → the list of configs it names.
//!
//! ```yaml
//! sweep:
//!   name: "{model.variant}_p{model.patch}"   # optional name template
//!   configs:                                  # named configs, each a set of overrides
//!     - {name: 4L_large, model.channels: [256, 512, 1024, 2048]}
//!   grid:                                     # cartesian product, last key fastest
//!     model.patch: [2, 4, 8]
//!     input.spatial: {lat4x: [40, 64, 64], lat8x: [20, 32, 32]}   # labelled values
//!   zip:                                      # advanced in lockstep
//!     model.variant: [S, B]
//!     model.heads: [6, 12]
//!   exclude:
//!     - {model.variant: XL, model.patch: 2}
//!     - {name: 4L_large, input.spatial: lat8x}  # a named config, a grid label
//!     - lat8x                                   # every config made with a label
//! ```
//! Configs = (named configs, or the base alone) x grid x zip, less exclusions
//! (`exclude.rs`). Command-line overrides apply to the base and win over every
//! sweep value; they rename only the configs whose labelled values they
//! changed (`axes::from_labels`).

mod axes;
mod choice;
mod exclude;
mod expand;
mod name;
mod scratch;

use facts::run::ConfigHash;
use facts::{Invalid, RunConfig};
use serde_yaml::{Mapping, Value};
use std::path::{Path, PathBuf};

use crate::experiment::{Experiment, LoadError, Override, Source};
use expand::expand;

/// One expanded config: its name, content hash, the run, and why it cannot run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SweepConfig {
    pub name: String,
    pub hash: ConfigHash,
    pub config: RunConfig,
    /// Shape rules it breaks; empty when valid. Never dropped: shown as `invalid`.
    pub invalid: Vec<Invalid>,
}

impl SweepConfig {
    pub fn is_valid(&self) -> bool {
        self.invalid.is_empty()
    }
    /// `valid`, or `invalid: <first reason>` (more reasons counted).
    pub fn status(&self) -> String {
        match self.invalid.as_slice() {
            [] => "valid".into(),
            [one] => format!("invalid: {one}"),
            [first, rest @ ..] => format!("invalid: {first} (+{} more)", rest.len()),
        }
    }
}

/// An expanded experiment.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sweep {
    pub experiment: Experiment,
    /// The file it came from.
    pub source: PathBuf,
    pub configs: Vec<SweepConfig>,
    /// Configs the expansion produced twice (mostly after command-line
    /// overrides): (its name as the file writes it, the name of the kept twin).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collapsed: Vec<(String, String)>,
    /// The memory of this machine (GiB) where a `local` cluster runs the
    /// sweep on its CPU (`submit::where_it_runs`): verdicts are judged
    /// against it, as against a worker `memory_limit` (the lower of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_memory_gib: Option<f64>,
}

/// The memory a config's verdict is judged against, and whose it is.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Capacity {
    pub gib: f64,
    pub of: CapacityOf,
}

/// Whose memory a [`Capacity`] is.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacityOf {
    /// The config's GPU.
    Gpu(facts::Gpu),
    /// This machine's, where a `local` cluster runs the worker on its CPU.
    ThisMachine,
    /// The worker's `memory_limit`, below the rest.
    WorkerLimit,
}

impl Capacity {
    /// A GPU's whole memory.
    pub fn of_gpu(gpu: facts::Gpu) -> Capacity {
        Capacity { gib: gpu.capacity_gib(), of: CapacityOf::Gpu(gpu) }
    }

    /// Whose memory and how much, as a limit is named beside it: "capacity
    /// 79.2 GiB", "this machine's memory 23.5 GiB", "the worker's
    /// memory_limit 0.020 GiB".
    pub fn label(&self) -> String {
        match self.of {
            CapacityOf::Gpu(_) => format!("capacity {:.1} GiB", self.gib),
            CapacityOf::ThisMachine => format!("this machine's memory {:.1} GiB", self.gib),
            CapacityOf::WorkerLimit => format!("the worker's memory_limit {:.3} GiB", self.gib),
        }
    }
}

impl Sweep {
    pub fn get(&self, name: &str) -> Option<&SweepConfig> {
        self.configs.iter().find(|c| c.name == name)
    }

    /// The verdict on config `c` under this experiment's limits: its
    /// `budget_gb`, and the memory its worker is held to (`memory_limit`).
    pub fn verdict(&self, predictor: &crate::precheck::Predictor, c: &SweepConfig) -> crate::precheck::Verdict {
        use crate::precheck::Verdict;
        if !c.is_valid() {
            return Verdict::Invalid { reasons: c.invalid.iter().map(|i| i.to_string()).collect() };
        }
        match predictor.predict_peak(&c.config) {
            Ok(p) => self.verdict_of(predictor, c, &p),
            Err(e) => Verdict::Invalid { reasons: vec![e.to_string()] },
        }
    }

    /// [`Sweep::verdict`] from a prediction already made.
    pub fn verdict_of(
        &self,
        predictor: &crate::precheck::Predictor,
        c: &SweepConfig,
        p: &crate::precheck::Prediction,
    ) -> crate::precheck::Verdict {
        predictor.verdict_against(&c.config, p, self.experiment.budget_gb, self.available_gib(c))
    }

    /// The memory a run has in place of its GPU's, in GiB ([`Sweep::capacity`]
    /// where that is not the GPU's): the worker's memory limit, or this
    /// machine's memory where a `local` cluster runs it. `None`: the GPU's.
    pub fn memory_limit_gib(&self) -> Option<f64> {
        let c = self.capacity(self.experiment.gpu);
        (!matches!(c.of, CapacityOf::Gpu(_))).then_some(c.gib)
    }

    /// The memory config `c` is judged against: its GPU's, or the worker's
    /// memory limit or this machine's memory (a `local` run) where lower.
    pub fn available_gib(&self, c: &SweepConfig) -> f64 {
        self.capacity(c.config.gpu).gib
    }

    /// [`Sweep::available_gib`] for any config of this experiment on `gpu`
    /// (`explain` and `fit` judge configs the sweep does not list), and whose
    /// memory it is.
    pub fn capacity(&self, gpu: facts::Gpu) -> Capacity {
        let worker = self.experiment.worker.memory_limit.map(|b| b as f64 / (1u64 << 30) as f64);
        // On this machine the GPU's capacity plays no part.
        let base =
            self.host_memory_gib.map_or(Capacity::of_gpu(gpu), |gib| Capacity { gib, of: CapacityOf::ThisMachine });
        match worker {
            Some(gib) if gib < base.gib => Capacity { gib, of: CapacityOf::WorkerLimit },
            _ => base,
        }
    }

    /// The precheck for this experiment's runtime, at its configs' precision
    /// (coefficients fall back across precisions: the walk counts element sizes).
    pub fn predictor(&self) -> Result<crate::precheck::Predictor, crate::precheck::PrecheckError> {
        self.predictor_in(None).map(|(p, _)| p)
    }

    /// The precheck as `plan`, `submit` and `fit` use it: the local
    /// calibration overlay the store keeps (and where) where it has enough
    /// runs of this runtime on this GPU, else the shipped calibration; and
    /// which it was.
    pub fn predictor_in(
        &self,
        local: Option<(&crate::precheck::overlay::Overlay, &Path)>,
    ) -> Result<(crate::precheck::Predictor, crate::precheck::overlay::CalibrationSource), crate::precheck::PrecheckError>
    {
        let precision = self.configs.first().map(|c| c.config.precision).unwrap_or(facts::Precision::Bf16Amp);
        crate::precheck::overlay::predictor(local, &self.experiment.runtime, precision, self.experiment.gpu)
    }
}

/// Read `path`, apply command-line `overrides` (`key.path=value`) and expand.
pub fn load(path: &Path, overrides: &[String]) -> Result<Sweep, LoadError> {
    let src = Source::read(path)?;
    expand(src, overrides)
}

/// As [`load`], from text already in memory (`file` names it in errors).
pub fn parse(file: &Path, text: &str, overrides: &[String]) -> Result<Sweep, LoadError> {
    expand(Source::parse(file, text)?, overrides)
}

/// One warning for every config that turned out identical to an earlier one.
/// One warning for every config that turned out identical to an earlier one.
fn collapse_summary(total: usize, collapsed: &[(String, String)], cli: &[Override]) -> String {
    const SHOWN: usize = 4;
    let cause = if cli.is_empty() {
        "the sweep produces".to_string()
    } else {
        let args: Vec<&str> = cli.iter().map(|o| o.arg.as_str()).collect();
        format!("with {} the sweep produces", args.join(" "))
    };
    let mut pairs: Vec<String> = collapsed.iter().take(SHOWN).map(|(gone, kept)| format!("{gone} → {kept}")).collect();
    if collapsed.len() > SHOWN {
        pairs.push(format!("and {} more", collapsed.len() - SHOWN));
    }
    format!(
        "{cause} {} identical configs: kept {} of {total} ({})",
        collapsed.len(),
        total - collapsed.len(),
        pairs.join(", ")
    )
}

/// Build a mapping value from pairs (for tests and callers composing docs).
pub fn mapping(pairs: &[(&str, Value)]) -> Value {
    let mut m = Mapping::new();
    for (k, v) in pairs {
        m.insert(Value::from(*k), v.clone());
    }
    Value::Mapping(m)
}

#[cfg(test)]
mod tests;
