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
    pub const ALL: [Gpu; 6] =
        [Gpu::A100_40, Gpu::A100Sxm80, Gpu::A100Pcie80, Gpu::H100_80, Gpu::H200_141, Gpu::B200_180];

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

    /// The CUDA compute capability's major version (8: Ampere, 9: Hopper,
    /// 10: Blackwell).
    pub fn compute_major(self) -> u32 {
        match self {
            Gpu::A100_40 | Gpu::A100Sxm80 | Gpu::A100Pcie80 => 8,
            Gpu::H100_80 | Gpu::H200_141 => 9,
            Gpu::B200_180 => 10,
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

impl Gpu {
    /// The catalog entry of a name as NVML reports it on a node (the worker
    /// records that name): `NVIDIA H100 80GB HBM3`, `NVIDIA A100-SXM4-80GB`,
    /// `NVIDIA A100 80GB PCIe`, `NVIDIA H200`, `NVIDIA B200`.
    pub fn from_nvml_name(name: &str) -> Option<Gpu> {
        let n = name.to_ascii_uppercase();
        let has = |w: &str| n.contains(w);
        if has("H200") {
            Some(Gpu::H200_141)
        } else if has("B200") {
            Some(Gpu::B200_180)
        } else if has("H100") {
            Some(Gpu::H100_80)
        } else if has("A100") && has("40GB") {
            Some(Gpu::A100_40)
        } else if has("A100") && has("PCIE") {
            Some(Gpu::A100Pcie80)
        } else if has("A100") {
            Some(Gpu::A100Sxm80)
        } else {
            None
        }
    }
}

impl FromStr for Gpu {
    type Err = UnknownGpu;
    /// A catalog name (`H100-80GB-HBM3`), or NVML's name of the same card.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Gpu::ALL
            .into_iter()
            .find(|g| g.name().eq_ignore_ascii_case(s))
            .or_else(|| s.starts_with("NVIDIA").then(|| Gpu::from_nvml_name(s)).flatten())
            .ok_or_else(|| UnknownGpu(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_names_map_to_the_catalog() {
        for (nvml, gpu) in [
            ("NVIDIA H100 80GB HBM3", Gpu::H100_80),
            ("NVIDIA A100-SXM4-80GB", Gpu::A100Sxm80),
            ("NVIDIA A100 80GB PCIe", Gpu::A100Pcie80),
            ("NVIDIA A100-SXM4-40GB", Gpu::A100_40),
            ("NVIDIA H200", Gpu::H200_141),
        ] {
            assert_eq!(nvml.parse::<Gpu>().unwrap(), gpu, "{nvml}");
        }
        assert!("cpu".parse::<Gpu>().is_err());
        assert!("NVIDIA GeForce RTX 4090".parse::<Gpu>().is_err());
    }
}
