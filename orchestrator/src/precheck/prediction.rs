//! What the precheck predicts for one config: the peak, its phase, the
//! band, and (on request) the breakdown into terms.

use serde::{Deserialize, Serialize};

use super::uncertainty::Distance;
use super::GIB;

/// What a term of the breakdown is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TermKind {
    Weights,
    Grads,
    Optimizer,
    Activations,
    AttentionScores,
    /// Encoder outputs held for the decoder (UNet / U-ViT / HDiT long skips).
    Skip,
    /// Transient buffers at the peak (backward gradients, recompute, temporaries).
    Workspace,
    /// Full-resolution data tensors (input, noise, target, prediction, loss).
    Data,
    Overhead,
}

impl TermKind {
    pub fn name(self) -> &'static str {
        match self {
            TermKind::Weights => "weights",
            TermKind::Grads => "grads",
            TermKind::Optimizer => "optimizer",
            TermKind::Activations => "activations",
            TermKind::AttentionScores => "attention scores",
            TermKind::Skip => "skip",
            TermKind::Workspace => "workspace",
            TermKind::Data => "data",
            TermKind::Overhead => "overhead",
        }
    }
}

/// Which phase(s) a term is resident in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TermPhase {
    /// Forward + backward only (activations, autocast weight copies).
    FwdBwd,
    /// The optimizer step only (gradients, moments, temporaries).
    Step,
    /// Resident throughout (weights, data, overhead).
    Both,
}

/// The phase that sets the peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeakPhase {
    FwdBwd,
    Step,
}

impl PeakPhase {
    pub fn name(self) -> &'static str {
        match self {
            PeakPhase::FwdBwd => "fwd/bwd",
            PeakPhase::Step => "step",
        }
    }
}

/// One line of the breakdown. Names are static so a prediction costs no string
/// allocation (the precheck runs over whole sweeps and inside the advisor's search).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Term {
    pub name: &'static str,
    /// UNet level / HDiT level (0 = full resolution); `None` for whole-model terms.
    pub level: Option<u8>,
    pub kind: TermKind,
    pub phase: TermPhase,
    pub bytes: f64,
}

/// The predicted memory of one config, with its breakdown.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    /// Exact parameter count.
    pub params: u64,
    pub terms: Vec<Term>,
    pub fwd_bwd_bytes: f64,
    pub step_bytes: f64,
    pub peak_phase: PeakPhase,
    /// The profiling peak: max of the two phases.
    pub peak_bytes: f64,
    /// The training run's peak: the largest of its phases (`train`).
    pub train_peak_bytes: f64,
    /// The training run phase by phase ([`super::training`]).
    pub train: super::training::TrainPrediction,
    /// Relative band of `peak_bytes`: the family's cross-validated p90 error
    /// in the regime that sets the peak, widened by the distance from the
    /// calibration data (see [`uncertainty`]).
    pub rel_uncertainty: f64,
    /// Why the band is wider than the family's, if it is.
    pub distance: Option<Distance>,
    /// The family's held-out error over every regime, where it is wider than
    /// `rel_uncertainty`: the verdict holds the peak to it too
    /// ([`super::judge_held_out`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub family_error: Option<f64>,
}

impl Prediction {
    pub fn peak_gib(&self) -> f64 {
        self.peak_bytes / GIB
    }
    pub fn train_peak_gib(&self) -> f64 {
        self.train_peak_bytes / GIB
    }
    /// Bytes of the terms resident in the phase that sets the peak.
    pub fn peak_terms(&self) -> impl Iterator<Item = &Term> {
        let phase = self.peak_phase;
        self.terms.iter().filter(move |t| {
            matches!(
                (t.phase, phase),
                (TermPhase::Both, _) | (TermPhase::FwdBwd, PeakPhase::FwdBwd) | (TermPhase::Step, PeakPhase::Step)
            )
        })
    }
    /// The `n` largest terms of the peak phase, largest first.
    pub fn hotspots(&self, n: usize) -> Vec<Term> {
        let mut v: Vec<Term> = self.peak_terms().copied().collect();
        v.sort_by(|a, b| b.bytes.total_cmp(&a.bytes));
        v.truncate(n);
        v
    }
}
