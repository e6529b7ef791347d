//! Training-run records: one of the group's whole training runs, with the
//! peak GPU memory it reached, in the format of `data/training-runs.jsonl`
//! (its README in `data/README.md` says what every field means and where it
//! was read). [`TrainingRecord::run_config`] turns one into the `mode: train`
//! config the precheck predicts.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::training::{Compile, Compression, CompressionKind, Extractor, Generation, Training, Validation};
use crate::{Gpu, Input, ModelSpec, Precision, RunConfig, Spatial};

/// One line of a training-run file: the fields the prediction reads (the
/// rest, `sources`, `notes`, `overrides`, …, is provenance and is ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct TrainingRecord {
    pub id: String,
    /// Runs of one group share every memory-relevant field.
    pub group: String,
    pub family: String,
    /// The network in experiment-file form.
    pub model: Value,
    pub input: Input,
    pub output_channels: u32,
    pub pixel_spatial: Spatial,
    pub batch: u32,
    pub grad_accum: u32,
    pub precision: Precision,
    pub grad_ckpt: bool,
    pub compile: bool,
    pub compiled_fused_step_cuda_graphs: bool,
    pub ema_copies: u32,
    pub latent: Option<Latent>,
    pub generation: Value,
    pub validation: Value,
    pub extras: BTreeMap<String, Value>,
    /// `YYYY-MM-DD HH:MM`: which code era ran it.
    pub started: String,
    /// The peak in GiB (`torch.cuda.max_memory_allocated` over the run).
    pub peak_gib: f64,
    pub confidence: String,
}

/// The compression model of a latent run, as the record describes it.
#[derive(Debug, Clone, Deserialize)]
pub struct Latent {
    /// `VQ-VAE (MONAI VQVAE, spatial_dims=3)` or an AutoencoderKL.
    pub compression: String,
    /// `channels [64,128], num_res_layers 2, …`.
    pub architecture: String,
    pub latent_channels: u32,
}

/// A record that does not describe a config the precheck can build.
#[derive(Debug, thiserror::Error)]
pub enum TrainingRecordError {
    #[error("{id}: family `{family}` has no walk in this project")]
    UnknownFamily { id: String, family: String },
    #[error("{id}: model: {message}")]
    Model { id: String, message: String },
    #[error("{id}: {field}: {message}")]
    Field { id: String, field: &'static str, message: String },
}

/// The day the trainer's generation code started moving the optimizer and
/// model to the CPU around sampling (`validation.py@4aa5074:499`).
const OFFLOAD_FROM: &str = "2026-03-08";
/// The day the extractors stopped being compiled with CUDA graphs (`ea57694`).
const EXTRACTORS_EAGER_FROM: &str = "2026-02-15";

impl TrainingRecord {
    /// The config the run trained, as a `mode: train` config on an 80 GB A100.
    pub fn run_config(&self) -> Result<RunConfig, TrainingRecordError> {
        let model = self.model_spec()?;
        Ok(RunConfig {
            experiment: "training-runs".into(),
            name: self.id.clone(),
            model,
            input: self.input,
            out_channels: self.output_channels,
            batch: self.batch,
            precision: self.precision,
            grad_ckpt: self.grad_ckpt,
            mode: crate::Mode::Train,
            steps: 1,
            gpu: Gpu::A100Sxm80,
            training: Some(self.training()?),
        })
    }

    fn model_spec(&self) -> Result<ModelSpec, TrainingRecordError> {
        if !["unet", "dit", "hdit", "uvit", "mamba"].contains(&self.family.as_str()) {
            return Err(TrainingRecordError::UnknownFamily { id: self.id.clone(), family: self.family.clone() });
        }
        let mut m = self.model.clone();
        // `qk_norm` is the group's code's fact; the walks know it per family.
        if let Some(o) = m.as_object_mut() {
            o.remove("qk_norm");
        }
        serde_json::from_value(m)
            .map_err(|e| TrainingRecordError::Model { id: self.id.clone(), message: e.to_string() })
    }

    /// The training facts of the run.
    pub fn training(&self) -> Result<Training, TrainingRecordError> {
        let compile = match (self.compile, self.compiled_fused_step_cuda_graphs) {
            (_, true) => Compile::ReduceOverhead,
            (true, false) => Compile::Default,
            (false, false) => Compile::Off,
        };
        let extra = |k: &str| self.extras.get(k);
        let augmentation = extra("augmentation");
        let controlnet = extra("controlnet").and_then(|c| c.get("enabled")).and_then(Value::as_bool) == Some(true);
        Ok(Training {
            grad_accum: self.grad_accum.max(1),
            ema_copies: self.ema_copies,
            compile,
            cudnn_benchmark: true,
            compression: self.latent.as_ref().map(|l| self.compression(l)).transpose()?,
            pixel_spatial: Some(self.pixel_spatial),
            validation: Validation {
                enabled: true,
                msssim_3d: self.validation_says("msssim_3d", "MS-SSIM"),
                lpips: self.validation_says("lpips_2p5d", "LPIPS"),
            },
            generation: self.generation()?,
            controlnet,
            extra_forwards: u32::from(augmentation.and_then(|a| a.get("sda")).is_some()),
            resume: extra("init_from").is_some(),
        })
    }

    fn validation_says(&self, key: &str, word: &str) -> bool {
        match (self.validation.get(key), self.validation.get("metrics")) {
            (Some(v), _) => v.as_bool() == Some(true),
            (None, Some(m)) => m.as_str().is_some_and(|s| s.contains(word)),
            (None, None) => false,
        }
    }

    fn generation(&self) -> Result<Generation, TrainingRecordError> {
        let g = &self.generation;
        let field = |message: String| TrainingRecordError::Field { id: self.id.clone(), field: "generation", message };
        let enabled = g.get("enabled").and_then(Value::as_bool).ok_or_else(|| field("no `enabled`".into()))?;
        let era = g.get("code_era").and_then(Value::as_str);
        let day = self.started.get(..10).unwrap_or(&self.started);
        let radimagenet = match era {
            Some(e) => e == "G2",
            None => g.get("feature_extractors").and_then(Value::as_str).is_some_and(|s| s.contains("RadImageNet")),
        };
        let mut extractors = vec![Extractor::Resnet50, Extractor::Biomedclip];
        if radimagenet {
            extractors.insert(1, Extractor::RadimagenetResnet50);
        }
        let cfg_scale = g.get("cfg_scale").and_then(Value::as_f64).unwrap_or(1.0);
        let samples = g.get("samples_extended").and_then(Value::as_u64).unwrap_or(1) as u32;
        Ok(Generation {
            enabled,
            samples,
            cfg: cfg_scale > 1.0,
            extractors,
            offload: match era {
                Some(e) => e == "G2",
                None => day >= OFFLOAD_FROM,
            },
            compiled_extractors: match era {
                Some(e) => e == "G0",
                None => day < EXTRACTORS_EAGER_FROM,
            },
        })
    }

    fn compression(&self, l: &Latent) -> Result<Compression, TrainingRecordError> {
        let field = |message: String| TrainingRecordError::Field { id: self.id.clone(), field: "latent", message };
        let kind = if l.compression.contains("VQ") {
            CompressionKind::Vqvae
        } else if l.compression.contains("KL") {
            CompressionKind::Kl
        } else {
            return Err(field(format!("unknown compression model `{}`", l.compression)));
        };
        let channels = list_after(&l.architecture, "channels [")
            .ok_or_else(|| field(format!("no `channels [..]` in `{}`", l.architecture)))?;
        let num_res_layers = number_after(&l.architecture, "num_res_layers ").unwrap_or(2);
        Ok(Compression { kind, channels, num_res_layers, latent_channels: l.latent_channels })
    }
}

/// `[64,128]` after `key` (the first occurrence at a word start).
fn list_after(text: &str, key: &str) -> Option<Vec<u32>> {
    let at = text
        .match_indices(key)
        .find(|(i, _)| *i == 0 || !text.as_bytes()[i - 1].is_ascii_alphanumeric() && text.as_bytes()[i - 1] != b'_')?
        .0;
    let rest = &text[at + key.len()..];
    let end = rest.find(']')?;
    rest[..end].split(',').map(|x| x.trim().parse().ok()).collect()
}

fn number_after(text: &str, key: &str) -> Option<u32> {
    let rest = &text[text.find(key)? + key.len()..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Read a training-run JSONL file; errors name the line.
pub fn read_jsonl(text: &str) -> Result<Vec<TrainingRecord>, (usize, serde_json::Error)> {
    crate::jsonl::values(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compression_architecture_is_read_from_its_words() {
        let a = "channels [64,128], num_res_layers 2, num_res_channels [64,128], downsample [[2,4,1,1]]";
        assert_eq!(list_after(a, "channels ["), Some(vec![64, 128]));
        assert_eq!(number_after(a, "num_res_layers "), Some(2));
        assert_eq!(list_after("num_res_channels [1,2]", "channels ["), None);
    }
}
