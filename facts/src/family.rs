//! The model families and the named sizes of their papers (S, B, L, XL, …):
//! the vocabulary every other fact is keyed by.

use serde::{Deserialize, Serialize};
use std::fmt;

/// `[1, 2, 3]` as the reports print lists.
pub fn join<T: fmt::Display>(v: &[T]) -> String {
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", items.join(", "))
}

/// Named transformer sizes of the papers. Which names a family accepts is in
/// [`Variant::dims`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Variant {
    S,
    #[serde(rename = "S-Deep")]
    SDeep,
    M,
    B,
    L,
    XL,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::S => "S",
            Variant::SDeep => "S-Deep",
            Variant::M => "M",
            Variant::B => "B",
            Variant::L => "L",
            Variant::XL => "XL",
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Width, heads and depth of a transformer once its variant is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TransformerDims {
    pub hidden: u32,
    pub heads: u32,
    /// Number of blocks (for HDiT the sum of `level_depths`).
    pub depth: u32,
}

/// The family a variant table belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Unet,
    Dit,
    Hdit,
    Uvit,
    Mamba,
}

impl Family {
    /// Every family, in the order reports list them.
    pub const ALL: [Family; 5] = [Family::Unet, Family::Dit, Family::Hdit, Family::Uvit, Family::Mamba];

    pub fn name(self) -> &'static str {
        match self {
            Family::Unet => "unet",
            Family::Dit => "dit",
            Family::Hdit => "hdit",
            Family::Uvit => "uvit",
            Family::Mamba => "mamba",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Variant {
    /// (hidden, heads, depth) of this variant in `family`; `None` where the
    /// family has no such variant. HDiT's depth comes from `level_depths`.
    pub fn dims(self, family: Family) -> Option<(u32, u32, u32)> {
        use Variant::*;
        match (family, self) {
            (Family::Dit, S) | (Family::Hdit, S) => Some((384, 6, 12)),
            (Family::Dit, B) | (Family::Hdit, B) => Some((768, 12, 12)),
            (Family::Dit, L) | (Family::Hdit, L) => Some((1024, 16, 24)),
            (Family::Dit, XL) | (Family::Hdit, XL) => Some((1152, 16, 28)),
            (Family::Uvit, S) => Some((512, 8, 13)),
            (Family::Uvit, SDeep) => Some((512, 8, 17)),
            (Family::Uvit, M) => Some((768, 12, 17)),
            (Family::Uvit, L) => Some((1024, 16, 21)),
            _ => None,
        }
    }
}

/// The variant of `family` with exactly the sizes `d` (depth compared only
/// when `with_depth`: HDiT's comes from its level depths); `None` when no
/// variant has them.
pub(crate) fn resolve_variant(family: Family, d: TransformerDims, with_depth: bool) -> Option<Variant> {
    use Variant::*;
    [S, SDeep, M, B, L, XL].into_iter().find(|v| {
        v.dims(family).is_some_and(|(h, n, depth)| h == d.hidden && n == d.heads && (!with_depth || depth == d.depth))
    })
}
