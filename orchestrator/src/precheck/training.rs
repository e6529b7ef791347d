//! The training run, phase by phase: what the group's training process holds
//! at its high-water mark (`torch.cuda.max_memory_allocated` over the whole
//! run, never reset), built from the same walk as the profiling peak.
//!
//! A training process goes through four phases, one after another; its peak
//! is the largest of them:
//!
//! * **start-up**: the model, the compression model, and a resumed run's
//!   checkpoint loaded straight onto the GPU beside them;
//! * **the step**: the forward/backward walk at the run's batch (activations
//!   kept by a `torch.compile`d model scaled by what fusion drops), AdamW's
//!   moments, EMA copies, gradients kept across accumulated micro-batches,
//!   the private pools of CUDA graphs;
//! * **validation**: the training state resident, a no-grad forward, the
//!   compression model decoding the prediction at full resolution (fp32);
//! * **generation**: sampling (a no-grad forward per step, a batch of two
//!   under classifier-free guidance), decoding, and the feature extractors,
//!   beside the training state (or, in the code that offloads, the weights
//!   alone).
//!
//! The handful of coefficients ([`TrainCoefficients`]) are fitted on the
//! group's training runs (`data/training-runs.jsonl`) and shipped in
//! `orchestrator/calibration/training.json`; each is a physical quantity,
//! documented where it is declared.

use facts::training::{Compile, Compression, CompressionKind, Training};
use facts::RunConfig;
use serde::{Deserialize, Serialize};

use super::{Seg, GIB};

/// The training coefficients shipped with the binary.
pub const BUILTIN_TRAINING: &str = include_str!("../../calibration/training.json");

/// The fitted quantities of the training phases (`calibration/training.json`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainCoefficients {
    /// Fraction of the eager walk's forward/backward activations a
    /// `torch.compile`d model (default mode) keeps: Inductor fuses
    /// elementwise chains and saves fewer intermediates for backward.
    pub compile_keep: f64,
    /// The private memory pool of a forward+loss captured as CUDA graphs
    /// (`reduce-overhead`), as a fraction of the forward/backward's dynamic
    /// bytes: the graph's static inputs, outputs and intermediates.
    pub graph_pool: f64,
    /// The working set of a no-grad forward, as a fraction of the running
    /// block's transient buffers and attention scores in the training walk
    /// at the same batch (no activations are kept for backward; the
    /// convolution buffers and the scores of the largest block are).
    pub inference_keep: f64,
    /// Tensors of the largest decoder level alive at once while the
    /// compression model decodes (input, output, residual, workspace), fp32.
    pub decode_tensors: f64,
    /// cuDNN's benchmark workspace when sampling meets new convolution
    /// shapes (a batch of two), bytes per UNet parameter: the algorithms it
    /// times (FFT, non-fused Winograd) hold transformed filters, which grow
    /// with the convolutions' weights. PyTorch lets an algorithm's workspace
    /// be at most the largest block the caching allocator holds free, which is
    /// what the training step freed; the code that empties the cache before
    /// sampling (`offload`) leaves none. Transformers' only convolution is
    /// the patch embedding: none.
    pub conv_workspace_per_param: f64,
    /// The feature extractors' activations and the metric buffers of a
    /// generation pass (32 slices a chunk at 224x224, the sampled volumes,
    /// features), GiB: what generation holds beyond the extractors' weights.
    pub generation_buffers_gib: f64,
    /// The extractors' CUDA-graph pools in the code that compiled them
    /// (before 2026-02-15), GiB.
    pub extractor_graphs_gib: f64,
    /// The relative band of the training figure where the runs cover the
    /// config: the p90 of the fit's error on those runs.
    pub rel_uncertainty: f64,
    /// Where the config is outside what the runs cover (another family,
    /// a compression model, a code era none of them ran), the band instead.
    pub rel_uncertainty_uncovered: f64,
}

impl TrainCoefficients {
    /// The shipped coefficients (parsed once: every predictor carries them).
    pub fn builtin() -> Self {
        static SHIPPED: std::sync::OnceLock<TrainCoefficients> = std::sync::OnceLock::new();
        *SHIPPED.get_or_init(|| {
            let file: TrainingFile = serde_json::from_str(BUILTIN_TRAINING).expect("shipped training.json parses");
            file.coefficients
        })
    }
}

/// `calibration/training.json`: the coefficients and where they came from.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingFile {
    pub note: String,
    pub coefficients: TrainCoefficients,
}

/// One phase of a training run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainPhase {
    Startup,
    Step,
    Validation,
    Generation,
}

impl TrainPhase {
    pub fn name(self) -> &'static str {
        match self {
            TrainPhase::Startup => "start-up",
            TrainPhase::Step => "step",
            TrainPhase::Validation => "validation",
            TrainPhase::Generation => "generation",
        }
    }
    /// For a table cell: `start`, `step`, `val`, `gen`.
    pub fn short(self) -> &'static str {
        match self {
            TrainPhase::Startup => "start",
            TrainPhase::Step => "step",
            TrainPhase::Validation => "val",
            TrainPhase::Generation => "gen",
        }
    }
}

/// One named quantity of a phase.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PhaseTerm {
    pub name: &'static str,
    pub bytes: f64,
}

/// A phase's peak and what it is made of.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhasePeak {
    pub phase: TrainPhase,
    pub bytes: f64,
    pub terms: Vec<PhaseTerm>,
}

impl PhasePeak {
    fn new(phase: TrainPhase, terms: Vec<PhaseTerm>) -> Self {
        let terms: Vec<PhaseTerm> = terms.into_iter().filter(|t| t.bytes > 0.0).collect();
        PhasePeak { phase, bytes: terms.iter().map(|t| t.bytes).sum(), terms }
    }
}

/// The training prediction: every phase, the one that sets the peak, the band.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainPrediction {
    pub phases: Vec<PhasePeak>,
    pub peak_phase: TrainPhase,
    pub peak_bytes: f64,
    pub rel_uncertainty: f64,
    /// Why the band is the wide one, where it is.
    pub uncovered: Option<String>,
}

impl TrainPrediction {
    pub fn peak_gib(&self) -> f64 {
        self.peak_bytes / GIB
    }
    pub fn phase(&self, phase: TrainPhase) -> Option<&PhasePeak> {
        self.phases.iter().find(|p| p.phase == phase)
    }
}

/// What the profiling walk hands the training phases.
pub(crate) struct StepWalk<'a> {
    pub segs: &'a [Seg],
    /// Exact parameters of the backbone.
    pub params: f64,
    /// Bytes per weight (4: fp32 master weights).
    pub weight_bytes: f64,
    /// The forward/backward's dynamic bytes at its peak (activations, bf16
    /// weight copies, gradients so far, transients).
    pub dynamic: f64,
    /// Weights, data tensors and fixed overhead.
    pub resident: f64,
    /// The optimizer's parameter-sized temporaries, in weights.
    pub opt_temp: f64,
}

/// One named quantity.
fn term(name: &'static str, bytes: f64) -> PhaseTerm {
    PhaseTerm { name, bytes }
}

/// Whose training process a `mode: train` run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trainer {
    /// The group's `medgen.scripts.train` (the PyTorch runtime): every phase.
    Group,
    /// This project's worker: repeated steps, no validation or generation.
    Worker,
}

/// The phases of `cfg`'s training run.
pub(crate) fn predict(cfg: &RunConfig, walk: &StepWalk, c: &TrainCoefficients, trainer: Trainer) -> TrainPrediction {
    // The group's defaults where the config names none (shared: a sweep
    // predicts thousands of configs).
    static DEFAULTS: std::sync::OnceLock<Training> = std::sync::OnceLock::new();
    let t = cfg.training.as_ref().unwrap_or_else(|| DEFAULTS.get_or_init(Training::default));
    let s = State::of(t, walk);
    let mut phases = vec![startup(t, &s), step(t, walk, &s, c)];
    if trainer == Trainer::Group {
        phases.push(validation(cfg, t, walk, &s, c));
        phases.push(generation(cfg, t, walk, &s, c));
    }
    let peak = phases.iter().max_by(|a, b| a.bytes.total_cmp(&b.bytes)).expect("start-up and step at least");
    let uncovered = uncovered(cfg, t);
    TrainPrediction {
        peak_phase: peak.phase,
        peak_bytes: peak.bytes,
        rel_uncertainty: if uncovered.is_some() { c.rel_uncertainty_uncovered } else { c.rel_uncertainty },
        uncovered,
        phases,
    }
}

/// The parameter-sized state of a run, in bytes.
struct State {
    /// fp32 master weights, data tensors and fixed overhead.
    resident: f64,
    /// The backbone's weights alone.
    weights: f64,
    /// AdamW's two moments over what trains.
    moments: f64,
    /// One gradient per trainable parameter.
    grads: f64,
    ema: f64,
    /// The compression model's weights, fp32, for the whole run.
    compression: f64,
    /// ControlNet's trainable copy (weights; its moments are in `moments`).
    controlnet: f64,
}

impl State {
    fn of(t: &Training, walk: &StepWalk) -> State {
        let wb = walk.weight_bytes;
        // ControlNet: the UNet is frozen; a copy of its encoder and middle
        // block trains (taken as half the UNet's parameters).
        let trainable = if t.controlnet { 0.5 * walk.params } else { walk.params };
        State {
            resident: walk.resident,
            weights: wb * walk.params,
            moments: 2.0 * wb * trainable,
            grads: wb * trainable,
            ema: 4.0 * walk.params * t.ema_copies as f64,
            compression: t.compression.as_ref().map_or(0.0, |m| 4.0 * compression_params(m) as f64),
            controlnet: if t.controlnet { wb * trainable } else { 0.0 },
        }
    }
    fn training_state(&self) -> Vec<PhaseTerm> {
        vec![
            term("weights, data, overhead", self.resident),
            term("ControlNet's trainable copy", self.controlnet),
            term("AdamW moments", self.moments),
            term("EMA copies", self.ema),
            term("compression model (fp32)", self.compression),
        ]
    }
}

fn startup(t: &Training, s: &State) -> PhasePeak {
    // A resumed run's checkpoint (weights, moments, EMA copies) is loaded to
    // the GPU while the freshly built model is already there.
    let checkpoint = if t.resume { s.weights + s.moments + s.ema } else { 0.0 };
    PhasePeak::new(
        TrainPhase::Startup,
        vec![
            term("weights, data, overhead", s.resident),
            term("ControlNet's trainable copy", s.controlnet),
            term("EMA copies", s.ema),
            term("compression model (fp32)", s.compression),
            term("checkpoint loaded onto the GPU", checkpoint),
        ],
    )
}

fn step(t: &Training, w: &StepWalk, s: &State, c: &TrainCoefficients) -> PhasePeak {
    let keep = compile_keep(t, c);
    let carried = t.grad_accum > 1 || t.extra_forwards > 0;
    let pool = if t.compile == Compile::ReduceOverhead { c.graph_pool * w.dynamic } else { 0.0 };
    let mut terms = s.training_state();
    terms.push(term("forward/backward activations and buffers", keep * w.dynamic));
    terms.push(term("gradients kept across micro-batches", if carried { s.grads } else { 0.0 }));
    terms.push(term("CUDA-graph private pool", pool));
    let fwd = PhasePeak::new(TrainPhase::Step, terms);
    // The optimizer step itself: gradients, moments and temporaries.
    let mut opt = s.training_state();
    opt.push(term("gradients", s.grads));
    opt.push(term("optimizer temporaries", w.opt_temp * s.grads));
    let opt = PhasePeak::new(TrainPhase::Step, opt);
    if fwd.bytes >= opt.bytes {
        fwd
    } else {
        opt
    }
}

/// The fraction of the eager walk's activations the compiled model keeps.
fn compile_keep(t: &Training, c: &TrainCoefficients) -> f64 {
    if t.compile == Compile::Default {
        c.compile_keep
    } else {
        1.0
    }
}

/// The no-grad forward's working set at `batch`.
fn inference(w: &StepWalk, cfg: &RunConfig, batch: f64, c: &TrainCoefficients) -> f64 {
    let largest = w.segs.iter().map(|s| s.transient + s.scores).fold(0.0, f64::max);
    c.inference_keep * largest * batch / cfg.batch.max(1) as f64
}

/// The decoder's working set at full resolution, fp32, no autocast.
fn decode(cfg: &RunConfig, t: &Training, c: &TrainCoefficients) -> f64 {
    let Some(m) = &t.compression else { return 0.0 };
    let pixel = pixel_voxels(cfg, t);
    // The VQ-VAE downsamples before its first level (its channels[0] sits at
    // an eighth of the voxels); the KL autoencoder's first level is at full
    // resolution. Each level down has an eighth of the voxels; the output is
    // one channel at full resolution.
    let first = match m.kind {
        CompressionKind::Vqvae => 1,
        CompressionKind::Kl => 0,
    };
    let largest = m
        .channels
        .iter()
        .enumerate()
        .map(|(i, &ch)| ch as f64 * pixel / 8f64.powi(i as i32 + first))
        .fold(pixel, f64::max);
    c.decode_tensors * 4.0 * largest
}

fn pixel_voxels(cfg: &RunConfig, t: &Training) -> f64 {
    t.pixel_spatial.unwrap_or(cfg.input.spatial).voxels() as f64
}

fn validation(cfg: &RunConfig, t: &Training, w: &StepWalk, s: &State, c: &TrainCoefficients) -> PhasePeak {
    if !t.validation.enabled {
        return PhasePeak::new(TrainPhase::Validation, vec![]);
    }
    let mut terms = s.training_state();
    terms.push(term("gradients of the last step", s.grads));
    let fwd = inference(w, cfg, cfg.batch.max(1) as f64, c);
    let dec = decode(cfg, t, c);
    if dec > fwd {
        terms.push(term("decoding the prediction", dec));
    } else {
        terms.push(term("no-grad forward", fwd));
    }
    PhasePeak::new(TrainPhase::Validation, terms)
}

fn generation(cfg: &RunConfig, t: &Training, w: &StepWalk, s: &State, c: &TrainCoefficients) -> PhasePeak {
    let g = &t.generation;
    if !g.enabled {
        return PhasePeak::new(TrainPhase::Generation, vec![]);
    }
    let mut terms = if g.offload {
        // Optimizer state and model on the CPU, the model back for sampling.
        vec![
            term("weights, data, overhead", s.resident),
            term("ControlNet's trainable copy", s.controlnet),
            term("EMA copies", s.ema),
            term("compression model (fp32)", s.compression),
        ]
    } else {
        let mut v = s.training_state();
        v.push(term("gradients of the last step", s.grads));
        v
    };
    let extractors: f64 = g.extractors.iter().map(|e| 4.0 * e.params() as f64).sum();
    terms.push(term("feature extractors' weights", extractors));
    if g.compiled_extractors {
        terms.push(term("extractors' CUDA-graph pools", c.extractor_graphs_gib * GIB));
    }
    // Sampling: a no-grad forward per step (a batch of two under guidance),
    // and cuDNN timing the new shapes with what the cache holds free.
    let sampling = inference(w, cfg, if g.cfg { 2.0 } else { 1.0 }, c);
    let cached = if g.offload { 0.0 } else { compile_keep(t, c) * w.dynamic };
    let workspace = match cfg.model {
        facts::ModelSpec::Unet(_) => (c.conv_workspace_per_param * w.params).min(cached),
        _ => 0.0,
    };
    let dec = decode(cfg, t, c);
    let buffers = c.generation_buffers_gib * GIB;
    if sampling + workspace >= dec.max(buffers) {
        terms.push(term("sampling (no-grad forward)", sampling));
        terms.push(term("cuDNN benchmark workspace at the sampling batch", workspace));
    } else if dec >= buffers {
        terms.push(term("decoding the samples", dec));
    } else {
        terms.push(term("extractor activations and metric buffers", buffers));
    }
    PhasePeak::new(TrainPhase::Generation, terms)
}

/// Why a config is outside what the group's runs cover, if it is.
fn uncovered(cfg: &RunConfig, t: &Training) -> Option<String> {
    use facts::model::Family;
    let mut why = Vec::new();
    if let Some(m) = &t.compression {
        if m.kind == CompressionKind::Kl {
            why.push("a KL autoencoder (the runs decode with VQ-VAEs only)".to_string());
        }
    }
    if cfg.batch > 1 && cfg.model.family() != Family::Unet {
        why.push(format!("batch {} on a {} (the runs' transformers train at batch 1)", cfg.batch, cfg.model.family()));
    }
    if t.controlnet {
        why.push("ControlNet (one run)".to_string());
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// Parameters of a compression model (MONAI `VQVAE` / `AutoencoderKL`,
/// spatial_dims=3, one input channel): per level a strided 4x4x4
/// convolution and `num_res_layers` residual units (3x3x3 C->C, 1x1x1
/// C->C), the latent projection, and the mirror decoder with transposed
/// convolutions; the VQ-VAE's codebook is small beside them.
pub fn compression_params(m: &Compression) -> u64 {
    let conv = |cin: u64, cout: u64, k: u64| cin * cout * k * k * k + cout;
    let mut n = 0u64;
    let mut prev = 1u64;
    for &ch in &m.channels {
        let ch = ch as u64;
        // Encoder: downsample, residual units; decoder: the same, transposed.
        n += 2 * (conv(prev, ch, 4) + m.num_res_layers as u64 * (conv(ch, ch, 3) + conv(ch, ch, 1)));
        prev = ch;
    }
    let latent = m.latent_channels as u64;
    n + 2 * conv(prev, latent, 3)
}
