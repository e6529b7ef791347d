//! Input shapes. Spatial sizes are always D, H, W (the reports write H x W x D).

use serde::{Deserialize, Serialize};
use std::fmt;

/// Spatial extent of a 3D volume, depth first as in PyTorch's `N C D H W`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spatial {
    pub d: u32,
    pub h: u32,
    pub w: u32,
}

impl Spatial {
    pub fn new(d: u32, h: u32, w: u32) -> Self {
        Self { d, h, w }
    }
    pub fn dims(&self) -> [u32; 3] {
        [self.d, self.h, self.w]
    }
    pub fn voxels(&self) -> u64 {
        self.d as u64 * self.h as u64 * self.w as u64
    }
    /// Every dimension divided by `f` (callers check divisibility first).
    pub fn div(&self, f: u32) -> Spatial {
        Spatial::new(self.d / f, self.h / f, self.w / f)
    }
    pub fn divisible_by(&self, f: u32) -> bool {
        f != 0 && self.dims().iter().all(|x| x % f == 0)
    }
    /// Multiply every dimension (the `--scale-input` of the advisor).
    pub fn scale(&self, f: u32) -> Spatial {
        Spatial::new(self.d * f, self.h * f, self.w * f)
    }
}

/// The reports' way to write a resolution: H x W x D.
impl fmt::Display for Spatial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}x{}", self.h, self.w, self.d)
    }
}

/// What the model sees: channels and spatial extent (batch lives on `RunConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    pub channels: u32,
    pub spatial: Spatial,
}
