//! The transformer block, written once as data: the group's DiT block (DiT,
//! HDiT: adaLN-Zero, qk-norm) and U-ViT's pre-LN block are one list of layers
//! and one list of the tensors a block keeps for backward, each entry tagged
//! with the fact it belongs to ([`Fact`]), so that a fact is one entry.
//!
//! Derived from it: [`crate::params::dit_block`] and [`crate::params::uvit_block`]
//! (parameters), the precheck's saved bytes a token
//! (`orchestrator/src/precheck/dit.rs`). Checked against it: the worker's Burn
//! blocks, measured by its exact allocator (`worker/tests/block_facts.rs`).
//! The other place a fact lives is the PyTorch reference of the GPU check,
//! `scripts/gpu_check/models.py` (docs/architecture.md, "How a model fact goes in").
//!
//! What one block keeps for backward per token, under bf16 autocast (h hidden,
//! a heads; the appendix of the group-code notes, from
//! `src/medgen/models/dit_blocks.py@3140d97` in `ModeS7/AIS4900_master`):
//!
//! - the group's DiT block (DiT, HDiT: adaLN-Zero, qk-norm): the fp32 norm
//!   inputs and outputs (4 wide), the fp32 copies of q and k its qk-norm keeps
//!   (2 wide), the bf16 cast for qkv, qkv (3), the normed q and k cast for
//!   SDPA (2), its output and the output's re-layout copy before `proj` (the
//!   output is laid out like the contiguous normed q), the projection output
//!   (kept by the gate), the MLP's cast, fc1 and GELU outputs (4 each) and fc2
//!   output (gate): 6 wide + 19 half elements of h, 62h bytes; the two
//!   LayerNorms' and the qk-norms' row statistics (16 + 16a bytes) and SDPA's
//!   log-sum-exp (4a);
//! - without qk-norm (rows 5, 6 and 8 gone) 4 wide + 16 half: 48h + 4a + 16;
//! - a pre-LN block (U-ViT: no modulation, no gates, no qk-norm) keeps the fp32
//!   norm inputs (2 wide), the casts, qkv (3), the output, fc1 and GELU (4
//!   each): 2 wide + 14 half, 36h + 4a + 16.
//!
//! In fp32 the same tensors are kept in f32, except the copies of q and k the
//! qk-norms take under autocast (in fp32 they keep views of qkv).
//! Memory-efficient attention (PyTorch SDPA) keeps only the per-head
//! log-sum-exp (the entry marked `kernel`); runtimes that materialise scores
//! add heads x N x N per block, which the precheck counts on its own.
//!
//! The UNet's ResBlock and attention block are described the same way, a
//! voxel instead of a token, in [`unet`].

pub mod unet;

/// A fact a block has or has not: every layer and saved tensor belongs to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fact {
    /// Every transformer block has it.
    Always,
    /// adaLN-Zero conditioning: a Linear(h, 6h) of the timestep embedding
    /// makes each norm's shift and scale and each branch's gate.
    AdaLn,
    /// The LayerNorms carry an affine weight and bias (U-ViT's; DiT's are
    /// `elementwise_affine=False`, modulated instead).
    AffineNorms,
    /// The qkv projection has a bias (DiT's; U-ViT's has none, as upstream's).
    QkvBias,
    /// The group's qk-norm: `LayerNorm(head_dim, eps=1e-6)` on q and on k.
    QkNorm,
    /// The attention output's re-layout before `proj`: SDPA lays its output
    /// out like q, so when q is contiguous (the normed q) the `[B, N, h]` the
    /// projection reads is a copy; when q is a view of the packed qkv it is a view.
    OutputCopy,
}

/// Which of the facts a block has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub adaln: bool,
    pub affine_norms: bool,
    pub qkv_bias: bool,
    pub qk_norm: bool,
}

/// The group's DiT block (DiT and HDiT): adaLN-Zero, plain norms, qkv bias, qk-norm.
pub const GROUP_DIT: Block = Block { adaln: true, affine_norms: false, qkv_bias: true, qk_norm: true };

/// U-ViT's pre-LN block: affine norms, qkv without bias, no modulation, no qk-norm.
pub const UVIT: Block = Block { adaln: false, affine_norms: true, qkv_bias: false, qk_norm: false };

/// Where a saved tensor is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// The wide type: f32 under autocast and in fp32 (norm inputs and outputs,
    /// the residual stream), the half type in pure half precision.
    Wide,
    /// The type the matmuls take: the half type under autocast.
    Half,
    /// f32 row statistics (a norm's mean and rstd, attention's log-sum-exp), whatever the precision.
    Stats,
}

/// Elements a token: `h`·hidden + `a`·heads + `one`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PerToken {
    pub h: u32,
    pub a: u32,
    pub one: u32,
}

impl PerToken {
    /// `h`·hidden elements a token.
    pub const fn hidden(h: u32) -> PerToken {
        PerToken { h, a: 0, one: 0 }
    }

    pub fn at(&self, hidden: f64, heads: f64) -> f64 {
        self.h as f64 * hidden + self.a as f64 * heads + self.one as f64
    }
}

/// One tensor (or a group of like tensors) a block keeps for backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saved {
    pub name: &'static str,
    pub elems: PerToken,
    pub storage: Storage,
    pub fact: Fact,
    /// Kept only under autocast (in fp32 the same tensor is a view of one counted already).
    pub autocast_only: bool,
    /// Kept by the attention kernel (the memory-efficient one's log-sum-exp), not the block's layers.
    pub kernel: bool,
}

impl Storage {
    /// Bytes an element with `wide` and `half` bytes for those types (statistics are f32).
    pub fn bytes(&self, (wide, half): (f64, f64)) -> f64 {
        match self {
            Storage::Wide => wide,
            Storage::Half => half,
            Storage::Stats => 4.0,
        }
    }
}

impl Saved {
    /// Bytes a token with `wide` and `half` bytes an element.
    pub fn bytes(&self, dt: (f64, f64), hidden: f64, heads: f64) -> f64 {
        self.storage.bytes(dt) * self.elems.at(hidden, heads)
    }
}

const fn saved(name: &'static str, (h, a, one): (u32, u32, u32), storage: Storage, fact: Fact) -> Saved {
    Saved { name, elems: PerToken { h, a, one }, storage, fact, autocast_only: false, kernel: false }
}

/// What one block keeps for backward, per token, in forward order.
pub const SAVED: &[Saved] = &[
    // The block input and the residual after attention, upcast for the norms.
    saved("norm inputs", (2, 0, 0), Storage::Wide, Fact::Always),
    // The mean and rstd of the two LayerNorms' rows.
    saved("norm statistics", (0, 0, 4), Storage::Stats, Fact::Always),
    // The modulation's multiply keeps the norm outputs (a pre-LN block's
    // affine norm hands its output to the cast, which keeps nothing).
    saved("norm outputs", (2, 0, 0), Storage::Wide, Fact::AdaLn),
    saved("qkv input cast", (1, 0, 0), Storage::Half, Fact::Always),
    saved("qkv", (3, 0, 0), Storage::Half, Fact::Always),
    // The f32 copies of q and k the norms take under autocast (in fp32 they
    // keep views of qkv).
    Saved { autocast_only: true, ..saved("qk-norm f32 q and k", (2, 0, 0), Storage::Wide, Fact::QkNorm) },
    // Mean and rstd of each head's q and k rows.
    saved("qk-norm statistics", (0, 4, 0), Storage::Stats, Fact::QkNorm),
    // The normed q and k cast back for SDPA.
    saved("normed q and k casts", (2, 0, 0), Storage::Half, Fact::QkNorm),
    // SDPA's output, kept by the kernel's backward and by `proj`.
    saved("attention output", (1, 0, 0), Storage::Half, Fact::Always),
    Saved { kernel: true, ..saved("attention log-sum-exp", (0, 1, 0), Storage::Stats, Fact::Always) },
    saved("attention output re-layout", (1, 0, 0), Storage::Half, Fact::OutputCopy),
    // The gate's multiply keeps the attention branch's output.
    saved("proj output", (1, 0, 0), Storage::Half, Fact::AdaLn),
    saved("mlp input cast", (1, 0, 0), Storage::Half, Fact::Always),
    saved("fc1 output", (4, 0, 0), Storage::Half, Fact::Always),
    saved("gelu output", (4, 0, 0), Storage::Half, Fact::Always),
    // The gate's multiply keeps the MLP branch's output.
    saved("fc2 output", (1, 0, 0), Storage::Half, Fact::AdaLn),
];

/// Parameters of one layer: `hh`·h² + `h`·h + `head_dim`·(h / heads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layer {
    pub name: &'static str,
    pub hh: u64,
    pub h: u64,
    pub head_dim: u64,
    pub fact: Fact,
}

const fn layer(name: &'static str, (hh, h, head_dim): (u64, u64, u64), fact: Fact) -> Layer {
    Layer { name, hh, h, head_dim, fact }
}

/// One block's layers.
pub const LAYERS: &[Layer] = &[
    layer("norm1, norm2 affine", (0, 4, 0), Fact::AffineNorms),
    layer("qkv weight", (3, 0, 0), Fact::Always),
    layer("qkv bias", (0, 3, 0), Fact::QkvBias),
    // Affine `LayerNorm(head_dim)` on q and on k
    // (`src/medgen/models/dit_blocks.py@3140d97:135-137`).
    layer("q_norm, k_norm", (0, 0, 4), Fact::QkNorm),
    layer("proj", (1, 1, 0), Fact::Always),
    layer("fc1", (4, 4, 0), Fact::Always),
    layer("fc2", (4, 1, 0), Fact::Always),
    layer("adaLN modulation", (6, 6, 0), Fact::AdaLn),
];

/// Elements a token of one block, summed by storage class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Kept {
    pub wide: PerToken,
    pub half: PerToken,
    pub stats: PerToken,
}

impl Kept {
    /// Bytes a token with `wide` and `half` bytes an element (statistics are f32).
    pub fn bytes(&self, dt: (f64, f64), hidden: f64, heads: f64) -> f64 {
        let [wide, half, stats] = [Storage::Wide, Storage::Half, Storage::Stats].map(|s| s.bytes(dt));
        wide * self.wide.at(hidden, heads) + half * self.half.at(hidden, heads) + stats * self.stats.at(hidden, heads)
    }
}

impl Block {
    /// Whether the block has `fact`.
    pub fn has(&self, fact: Fact) -> bool {
        match fact {
            Fact::Always => true,
            Fact::AdaLn => self.adaln,
            Fact::AffineNorms => self.affine_norms,
            Fact::QkvBias => self.qkv_bias,
            // The normed q is contiguous: the attention output is laid out like it.
            Fact::QkNorm | Fact::OutputCopy => self.qk_norm,
        }
    }

    /// Parameters of one block of width `h` with `heads` heads.
    pub fn params(&self, h: u64, heads: u64) -> u64 {
        let head_dim = h / heads.max(1);
        LAYERS.iter().filter(|l| self.has(l.fact)).map(|l| l.hh * h * h + l.h * h + l.head_dim * head_dim).sum()
    }

    /// The tensors this block keeps for backward, under autocast or not.
    pub fn saved(&self, autocast: bool) -> impl Iterator<Item = &'static Saved> + '_ {
        SAVED.iter().filter(move |s| self.has(s.fact) && (autocast || !s.autocast_only))
    }

    /// What the block's layers keep (`kernel` false) or its attention kernel keeps (`kernel` true).
    pub fn kept(&self, autocast: bool, kernel: bool) -> Kept {
        let mut k = Kept::default();
        for s in self.saved(autocast).filter(|s| s.kernel == kernel) {
            let sum = match s.storage {
                Storage::Wide => &mut k.wide,
                Storage::Half => &mut k.half,
                Storage::Stats => &mut k.stats,
            };
            *sum = PerToken { h: sum.h + s.elems.h, a: sum.a + s.elems.a, one: sum.one + s.elems.one };
        }
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes a token under bf16 autocast, the kernel's log-sum-exp included.
    fn autocast_bytes(b: Block, h: f64, a: f64) -> f64 {
        (b.kept(true, false).bytes((4.0, 2.0), h, a)) + b.kept(true, true).bytes((4.0, 2.0), h, a)
    }

    #[test]
    fn the_groups_dit_block_keeps_62h_20a_16_bytes_a_token_under_autocast() {
        let (h, a) = (768.0, 12.0);
        assert_eq!(autocast_bytes(GROUP_DIT, h, a), 62.0 * h + 20.0 * a + 16.0);
        // 6 wide + 19 half elements of h; without qk-norm 4 wide + 16 half.
        let k = GROUP_DIT.kept(true, false);
        assert_eq!((k.wide.h, k.half.h), (6, 19));
        let plain = Block { qk_norm: false, ..GROUP_DIT };
        assert_eq!(autocast_bytes(plain, h, a), 48.0 * h + 4.0 * a + 16.0);
    }

    #[test]
    fn in_fp32_qk_norm_keeps_views_of_qkv_not_copies() {
        let k = GROUP_DIT.kept(false, false);
        assert_eq!((k.wide.h, k.half.h), (4, 19));
        assert_eq!(k.bytes((4.0, 4.0), 1.0, 0.0), 4.0 * 23.0 + 16.0);
    }

    #[test]
    fn a_pre_ln_block_keeps_36h_4a_16_bytes_a_token_under_autocast() {
        let (h, a) = (512.0, 8.0);
        assert_eq!(autocast_bytes(UVIT, h, a), 36.0 * h + 4.0 * a + 16.0);
    }

    #[test]
    fn parameters_follow_the_layers() {
        // 18h² + 15h + 4·head_dim; 12h² + 10h.
        assert_eq!(GROUP_DIT.params(384, 6), 18 * 384 * 384 + 15 * 384 + 4 * 64);
        assert_eq!(UVIT.params(512, 8), 12 * 512 * 512 + 10 * 512);
    }

    #[test]
    fn every_fact_has_an_entry_and_names_are_unique() {
        for fact in [Fact::AdaLn, Fact::AffineNorms, Fact::QkvBias, Fact::QkNorm, Fact::OutputCopy] {
            let n = SAVED.iter().filter(|s| s.fact == fact).count() + LAYERS.iter().filter(|l| l.fact == fact).count();
            assert!(n > 0, "{fact:?} has no entry");
        }
        let mut names: Vec<&str> = SAVED.iter().map(|s| s.name).chain(LAYERS.iter().map(|l| l.name)).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a name twice");
    }
}
