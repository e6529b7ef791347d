//! The advisor: turns the precheck's term-by-term prediction into answers the
//! group otherwise works out by hand — where the memory goes (`explain`), which
//! single change saves the most (`levers`), which configs fit a GPU and budget
//! (`fit`), and how the peak scales with the input (`scale`).
//!
//! Everything here goes through the precheck's public API (`Predictor::predict`,
//! `Prediction::terms`, `verdict`); the advisor adds no memory model of its own,
//! so its answers are exactly as good as the calibrated predictor.

pub mod explain;
pub mod fit;
pub mod levers;
pub mod plot;
pub mod scale;
mod train_phases;

use facts::{Mode, RunConfig};

use crate::precheck::{PrecheckError, Prediction, GIB};
use crate::sweep::{Sweep, SweepConfig};

/// Why the advisor cannot answer.
#[derive(Debug, thiserror::Error)]
pub enum AdvisorError {
    #[error(transparent)]
    Precheck(#[from] PrecheckError),
    #[error("no config named `{name}` in {experiment} (configs: {known})")]
    UnknownConfig { name: String, experiment: String, known: String },
    #[error("{experiment} has no valid config to explain")]
    NoValidConfig { experiment: String },
    #[error("config `{name}` cannot run: {reasons}")]
    InvalidConfig { name: String, reasons: String },
    #[error("bad {what} `{value}`: {why}")]
    BadArgument { what: &'static str, value: String, why: String },
    #[error("plot: {0}")]
    Plot(String),
}

/// The config `explain` talks about: the one named, or the first valid one
/// (the sweep's first entries are often invalid on one of two latents).
pub fn pick<'a>(sweep: &'a Sweep, name: Option<&str>) -> Result<&'a SweepConfig, AdvisorError> {
    let experiment = sweep.experiment.name.clone();
    let found = match name {
        Some(n) => sweep.get(n).ok_or_else(|| AdvisorError::UnknownConfig {
            name: n.to_string(),
            experiment: experiment.clone(),
            known: sweep.configs.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", "),
        })?,
        None => sweep.configs.iter().find(|c| c.is_valid()).ok_or(AdvisorError::NoValidConfig { experiment })?,
    };
    if !found.is_valid() {
        let reasons = found.invalid.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ");
        return Err(AdvisorError::InvalidConfig { name: found.name.clone(), reasons });
    }
    Ok(found)
}

/// The peak that matters for `mode`, in GiB: the profiling peak, or steady-state
/// training with AdamW moments and the EMA copy resident.
pub fn mode_peak_gib(pred: &Prediction, mode: Mode) -> f64 {
    match mode {
        Mode::Profile => pred.peak_bytes / GIB,
        Mode::Train => pred.train_peak_bytes / GIB,
    }
}

/// Parameters of `cfg` (exact; `None` when it cannot be built).
pub fn params_of(cfg: &RunConfig) -> Option<u64> {
    facts::params::count(&cfg.model, &cfg.input, cfg.out_channels).ok()
}

/// `8x64x64x40 (C,H,W,D)`: an input shape, for grouping (as reports write it).
pub fn input_label(cfg: &RunConfig) -> String {
    cfg.input.to_string()
}
