//! The GPU catalog: names as the cluster reports them, and usable capacity.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A GPU model. Capacity is what `torch.cuda` can allocate, in GiB (the reports' "GB").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Gpu {
    #[serde(rename = "A100-40GB")]
    A100_40,
    #[serde(rename = "A100-SXM4-80GB")]
    A100Sxm80,
    #[serde(rename = "A100-PCIe-80GB")]
    A100Pcie80,
    #[serde(rename = "H100-80GB-HBM3")]
    H100_80,
    #[serde(rename = "H200-141GB")]
    H200_141,
    #[serde(rename = "B200-180GB")]
    B200_180,
}

impl Gpu {
    pub const ALL: [Gpu; 6] = [
        Gpu::A100_40,
        Gpu::A100Sxm80,
        Gpu::A100Pcie80,
        Gpu::H100_80,
        Gpu::H200_141,
        Gpu::B200_180,
    ];

    /// Usable device memory in GiB: what the driver reports as the card's total
    /// (an "80 GB" A100 shows 79.2 GiB) less nothing else: the CUDA context is part
    /// of the predictor's fixed overhead, not of the capacity.
    pub fn capacity_gib(self) -> f64 {
        match self {
            Gpu::A100_40 => 39.4,
            Gpu::A100Sxm80 | Gpu::A100Pcie80 | Gpu::H100_80 => 79.2,
            Gpu::H200_141 => 139.8,
            Gpu::B200_180 => 178.4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Gpu::A100_40 => "A100-40GB",
            Gpu::A100Sxm80 => "A100-SXM4-80GB",
            Gpu::A100Pcie80 => "A100-PCIe-80GB",
            Gpu::H100_80 => "H100-80GB-HBM3",
            Gpu::H200_141 => "H200-141GB",
            Gpu::B200_180 => "B200-180GB",
        }
    }
}

impl fmt::Display for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown GPU `{0}` (known: A100-40GB, A100-SXM4-80GB, A100-PCIe-80GB, H100-80GB-HBM3, H200-141GB, B200-180GB)")]
pub struct UnknownGpu(pub String);

impl FromStr for Gpu {
    type Err = UnknownGpu;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Gpu::ALL
            .into_iter()
            .find(|g| g.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownGpu(s.to_string()))
    }
}
