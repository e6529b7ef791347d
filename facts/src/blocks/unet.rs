//! MONAI's `DiffusionModelUNet` (3D) blocks written once as data: the
//! ResBlock (`ResnetBlock`) and the spatial attention block, each a list of
//! layers (parameters), a list of the tensors it keeps for backward (elements
//! a voxel) and the column buffers its convolutions unfold while they run.
//!
//! Derived from it: [`crate::params::unet_res_block`] and
//! [`crate::params::unet_attention`] (parameters), the precheck's saved
//! bytes a block and its column-buffer transient
//! (`orchestrator/src/precheck/unet.rs`). Checked against it: the worker's
//! ResBlock, measured by its exact allocator (`worker/tests/block_facts.rs`).
//!
//! A ResBlock(cin → cout) under bf16 autocast (norm1, SiLU, conv1, + time
//! projection, norm2, SiLU, conv2, + skip): GroupNorm is on autocast's fp32
//! list, so it upcasts its half input and keeps the f32 copy (4·cin bytes a
//! voxel); SiLU keeps its input, the norm's f32 output (4·cin); conv1 keeps
//! SiLU's output cast to bf16 (2·cin); the same at cout after conv1 and the
//! time projection's add; the 1x1x1 skip convolution (cin != cout) keeps the
//! block's input as it comes, bf16 in the UNet (conv_in's output, a block's
//! sum, the up path's concatenation). 10·cin + 10·cout bytes of tensors the
//! block makes, and its input where it has a skip convolution. In fp32 the
//! same tensors in f32, except that norm1 keeps the block's input itself.
//! The norms' statistics (mean and rstd, 2 x groups f32 a sample) do not grow
//! with the volume and are not listed.
//!
//! The attention block (GroupNorm, q/k/v projections, scores, softmax, the
//! value product, output projection, residual), as PyTorch keeps it for
//! MONAI's `use_flash_attention=False` path and as the worker's `AttnBlock`
//! does: under bf16 autocast the norm's f32 copy of its input (GroupNorm is
//! on autocast's fp32 list), the three bf16 casts of the norm output that the
//! q, k and v projections take (autocast casts per call; the f32 norm output
//! itself is not kept), q, k and v, and the projection's input (the
//! re-layout of the value product's output): 1 wide + 7 half elements of C
//! a voxel, 18·C bytes; of the materialised heads x N x N scores, the f32
//! softmax output and its half copy for the value product, 6 bytes a score
//! (the half scores of the first product live only until the softmax). In
//! fp32 nothing is cast: the block's input (the norm's), the norm output (the
//! projections'), q, k, v and the projection's input, 6 f32 elements of C,
//! 24·C bytes, and the softmax output, 4 bytes a score. The precheck counted
//! 24·C and 8 B a score under bf16 autocast and 40·C and 12 B in fp32 before
//! (issue 52).
//!
//! While a 3x3x3 convolution runs, PyTorch's native kernel (the group's runs
//! convolved without cuDNN: data/gpu-check/2026-11-27-h100/RUN.md) unfolds
//! its input into a column buffer of [`COLUMNS`]·cin elements an output
//! voxel, in the input's dtype, forward and again in each backward product
//! (`worker/src/models/columns.rs`); a 1x1x1 convolution needs none.

use super::Storage;

/// Voxels of a 3x3x3 kernel: its weight's elements per input and output
/// channel, and the column buffer's elements per input channel and output voxel.
pub const KERNEL: u32 = 27;

/// Elements a 3x3x3 convolution's column buffer holds per input channel and output voxel.
pub const COLUMNS: u32 = KERNEL;

/// A fact a UNet block has or has not: every layer and saved tensor belongs to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fact {
    /// Every block of its kind has it.
    Always,
    /// A ResBlock whose widths differ has a 1x1x1 convolution on its skip path.
    SkipConv,
}

/// What a saved tensor is, as seen from the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Of {
    /// A tensor the block makes.
    Block,
    /// The block's input itself, made by whoever hands it over.
    Input,
    /// GroupNorm's input where it is the block's input: under autocast the
    /// f32 copy the norm takes of the half input, in fp32 the input itself.
    InputUpcast,
}

/// Elements a voxel: `cin`·input channels + `cout`·output channels +
/// `scores`·heads·N (N the block's voxels: heads x N x N a block). An
/// attention block's input and output widths are both its width C.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PerVoxel {
    pub cin: u32,
    pub cout: u32,
    pub scores: u32,
}

impl PerVoxel {
    /// Elements a voxel at widths `cin`, `cout` and `heads_n` = heads·N.
    pub fn at(&self, cin: f64, cout: f64, heads_n: f64) -> f64 {
        self.cin as f64 * cin + self.cout as f64 * cout + self.scores as f64 * heads_n
    }
}

/// Under which precisions a saved tensor exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Always,
    /// Only under autocast (a cast; without autocast the layer keeps a tensor counted already).
    Autocast,
    /// Only without autocast (under autocast the layers keep their casts instead).
    NoAutocast,
}

impl When {
    pub fn applies(self, autocast: bool) -> bool {
        match self {
            When::Always => true,
            When::Autocast => autocast,
            When::NoAutocast => !autocast,
        }
    }
}

/// One tensor (or a group of like tensors) a block keeps for backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saved {
    pub name: &'static str,
    pub elems: PerVoxel,
    pub storage: Storage,
    pub fact: Fact,
    pub of: Of,
    pub when: When,
}

const fn saved(name: &'static str, (cin, cout, scores): (u32, u32, u32), storage: Storage, of: Of) -> Saved {
    Saved { name, elems: PerVoxel { cin, cout, scores }, storage, fact: Fact::Always, of, when: When::Always }
}

/// Whether `dt` = (wide, half) bytes an element is autocast's: a wide type
/// wider than the matmuls' (f32 beside bf16 or f16); fp32 and pure half
/// precision store both alike.
pub fn autocast(dt: (f64, f64)) -> bool {
    dt.0 > dt.1
}

/// A tensor a layer holds only while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transient {
    pub name: &'static str,
    pub elems: PerVoxel,
    pub storage: Storage,
    pub fact: Fact,
}

/// Parameters of one layer: `io`·cin·cout + `oo`·cout² + `to`·temb·cout +
/// `i`·cin + `o`·cout (temb the time embedding's width, 4·channels[0]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layer {
    pub name: &'static str,
    pub io: u64,
    pub oo: u64,
    pub to: u64,
    pub i: u64,
    pub o: u64,
    pub fact: Fact,
}

const fn layer(name: &'static str, (io, oo, to, i, o): (u64, u64, u64, u64, u64)) -> Layer {
    Layer { name, io, oo, to, i, o, fact: Fact::Always }
}

const K: u64 = KERNEL as u64;

/// One UNet block as data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnetBlock {
    pub layers: &'static [Layer],
    pub saved: &'static [Saved],
    pub transient: &'static [Transient],
}

/// MONAI's `ResnetBlock`: norm1, SiLU, conv1, + time projection, norm2, SiLU, conv2, + skip.
pub const RES_BLOCK: UnetBlock = UnetBlock {
    layers: &[
        layer("norm1", (0, 0, 0, 2, 0)),
        layer("conv1", (K, 0, 0, 0, 1)),
        // Linear(temb, cout) of the SiLU'd time embedding, added to conv1's output.
        layer("time projection", (0, 0, 1, 0, 1)),
        layer("norm2", (0, 0, 0, 0, 2)),
        layer("conv2", (0, K, 0, 0, 1)),
        Layer { fact: Fact::SkipConv, ..layer("skip conv", (1, 0, 0, 0, 1)) },
    ],
    saved: &[
        saved("norm1 input", (1, 0, 0), Storage::Wide, Of::InputUpcast),
        // SiLU keeps its input.
        saved("norm1 output", (1, 0, 0), Storage::Wide, Of::Block),
        // SiLU's output in the convolution's type.
        saved("conv1 input", (1, 0, 0), Storage::Half, Of::Block),
        // conv1's output plus the time projection, upcast for the norm under autocast.
        saved("norm2 input", (0, 1, 0), Storage::Wide, Of::Block),
        saved("norm2 output", (0, 1, 0), Storage::Wide, Of::Block),
        saved("conv2 input", (0, 1, 0), Storage::Half, Of::Block),
        Saved { fact: Fact::SkipConv, ..saved("skip conv input", (1, 0, 0), Storage::Half, Of::Input) },
    ],
    transient: &[
        Transient {
            name: "conv1 column buffer",
            elems: PerVoxel { cin: COLUMNS, cout: 0, scores: 0 },
            storage: Storage::Half,
            fact: Fact::Always,
        },
        Transient {
            name: "conv2 column buffer",
            elems: PerVoxel { cin: 0, cout: COLUMNS, scores: 0 },
            storage: Storage::Half,
            fact: Fact::Always,
        },
    ],
};

/// MONAI's spatial attention block of width C (cin = cout = C), as PyTorch keeps it.
pub const ATTENTION: UnetBlock = UnetBlock {
    layers: &[
        layer("attention norm", (0, 0, 0, 0, 2)),
        layer("q, k, v projections", (0, 3, 0, 0, 3)),
        layer("output projection", (0, 1, 0, 0, 1)),
    ],
    saved: &[
        saved("attention norm input", (0, 1, 0), Storage::Wide, Of::InputUpcast),
        // Without autocast the q, k and v projections keep the norm output itself.
        Saved { when: When::NoAutocast, ..saved("attention norm output", (0, 1, 0), Storage::Wide, Of::Block) },
        Saved { when: When::Autocast, ..saved("q, k, v input casts", (0, 3, 0), Storage::Half, Of::Block) },
        saved("q, k, v", (0, 3, 0), Storage::Half, Of::Block),
        // The value product's output laid out for the projection.
        saved("output projection input", (0, 1, 0), Storage::Half, Of::Block),
        // The softmax (on autocast's fp32 list) and its half copy for the value product.
        saved("softmax output", (0, 0, 1), Storage::Wide, Of::Block),
        Saved { when: When::Autocast, ..saved("probabilities cast", (0, 0, 1), Storage::Half, Of::Block) },
    ],
    transient: &[],
};

impl UnetBlock {
    /// Whether a block of widths `cin` → `cout` has `fact`.
    pub fn has(fact: Fact, cin: u64, cout: u64) -> bool {
        match fact {
            Fact::Always => true,
            Fact::SkipConv => cin != cout,
        }
    }

    /// Parameters of the block at widths `cin` → `cout` with a `temb`-wide time embedding.
    pub fn params(&self, cin: u64, cout: u64, temb: u64) -> u64 {
        let layers = self.layers.iter().filter(|l| Self::has(l.fact, cin, cout));
        layers.map(|l| l.io * cin * cout + l.oo * cout * cout + l.to * temb * cout + l.i * cin + l.o * cout).sum()
    }

    /// What the block keeps for backward at widths `cin` → `cout`.
    pub fn saved(&self, cin: u64, cout: u64) -> impl Iterator<Item = &'static Saved> {
        self.saved.iter().filter(move |s| Self::has(s.fact, cin, cout))
    }

    /// Bytes a voxel of the channel entries (`scores` 0) that `count`
    /// selects, with `dt` = (wide, half) bytes an element.
    /// Entries that do not exist at `dt` ([`When`]) are not counted.
    pub fn channel_bytes(&self, (cin, cout): (u64, u64), dt: (f64, f64), count: impl Fn(&Saved) -> bool) -> f64 {
        let channels =
            self.saved(cin, cout).filter(|s| s.elems.scores == 0 && s.when.applies(autocast(dt)) && count(s));
        channels.map(|s| s.storage.bytes(dt) * s.elems.at(cin as f64, cout as f64, 0.0)).sum()
    }

    /// Bytes of the score entries per element of heads x N x N.
    pub fn score_bytes(&self, dt: (f64, f64)) -> f64 {
        let kept = self.saved.iter().filter(|s| s.when.applies(autocast(dt)));
        kept.map(|s| s.storage.bytes(dt) * s.elems.scores as f64).sum()
    }

    /// Elements a voxel of the largest buffer one of the block's layers holds
    /// while it runs, at widths `cin` → `cout`, and its storage.
    pub fn largest_transient(&self, cin: u64, cout: u64) -> Option<(f64, Storage)> {
        let mut transients = self.transient.iter().filter(|t| Self::has(t.fact, cin, cout));
        let first = transients.next()?;
        let elems = |t: &Transient| t.elems.at(cin as f64, cout as f64, 0.0);
        let largest = transients.fold(first, |a, t| if elems(t) > elems(a) { t } else { a });
        Some((elems(largest), largest.storage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AUTOCAST: (f64, f64) = (4.0, 2.0);

    #[test]
    fn a_res_block_makes_10_cin_10_cout_bytes_a_voxel_under_autocast_and_keeps_its_input_for_the_skip_conv() {
        let made = |cin, cout| RES_BLOCK.channel_bytes((cin, cout), AUTOCAST, |s| s.of != Of::Input);
        assert_eq!(made(64, 64), 10.0 * 64.0 + 10.0 * 64.0);
        assert_eq!(made(96, 32), 10.0 * 96.0 + 10.0 * 32.0);
        let input = |cin, cout| RES_BLOCK.channel_bytes((cin, cout), AUTOCAST, |s| s.of == Of::Input);
        assert_eq!((input(96, 32), input(64, 64)), (2.0 * 96.0, 0.0), "only the skip conv keeps the input");
        // In fp32 every entry is f32: 12·cin + 12·cout, the input norm1's.
        assert_eq!(RES_BLOCK.channel_bytes((64, 64), (4.0, 4.0), |s| s.of != Of::Input), 12.0 * 128.0);
    }

    /// What PyTorch (MONAI's attention without flash) and the worker keep:
    /// 18·C and 6 B a score under bf16 autocast, 24·C and 4 B in fp32 (issue 52).
    #[test]
    fn the_attention_block_keeps_18c_and_6_bytes_a_score_under_autocast_24c_and_4_in_fp32() {
        assert_eq!(ATTENTION.channel_bytes((256, 256), AUTOCAST, |_| true), 18.0 * 256.0);
        assert_eq!(ATTENTION.score_bytes(AUTOCAST), 6.0);
        assert_eq!(ATTENTION.channel_bytes((256, 256), (4.0, 4.0), |_| true), 24.0 * 256.0);
        assert_eq!(ATTENTION.score_bytes((4.0, 4.0)), 4.0);
        // Pure bf16: the fp32 list in the half type, nothing cast.
        assert_eq!(ATTENTION.channel_bytes((256, 256), (2.0, 2.0), |_| true), 12.0 * 256.0);
        assert_eq!(ATTENTION.score_bytes((2.0, 2.0)), 2.0);
    }

    #[test]
    fn the_largest_column_buffer_is_the_wider_convolutions() {
        assert_eq!(RES_BLOCK.largest_transient(32, 64), Some((27.0 * 64.0, Storage::Half)));
        assert_eq!(RES_BLOCK.largest_transient(96, 32), Some((27.0 * 96.0, Storage::Half)));
        assert_eq!(ATTENTION.largest_transient(64, 64), None);
    }

    #[test]
    fn parameters_follow_the_layers() {
        let (cin, cout, temb) = (96u64, 32u64, 128u64);
        let conv3 = |i: u64, o: u64| 27 * i * o + o;
        let res = 2 * cin + conv3(cin, cout) + temb * cout + cout + 2 * cout + conv3(cout, cout) + cin * cout + cout;
        assert_eq!(RES_BLOCK.params(cin, cout, temb), res);
        // Without the skip conv when the widths agree.
        let same = 2 * cout + conv3(cout, cout) + temb * cout + cout + 2 * cout + conv3(cout, cout);
        assert_eq!(RES_BLOCK.params(cout, cout, temb), same);
        assert_eq!(ATTENTION.params(64, 64, temb), 2 * 64 + 4 * (64 * 64 + 64));
    }

    #[test]
    fn every_fact_has_an_entry_and_names_are_unique() {
        let blocks = [RES_BLOCK, ATTENTION];
        let skip = blocks.iter().flat_map(|b| b.saved).filter(|s| s.fact == Fact::SkipConv).count()
            + blocks.iter().flat_map(|b| b.layers).filter(|l| l.fact == Fact::SkipConv).count();
        assert!(skip > 0, "SkipConv has no entry");
        let mut names: Vec<&str> = blocks
            .iter()
            .flat_map(|b| {
                let saved = b.saved.iter().map(|s| s.name);
                saved.chain(b.layers.iter().map(|l| l.name)).chain(b.transient.iter().map(|t| t.name))
            })
            .collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a name twice");
    }
}
