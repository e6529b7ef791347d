//! How a run is measured: the project's way, or the way one of the group's
//! profiling scripts measured the records it made (ModeS7/AIS4900_master;
//! what each script's columns are is its docstring below). The model, the
//! input and the optimizer are the config's; a protocol decides the loss,
//! where the peak window opens and which figures the script printed.

use serde::{Deserialize, Serialize};

use crate::peaks::PhasePeaks;

/// The measurement protocol of a run (`worker run --protocol`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// This project's: each phase's peak from its own window, the loss an
    /// fp32 mean squared error against a random target.
    #[default]
    Project,
    /// `misc/profiling/profile_latent_3d_unet.py@02d6741:96-150`: one window
    /// from before the build; loss `output.mean()` inside autocast; AdamW
    /// made after backward. Columns: Model (held after the build), Fwd, Bwd,
    /// Total (running maxima after forward, backward and the step).
    LatentUnet,
    /// `misc/profiling/profile_s2d_3d_memory.py@7dc81f3:61-106`: one window
    /// from before the build; AdamW made before forward; loss the fp32 mean
    /// squared error of the prediction against `images - noise`. One figure,
    /// after backward and the step.
    S2dUnet,
    /// `misc/profile_dit_memory.py@3140d97` and
    /// `misc/profiling/profile_hdit_uvit_memory.py@ff513e0`: the window opens
    /// after model and optimizer are built; loss `pred.float().pow(2).mean()`.
    /// One figure, the peak over forward, backward and the step.
    Transformer,
}

/// The figures a protocol's script printed for a run, in bytes (`None`:
/// the script printed no such column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupColumns {
    pub protocol: Protocol,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwd: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd: Option<u64>,
    pub total: u64,
}

impl Protocol {
    pub const ALL: [Protocol; 4] = [Protocol::Project, Protocol::LatentUnet, Protocol::S2dUnet, Protocol::Transformer];

    /// `project`, `latent-unet`, `s2d-unet`, `transformer`.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Project => "project",
            Protocol::LatentUnet => "latent-unet",
            Protocol::S2dUnet => "s2d-unet",
            Protocol::Transformer => "transformer",
        }
    }

    /// The protocol of the script behind a table of the group's records
    /// (`data/vram-measurements.jsonl`'s `table`), by the table's prefix.
    pub fn of_table(table: &str) -> Option<Protocol> {
        match table.split('_').next()? {
            "unet" => Some(Protocol::LatentUnet),
            "s2d" => Some(Protocol::S2dUnet),
            "dit" | "hdit" | "uvit" => Some(Protocol::Transformer),
            _ => None,
        }
    }

    /// The figures this protocol's script printed for a run that peaked at
    /// `peaks` per phase and held `after_build` bytes once the model was
    /// built; `None` for the project's protocol (its figures are `peaks`)
    /// or a run that did not reach the step.
    pub fn columns(self, peaks: &PhasePeaks, after_build: u64) -> Option<GroupColumns> {
        let running = |upto: &[Option<u64>]| upto.iter().flatten().copied().max();
        let (model, fwd, bwd, step) = (peaks.model, peaks.fwd, peaks.bwd, peaks.step);
        step?;
        let only = |total| GroupColumns { protocol: self, model: None, fwd: None, bwd: None, total };
        match self {
            Protocol::Project => None,
            Protocol::LatentUnet => Some(GroupColumns {
                protocol: self,
                model: Some(after_build),
                fwd: running(&[model, fwd]),
                bwd: running(&[model, fwd, bwd]),
                total: running(&[model, fwd, bwd, step])?,
            }),
            Protocol::S2dUnet => Some(only(running(&[model, fwd, bwd, step])?)),
            Protocol::Transformer => Some(only(running(&[fwd, bwd, step])?)),
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Protocol, String> {
        Protocol::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Protocol::ALL.iter().map(|p| p.name()).collect();
            format!("unknown protocol `{s}` (one of {})", names.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peaks(model: u64, fwd: u64, bwd: u64, step: u64) -> PhasePeaks {
        PhasePeaks { model: Some(model), fwd: Some(fwd), bwd: Some(bwd), step: Some(step) }
    }

    /// The latent script printed running maxima: a backward below the
    /// forward's peak reads as the forward's.
    #[test]
    fn the_latent_scripts_columns_are_running_maxima_from_before_the_build() {
        let c = Protocol::LatentUnet.columns(&peaks(120, 500, 450, 300), 100).unwrap();
        assert_eq!((c.model, c.fwd, c.bwd, c.total), (Some(100), Some(500), Some(500), 500));
        let c = Protocol::LatentUnet.columns(&peaks(120, 500, 650, 700), 100).unwrap();
        assert_eq!((c.fwd, c.bwd, c.total), (Some(500), Some(650), 700));
    }

    #[test]
    fn the_other_scripts_printed_one_figure() {
        // A build peak above the rest (a temporary while the model is made)
        // is in the S2D script's window, not in the transformer scripts'.
        let p = peaks(900, 500, 650, 700);
        assert_eq!(Protocol::S2dUnet.columns(&p, 100).unwrap().total, 900);
        assert_eq!(Protocol::Transformer.columns(&p, 100).unwrap().total, 700);
        assert_eq!(Protocol::Project.columns(&p, 100), None);
        assert_eq!(Protocol::S2dUnet.columns(&PhasePeaks { step: None, ..p }, 100), None, "no step, no figure");
    }

    #[test]
    fn names_and_tables() {
        for p in Protocol::ALL {
            assert_eq!(p.name().parse::<Protocol>(), Ok(p));
        }
        assert!("latent".parse::<Protocol>().unwrap_err().contains("one of project, latent-unet"));
        assert_eq!(Protocol::of_table("unet_latent_4x"), Some(Protocol::LatentUnet));
        assert_eq!(Protocol::of_table("s2d_128_heads"), Some(Protocol::S2dUnet));
        assert_eq!(Protocol::of_table("hdit_256"), Some(Protocol::Transformer));
        assert_eq!(Protocol::of_table("site"), None);
    }
}
