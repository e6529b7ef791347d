//! Measurement records: one profiled run, in the format of
//! `data/vram-measurements.jsonl`. The precheck calibrates on these; the
//! orchestrator writes them from the worker's events.

use serde::{Deserialize, Serialize};

use crate::model::{Family, Variant};
use crate::{Gpu, Precision, Spatial};

/// Outcome as the reports classify it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MeasuredStatus {
    Ok,
    /// Ran, above the group's 60 GB policy.
    OverBudget,
    Oom,
}

/// One line of a measurement JSONL file. Family-specific fields are optional.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasurementRecord {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    pub family: Family,
    /// `pytorch`, or `burn-<backend>` for this project's worker.
    pub framework: String,
    /// GPU name; a string because the worker may run on CPU or unknown devices.
    pub gpu: String,
    pub precision: Precision,
    pub grad_ckpt: bool,
    pub batch: u32,
    pub in_channels: u32,
    pub out_channels: u32,
    /// [D, H, W].
    pub spatial: [u32; 3],
    // unet
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_levels: Option<Vec<bool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_res_blocks: Option<crate::PerLevel>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_head_channels: Option<crate::PerLevel>,
    /// GroupNorm groups: 32 for MONAI's default (the latent scripts), 16 for
    /// the S2D script (`profile_s2d_3d_memory.py@7dc81f3:63-64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_num_groups: Option<u32>,
    // transformers
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<Variant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level_depths: Option<Vec<u32>>,
    // measured
    #[serde(default)]
    pub params_m: Option<f64>,
    #[serde(default)]
    pub peak_gb: Option<f64>,
    /// The measured peak in bytes, exact, where the run measured bytes (this
    /// project's worker); the group's reports give `peak_gb` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_gb: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwd_gb: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd_gb: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_reported_gb: Option<f64>,
    pub status: MeasuredStatus,
    /// Memory of the device the run had, in GiB (the worker's `device_memory_bytes`);
    /// absent in the group's reports, whose `gpu` names a card of the catalog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_memory_gb: Option<f64>,
    /// A memory limit the run was held to, in GiB (the worker's `--memory-limit`):
    /// an OOM under a limit says the run needed more than the limit, not more than the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_gb: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Why this record no longer describes what its framework runs (a worker
    /// fixed since): kept and shown, never fitted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded: Option<String>,
}

impl MeasurementRecord {
    pub fn spatial(&self) -> Spatial {
        Spatial::new(self.spatial[0], self.spatial[1], self.spatial[2])
    }
    /// The measured peak in GiB: from the exact bytes where the record has
    /// them, else its `peak_gb` (the group's reports, records written before
    /// bytes were kept). `None` for an OOM or a record without a peak.
    pub fn peak_gib(&self) -> Option<f64> {
        match (self.peak_bytes, self.status) {
            (_, MeasuredStatus::Oom) => self.peak_gb,
            (Some(b), _) => Some(b as f64 / (1u64 << 30) as f64),
            (None, _) => self.peak_gb,
        }
    }

    /// The GPU from the catalog, when the record names one.
    pub fn gpu(&self) -> Option<Gpu> {
        self.gpu.parse().ok()
    }

    /// The memory the run could use, in GiB: the limit it was held to, else the
    /// device's memory, else the catalog capacity of the GPU it names. `None`
    /// for a device of unknown size (a CPU run without a limit): an OOM there
    /// says nothing about how much was needed.
    pub fn available_gib(&self) -> Option<f64> {
        let device = self.device_memory_gb.or_else(|| self.gpu().map(Gpu::capacity_gib));
        match (self.memory_limit_gb, device) {
            (Some(l), Some(d)) => Some(l.min(d)),
            (l, d) => l.or(d),
        }
    }
}

/// A field of a config that a record does not give, so that reading the
/// record as a config ([`MeasurementRecord::run_config`]) had to assume it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unstated {
    /// UNet GroupNorm groups (no record of the group's reports gives them).
    NormGroups,
    /// UNet ResBlocks per level.
    ResBlocks,
    /// UNet channels per attention head.
    HeadChannels,
}

impl Unstated {
    /// The field as an experiment file names it.
    pub fn field(self) -> &'static str {
        match self {
            Unstated::NormGroups => "model.norm_num_groups",
            Unstated::ResBlocks => "model.num_res_blocks",
            Unstated::HeadChannels => "model.num_head_channels",
        }
    }
}

impl std::fmt::Display for Unstated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.field())
    }
}

impl MeasurementRecord {
    /// The fields of its config the record does not give (assumed by
    /// [`MeasurementRecord::run_config`]), in a fixed order.
    pub fn unstated(&self) -> Vec<Unstated> {
        if self.family != Family::Unet {
            return vec![];
        }
        let mut out = vec![];
        if self.norm_num_groups.is_none() {
            out.push(Unstated::NormGroups);
        }
        if self.num_res_blocks.is_none() {
            out.push(Unstated::ResBlocks);
        }
        if self.num_head_channels.is_none() {
            out.push(Unstated::HeadChannels);
        }
        out
    }
}

/// A record that does not describe a buildable model.
#[derive(Debug, thiserror::Error)]
#[error("record `{id}`: {what}")]
pub struct RecordError {
    pub id: String,
    pub what: String,
}

impl MeasurementRecord {
    /// The model the record describes.
    pub fn model(&self) -> Result<crate::ModelSpec, RecordError> {
        use crate::model::*;
        let missing = |field: &str| RecordError { id: self.id.clone(), what: format!("missing field `{field}`") };
        Ok(match self.family {
            Family::Unet => ModelSpec::Unet(UnetSpec {
                channels: self.channels.clone().ok_or_else(|| missing("channels"))?,
                attention_levels: self.attention_levels.clone().ok_or_else(|| missing("attention_levels"))?,
                num_res_blocks: self.num_res_blocks.clone().unwrap_or(PerLevel::All(2)),
                // The reports' UNet tables state head channels in their heading; 64 unless given.
                num_head_channels: self.num_head_channels.clone().unwrap_or(PerLevel::All(64)),
                norm_num_groups: self.norm_groups(),
            }),
            Family::Dit => ModelSpec::Dit(DitSpec {
                variant: self.variant,
                hidden: self.hidden,
                heads: self.heads,
                depth: self.depth,
                patch: self.patch.ok_or_else(|| missing("patch"))?,
            }),
            Family::Uvit => ModelSpec::Uvit(UvitSpec {
                variant: self.variant,
                hidden: self.hidden,
                heads: self.heads,
                depth: self.depth,
                patch: self.patch.ok_or_else(|| missing("patch"))?,
            }),
            Family::Hdit => ModelSpec::Hdit(HditSpec {
                variant: self.variant,
                hidden: self.hidden,
                heads: self.heads,
                patch: self.patch.ok_or_else(|| missing("patch"))?,
                level_depths: self.level_depths.clone().ok_or_else(|| missing("level_depths"))?,
            }),
            // No profiling report of the group's measures a MambaDiff: the
            // measurement format has no fields for one.
            Family::Mamba => {
                return Err(RecordError {
                    id: self.id.clone(),
                    what: "family `mamba` has no measurement-record fields (no profiling record carries one)".into(),
                })
            }
        })
    }

    /// GroupNorm groups of a recorded UNet. Records do not carry it; the group's
    /// default is 32, and a run that went through with a 16-wide level must have
    /// used fewer, so take the largest count up to 32 that divides every width.
    fn norm_groups(&self) -> u32 {
        if let Some(g) = self.norm_num_groups {
            return g;
        }
        let widths = self.channels.as_deref().unwrap_or_default();
        (1..=32).rev().find(|g| widths.iter().all(|w| w % g == 0)).unwrap_or(1)
    }

    /// The run the record measured, as a config the precheck can predict.
    /// Records from GPUs outside the catalog are taken as 80 GiB A100s.
    pub fn run_config(&self) -> Result<crate::RunConfig, RecordError> {
        Ok(crate::RunConfig {
            experiment: self.table.clone().unwrap_or_else(|| "records".into()),
            name: self.config_name.clone().unwrap_or_else(|| self.id.clone()),
            model: self.model()?,
            input: crate::Input { channels: self.in_channels, spatial: self.spatial() },
            out_channels: self.out_channels,
            batch: self.batch,
            precision: self.precision,
            grad_ckpt: self.grad_ckpt,
            mode: crate::Mode::Profile,
            steps: 1,
            gpu: self.gpu().unwrap_or(Gpu::A100Sxm80),
            training: None,
        })
    }
}

/// Read a JSONL file of records ([`crate::jsonl`]'s rule for a torn last
/// line); errors name the line.
pub fn read_jsonl(text: &str) -> Result<Vec<MeasurementRecord>, (usize, serde_json::Error)> {
    crate::jsonl::values(text)
}
