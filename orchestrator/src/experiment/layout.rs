//! `report_layout:`: which tables `report` writes for the experiment.
//!
//! The project's own layout puts the precheck's prediction beside every
//! measurement. An experiment that follows one of the group's profiling
//! scripts names it, and its report is that script's tables as the group's
//! report prints them (`docs/profiling_results.md` in `ModeS7/AIS4900_master`):
//! the figures the group would have read, with nothing added.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The tables of a report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReportLayout {
    /// The project's: every config with its prediction and error.
    #[default]
    Project,
    /// `misc/profiling/profile_latent_3d_unet.py@02d6741`: Config, Channels,
    /// Params, Model, Fwd, Bwd, Total, Status, one table per latent shape.
    LatentUnet,
    /// `misc/profiling/profile_s2d_3d_memory.py@7dc81f3`: Config, Params,
    /// VRAM, Status, one table per number of levels.
    S2dUnet,
    /// `misc/profile_dit_memory.py@3140d97`: Resolution, Patch, Tokens,
    /// Params, Peak VRAM, Status, one table per variant.
    Dit,
    /// `misc/profiling/profile_hdit_uvit_memory.py@ff513e0`: per variant,
    /// U-ViT's Patch, Tokens, ... and HDiT's Patch, level_depths, Tok L0, Tok BN, ...
    HditUvit,
}

impl ReportLayout {
    pub const ALL: [ReportLayout; 5] = [
        ReportLayout::Project,
        ReportLayout::LatentUnet,
        ReportLayout::S2dUnet,
        ReportLayout::Dit,
        ReportLayout::HditUvit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ReportLayout::Project => "project",
            ReportLayout::LatentUnet => "latent-unet",
            ReportLayout::S2dUnet => "s2d-unet",
            ReportLayout::Dit => "dit",
            ReportLayout::HditUvit => "hdit-uvit",
        }
    }

    pub fn is_project(&self) -> bool {
        *self == ReportLayout::Project
    }

    /// How the worker measures the sweep: as the script this layout's tables
    /// come from measured its runs (the DiT and the HDiT/U-ViT scripts alike).
    pub fn protocol(self) -> facts::protocol::Protocol {
        use facts::protocol::Protocol;
        match self {
            ReportLayout::Project => Protocol::Project,
            ReportLayout::LatentUnet => Protocol::LatentUnet,
            ReportLayout::S2dUnet => Protocol::S2dUnet,
            ReportLayout::Dit | ReportLayout::HditUvit => Protocol::Transformer,
        }
    }

    /// The group's script whose tables this layout prints (`None`: the project's).
    pub fn script(self) -> Option<&'static str> {
        match self {
            ReportLayout::Project => None,
            ReportLayout::LatentUnet => Some("misc/profiling/profile_latent_3d_unet.py@02d6741"),
            ReportLayout::S2dUnet => Some("misc/profiling/profile_s2d_3d_memory.py@7dc81f3"),
            ReportLayout::Dit => Some("misc/profile_dit_memory.py@3140d97"),
            ReportLayout::HditUvit => Some("misc/profiling/profile_hdit_uvit_memory.py@ff513e0"),
        }
    }
}

impl fmt::Display for ReportLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReportLayout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ReportLayout::ALL.into_iter().find(|l| l.name() == s).ok_or_else(|| {
            let names: Vec<&str> = ReportLayout::ALL.iter().map(|l| l.name()).collect();
            format!("unknown report layout `{s}` (one of: {})", names.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_and_match_the_files_spelling() {
        for l in ReportLayout::ALL {
            assert_eq!(l.name().parse::<ReportLayout>(), Ok(l));
            let yaml: ReportLayout = serde_yaml::from_str(l.name()).expect("the file's spelling");
            assert_eq!(yaml, l);
        }
        assert!("latent".parse::<ReportLayout>().unwrap_err().contains("one of: project, latent-unet"));
    }
}
