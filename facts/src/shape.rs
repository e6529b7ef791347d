//! Input shapes. Spatial sizes are always D, H, W (the reports write H x W x D).

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// Spatial extent of a 3D volume, depth first as in PyTorch's `N C D H W`.
/// Written `[D, H, W]` (as the measurement records do) or `{d: .., h: .., w: ..}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// D x H x W; saturates instead of overflowing (absurd inputs are refused
    /// by [`crate::validate`], and must not crash on the way there).
    pub fn voxels(&self) -> u64 {
        (self.d as u64).saturating_mul(self.h as u64).saturating_mul(self.w as u64)
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

/// `8x64x64x40 (C,H,W,D)`: the one way plans, advice and reports write an
/// input (the spatial part as [`Spatial`] writes it, the group's order).
impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{} (C,H,W,D)", self.channels, self.spatial)
    }
}

/// What the model sees: channels and spatial extent (batch lives on `RunConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    pub channels: u32,
    pub spatial: Spatial,
}

impl Serialize for Spatial {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.dims().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Spatial {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Spatial;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("[D, H, W] or {d, h, w} with positive integers")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Spatial, A::Error> {
                let mut v = [0u32; 3];
                for (i, slot) in v.iter_mut().enumerate() {
                    *slot = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(i, &self))?;
                }
                if seq.next_element::<de::IgnoredAny>()?.is_some() {
                    return Err(de::Error::invalid_length(4, &self));
                }
                Ok(Spatial::new(v[0], v[1], v[2]))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Spatial, A::Error> {
                let (mut d, mut h, mut w) = (None, None, None);
                while let Some(k) = map.next_key::<String>()? {
                    let slot = match k.as_str() {
                        "d" => &mut d,
                        "h" => &mut h,
                        "w" => &mut w,
                        other => return Err(de::Error::unknown_field(other, &["d", "h", "w"])),
                    };
                    *slot = Some(map.next_value()?);
                }
                Ok(Spatial::new(
                    d.ok_or_else(|| de::Error::missing_field("d"))?,
                    h.ok_or_else(|| de::Error::missing_field("h"))?,
                    w.ok_or_else(|| de::Error::missing_field("w"))?,
                ))
            }
        }
        d.deserialize_any(V)
    }
}
