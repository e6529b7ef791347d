//! What a training run holds besides the step: the facts of the group's
//! `python -m medgen.scripts.train` that change its GPU memory, as an
//! experiment file's `training:` block writes them. Every field has the
//! group's default (their `configs/diffusion_3d.yaml` and trainer code at
//! `0ee6133`), so a `mode: train` config without the block is their current
//! recipe on a pixel-space model.
//!
//! Plain data: the precheck (`orchestrator::precheck::training`) turns it
//! into phases and bytes; the worker's `mode: train` runs what it can of it.

use serde::{Deserialize, Serialize};

use crate::Spatial;

/// The training facts of one config (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Training {
    /// Gradient accumulation steps: above 1, the gradients of the earlier
    /// micro-batches stay resident through the next forward and backward.
    pub grad_accum: u32,
    /// EMA copies of the weights on the GPU, fp32: 0, 1 (`ema_pytorch.EMA`),
    /// 2 (post-hoc EMA, one per `sigma_rel`).
    pub ema_copies: u32,
    /// How the model is compiled.
    pub compile: Compile,
    /// `torch.backends.cudnn.benchmark` (on in every training run:
    /// `core/cuda_utils.py:29`): convolution algorithms are timed once per
    /// shape, their workspaces through the caching allocator.
    pub cudnn_benchmark: bool,
    /// The compression model of a latent run, resident in fp32 for the whole
    /// run and decoding every validation prediction and generated sample.
    pub compression: Option<Compression>,
    /// The volume before any encoding (latent, wavelet, space-to-depth), [D, H, W]:
    /// what validation metrics, decoding and feature extractors see.
    /// Default: the model's input.
    pub pixel_spatial: Option<Spatial>,
    pub validation: Validation,
    pub generation: Generation,
    /// ControlNet stage 2: the UNet frozen (weights only) beside a trainable
    /// copy of its encoder; the optimizer holds the copy's state only.
    pub controlnet: bool,
    /// Extra forward+backward passes a step (SDA's augmented path).
    pub extra_forwards: u32,
    /// The run starts from a checkpoint loaded straight onto the GPU
    /// (`torch.load(..., map_location=device)`): weights, moments and EMA
    /// copies beside the model's own.
    pub resume: bool,
}

impl Default for Training {
    fn default() -> Self {
        Training {
            grad_accum: 1,
            ema_copies: 0,
            compile: Compile::Off,
            cudnn_benchmark: true,
            compression: None,
            pixel_spatial: None,
            validation: Validation::default(),
            generation: Generation::default(),
            controlnet: false,
            extra_forwards: 0,
            resume: false,
        }
    }
}

/// `torch.compile` as the trainer applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Compile {
    /// Eager PyTorch.
    #[default]
    Off,
    /// `torch.compile(model)`, default mode: fused kernels keep fewer
    /// activations for backward.
    Default,
    /// The January code's fused forward+loss compiled with
    /// `mode="reduce-overhead"`: CUDA graphs with private memory pools.
    ReduceOverhead,
}

/// A compression model (latent diffusion): MONAI's `VQVAE` or `AutoencoderKL`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compression {
    pub kind: CompressionKind,
    /// Channels per level, full resolution first (`[64, 128]` for exp8_1).
    pub channels: Vec<u32>,
    /// Residual units per level.
    #[serde(default = "two")]
    pub num_res_layers: u32,
    /// Latent channels (`embedding_dim` of the VQ-VAE).
    pub latent_channels: u32,
}

fn two() -> u32 {
    2
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompressionKind {
    Vqvae,
    Kl,
}

/// Validation every epoch: the loss on validation volumes and the metrics.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Validation {
    pub enabled: bool,
    /// 3D MS-SSIM on the whole volume.
    pub msssim_3d: bool,
    /// 2.5D LPIPS (a 2D network on centre slices of the three planes).
    pub lpips: bool,
}

impl Default for Validation {
    fn default() -> Self {
        Validation { enabled: true, msssim_3d: true, lpips: true }
    }
}

/// Sample generation for the KID/CMMD metrics.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Generation {
    pub enabled: bool,
    /// Volumes sampled at the figure interval (1 every other epoch).
    pub samples: u32,
    /// Classifier-free guidance: each sampling step runs the conditional and
    /// unconditional inputs as one batch of two.
    pub cfg: bool,
    /// The feature networks loaded for the metrics.
    pub extractors: Vec<Extractor>,
    /// The code from 2026-03-08 on: the optimizer state and the model go to
    /// the CPU around sampling (`validation.py@4aa5074:499`), so the training
    /// state is not resident while it runs.
    pub offload: bool,
    /// The code before 2026-02-15: the extractors compiled with
    /// `reduce-overhead` (CUDA graphs: private pools).
    pub compiled_extractors: bool,
}

impl Default for Generation {
    fn default() -> Self {
        Generation {
            enabled: true,
            samples: 4,
            cfg: true,
            extractors: vec![Extractor::Resnet50, Extractor::RadimagenetResnet50, Extractor::Biomedclip],
            offload: true,
            compiled_extractors: false,
        }
    }
}

/// A feature network of the generation metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Extractor {
    /// torchvision ResNet50, ImageNet weights (KID).
    Resnet50,
    /// ResNet50 with RadImageNet weights (from 2026-03-08).
    RadimagenetResnet50,
    /// BiomedCLIP (ViT-B/16 image tower and PubMedBERT text tower; CMMD).
    Biomedclip,
}

impl Extractor {
    /// Parameters as published: torchvision's ResNet50 (25,557,032); the
    /// RadImageNet ResNet50 is its trunk without the classifier (23,508,032);
    /// BiomedCLIP's open_clip model, both towers (ViT-B/16 86.2M and
    /// PubMedBERT 109.5M plus projections).
    pub fn params(self) -> u64 {
        match self {
            Extractor::Resnet50 => 25_557_032,
            Extractor::RadimagenetResnet50 => 23_508_032,
            Extractor::Biomedclip => 195_900_000,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Extractor::Resnet50 => "ResNet50",
            Extractor::RadimagenetResnet50 => "RadImageNet ResNet50",
            Extractor::Biomedclip => "BiomedCLIP",
        }
    }
}
