//! Input scaling: the predicted peak of a config at a new input shape, and the
//! ratio to its current peak (the group measured these by hand going from
//! 128x128 to 256x256 slices).
//!
//! `--scale-input F` multiplies H and W by F and keeps D: that is how the group
//! went from exp11 (80, 64, 64) to exp11_1 (80, 128, 128), where the depth axis
//! (160 slices, 80 after space-to-depth) stays. `--input D,H,W` sets any shape.

use facts::{RunConfig, Spatial};
use serde::Serialize;
use std::str::FromStr;

use super::{mode_peak_gib, AdvisorError};
use crate::precheck::Predictor;
use crate::util::table::render_table;

/// The new input shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewInput {
    /// H and W multiplied by this factor, D kept.
    ScaleHw(u32),
    /// An explicit D, H, W.
    Exact(Spatial),
}

impl NewInput {
    pub fn apply(self, s: Spatial) -> Spatial {
        match self {
            NewInput::ScaleHw(f) => Spatial::new(s.d, s.h * f, s.w * f),
            NewInput::Exact(sp) => sp,
        }
    }
    /// What is scaled, in words.
    pub fn describe(self) -> String {
        match self {
            NewInput::ScaleHw(f) => format!("H and W x{f}, D kept"),
            NewInput::Exact(sp) => format!("input set to D,H,W = {},{},{}", sp.d, sp.h, sp.w),
        }
    }
}

/// `80,128,128` (D,H,W) as `--input` takes it.
impl FromStr for NewInput {
    type Err = AdvisorError;
    fn from_str(s: &str) -> Result<Self, AdvisorError> {
        let bad = |why: &str| AdvisorError::BadArgument { what: "--input", value: s.to_string(), why: why.to_string() };
        let v: Vec<u32> = s
            .split([',', 'x'])
            .map(|p| p.trim().parse::<u32>())
            .collect::<Result<_, _>>()
            .map_err(|_| bad("expected D,H,W as three positive integers"))?;
        match v.as_slice() {
            [d, h, w] if *d > 0 && *h > 0 && *w > 0 => Ok(NewInput::Exact(Spatial::new(*d, *h, *w))),
            _ => Err(bad("expected D,H,W as three positive integers")),
        }
    }
}

/// One config's peak before and after.
#[derive(Debug, Clone, Serialize)]
pub struct Scaling {
    pub config: String,
    pub summary: String,
    pub from: Spatial,
    pub to: Spatial,
    pub from_gib: f64,
    /// `None` when the new shape breaks a shape rule (reason in `invalid`).
    pub to_gib: Option<f64>,
    pub ratio: Option<f64>,
    pub invalid: Option<String>,
    pub capacity_gib: f64,
}

/// The config at the new input shape (everything else unchanged).
pub fn rescaled(cfg: &RunConfig, to: NewInput) -> RunConfig {
    let mut c = cfg.clone();
    c.input.spatial = to.apply(cfg.input.spatial);
    c
}

/// Predict `cfg` at its own input and at the new one, judged against
/// `capacity_gib` (the sweep's: `Sweep::capacity`).
pub fn scaling(
    predictor: &Predictor,
    cfg: &RunConfig,
    to: NewInput,
    capacity_gib: f64,
) -> Result<Scaling, AdvisorError> {
    let from_gib = mode_peak_gib(&predictor.predict_peak(cfg)?, cfg.mode);
    let new = rescaled(cfg, to);
    let problems = facts::validate::validate(&new);
    let (to_gib, invalid) = if problems.is_empty() {
        (Some(mode_peak_gib(&predictor.predict_peak(&new)?, new.mode)), None)
    } else {
        (None, Some(problems.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ")))
    };
    Ok(Scaling {
        config: cfg.name.clone(),
        summary: cfg.model.summary(),
        from: cfg.input.spatial,
        to: new.input.spatial,
        from_gib,
        to_gib,
        ratio: to_gib.map(|t| t / from_gib),
        invalid,
        capacity_gib,
    })
}

/// The scalings as a table (resolutions written H x W x D as the reports do).
pub fn render(rows: &[Scaling], to: NewInput) -> String {
    let mut cells = vec![vec![
        "Config".to_string(),
        "Dims".into(),
        "From".into(),
        "Peak".into(),
        "To".into(),
        "Peak".into(),
        "Ratio".into(),
        "Fits".into(),
    ]];
    for r in rows {
        let (to_peak, ratio, fits) = match (r.to_gib, r.ratio) {
            (Some(g), Some(x)) => (
                crate::precheck::memory(g),
                format!("x{x:.2}"),
                if g <= r.capacity_gib { "yes".to_string() } else { format!("no (> {:.0}G)", r.capacity_gib) },
            ),
            _ => ("-".into(), "-".into(), format!("invalid: {}", r.invalid.as_deref().unwrap_or("?"))),
        };
        cells.push(vec![
            r.config.clone(),
            r.summary.clone(),
            r.from.to_string(),
            crate::precheck::memory(r.from_gib),
            r.to.to_string(),
            to_peak,
            ratio,
            fits,
        ]);
    }
    format!("scaling the input: {} (resolutions as H x W x D)\n{}", to.describe(), render_table(&cells))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_explicit_shapes() {
        assert_eq!("80,128,128".parse::<NewInput>().unwrap(), NewInput::Exact(Spatial::new(80, 128, 128)));
        assert!("80,128".parse::<NewInput>().is_err());
        assert!("80,0,128".parse::<NewInput>().is_err());
        assert!("a,b,c".parse::<NewInput>().is_err());
    }

    #[test]
    fn scale_keeps_depth() {
        assert_eq!(NewInput::ScaleHw(2).apply(Spatial::new(80, 64, 64)), Spatial::new(80, 128, 128));
    }
}
