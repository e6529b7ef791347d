//! What `bf16-amp` saves on activations, against the precheck's dtype model.
//!
//! The precheck (`orchestrator/src/precheck/{unet,dit}.rs`) counts each saved
//! tensor as a matmul/conv operand (`mm`: 2 bytes under bf16 autocast, 4 in
//! fp32) or a wide tensor (norm inputs and outputs, the residual stream,
//! attention statistics: 4 bytes in both). Its predicted activation ratio
//! bf16-amp / fp32 is the walk's bytes with (mm, wide) = (2, 4) over those
//! with (4, 4). Measured here by the exact allocator, in process: the bytes a
//! forward leaves held for backward, at two input sizes, so the difference is
//! activations only (the weights and autocast's half weight copies do not
//! grow with the input). The fp32 side saves as PyTorch's fp32 does too
//! (`Autocast::torch_f32`: PyTorch's norms and SiLU, no half type), so only
//! the dtypes differ. Its own test binary: nothing else allocates meanwhile.

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::FloatDType;
use facts::{DitSpec, Input, ModelSpec, PerLevel, Spatial, UnetSpec};
use worker::alloc;
use worker::models::amp::Autocast;
use worker::models::attention::AttentionKernel;
use worker::models::checkpoint::Tape;
use worker::models::Model;

struct Touch;
impl ModuleVisitor for Touch {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let _ = param.val();
    }
}

/// Bytes a forward of `spec` on a `side`³ input leaves held, under `half`
/// autocast (`None`: fp32 saving as PyTorch's).
fn held(spec: &ModelSpec, side: u32, half: Option<FloatDType>) -> u64 {
    let device = Device::flex().autodiff();
    let input = Input { channels: 1, spatial: Spatial::new(side, side, side) };
    let model = Model::build(spec, &input, 1, AttentionKernel::MemoryEfficient, &device).unwrap();
    model.visit(&mut Touch);
    let s = side as usize;
    let x = Tensor::<5>::random([1, 1, s, s, s], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
    device.sync().unwrap();
    let before = alloc::current();
    let out = {
        let _ctx = match half {
            Some(h) => Autocast::enter(Some(h)),
            None => Autocast::torch_f32(),
        };
        let mut tape = Tape::new(false);
        model.forward(x.clone(), &[10.0], &mut tape)
    };
    device.sync().unwrap();
    let held = alloc::current().saturating_sub(before);
    drop(out);
    held
}

/// Activation bytes bf16-amp / fp32, from the growth between two input sides.
fn measured_ratio(spec: &ModelSpec, small: u32, large: u32) -> f64 {
    // Warm the kernels' scratch buffers and thread pool at the large size first.
    held(spec, large, Some(FloatDType::BF16));
    held(spec, large, None);
    let amp = held(spec, large, Some(FloatDType::BF16)) as f64 - held(spec, small, Some(FloatDType::BF16)) as f64;
    let f32 = held(spec, large, None) as f64 - held(spec, small, None) as f64;
    eprintln!("activations grew by {amp} B under bf16-amp, {f32} B in fp32");
    amp / f32
}

/// The precheck's DiT block (the group's, with qk-norm), per token and hidden
/// channel (`precheck::dit::block_bytes_per_token`): under autocast 6 wide +
/// 19 mm (the norms' f32 copies of q and k among the wide), in fp32 4 wide +
/// 19 mm (the norms keep views of qkv); the blocks dominate at depth 8.
fn dit_model_ratio() -> f64 {
    (6.0 * 4.0 + 19.0 * 2.0) / (4.0 * 4.0 + 19.0 * 4.0)
}

/// The precheck's UNet walk (`precheck::unet`) in wide and mm elements per
/// voxel of level 0, for channels `ch` with one ResBlock a level and no
/// attention but the middle block's (whose scores, quadratic in the voxels,
/// the test counts beside it): GroupNorm input and output wide and the
/// conv's cast mm per norm/SiLU/conv (`nac`), skips mm, the up path's
/// concatenated input mm. Returns bytes per voxel of level 0: under
/// bf16-amp, in fp32 as the precheck's walk counts, and in fp32 tensor for
/// tensor: in fp32 a
/// ResBlock's first GroupNorm saves the block's input itself, which is also a
/// skip (down path, first middle block) or the concatenation the 1x1 conv
/// keeps (up path), so PyTorch's fp32 run holds it once where the walk counts
/// it twice; under autocast it is a new f32 copy, as the walk counts.
fn unet_walk(ch: &[f64]) -> (f64, f64, f64) {
    let vox = |l: usize| 1.0 / 8f64.powi(l as i32);
    let (mut wide, mut mm) = (0.0, 1.0 + ch[0]); // stem: input cast, conv_in output (skip)
    let nac = |c: f64, v: f64, wide: &mut f64, mm: &mut f64| {
        *wide += 2.0 * c * v;
        *mm += c * v;
    };
    // fp32 norm inputs that are a tensor counted elsewhere too.
    let mut aliased = 0.0;
    let mut skips = vec![ch[0]];
    for (l, &c) in ch.iter().enumerate() {
        let cin = if l == 0 { ch[0] } else { ch[l - 1] };
        nac(cin, vox(l), &mut wide, &mut mm);
        aliased += cin * vox(l);
        nac(c, vox(l), &mut wide, &mut mm);
        mm += c * vox(l); // its output, a skip
        skips.push(c);
        if l + 1 < ch.len() {
            mm += c * vox(l + 1); // the downsample's output, a skip
            skips.push(c);
        }
    }
    let (last, lv) = (ch[ch.len() - 1], vox(ch.len() - 1));
    for _ in 0..4 {
        nac(last, lv, &mut wide, &mut mm); // two middle ResBlocks
    }
    aliased += last * lv; // the first one's input is the last skip
    wide += 2.0 * last * lv; // middle attention: norm input and output
    mm += 8.0 * last * lv; // three casts, q, k, v, the output and its relayout
    let mut h = last;
    for l in (0..ch.len()).rev() {
        for _ in 0..2 {
            let cin = h + skips.pop().unwrap();
            nac(cin, vox(l), &mut wide, &mut mm);
            nac(ch[l], vox(l), &mut wide, &mut mm);
            mm += cin * vox(l); // the concatenation, kept by the 1x1 skip conv
            aliased += cin * vox(l);
            h = ch[l];
        }
        if l > 0 {
            mm += ch[l] * vox(l - 1); // the upsample, kept by its conv
        }
    }
    nac(ch[0], 1.0, &mut wide, &mut mm); // head: norm, SiLU, conv
    mm += 1.0; // the output
    (4.0 * wide + 2.0 * mm, 4.0 * wide + 4.0 * mm, 4.0 * wide + 4.0 * mm - 4.0 * aliased)
}

/// The UNet's activation ratio tensor for tensor between input sides `small`
/// and `large`: the walk's bytes per voxel, and the middle attention's
/// scores (one head, `N²` at level 2, a quarter of the side): 6 bytes a
/// score kept under bf16 autocast (the f32 softmax output and its half copy
/// for the second matmul), 4 in fp32 (the softmax output, which the second
/// matmul keeps too).
fn unet_tensor_ratio(ch: &[f64], small: u32, large: u32) -> f64 {
    let (amp, _, f32) = unet_walk(ch);
    let cube = |side: u32| f64::from(side).powi(3);
    let voxels = cube(large) - cube(small);
    let scores = cube(large / 4).powi(2) - cube(small / 4).powi(2);
    (amp * voxels + 6.0 * scores) / (f32 * voxels + 4.0 * scores)
}

#[test]
fn bf16_amp_activations_fall_as_the_precheck_dtype_model_says() {
    let dit = ModelSpec::Dit(DitSpec { variant: None, hidden: Some(128), heads: Some(4), depth: Some(8), patch: 2 });
    let ch = [16u32, 16, 32];
    let unet = ModelSpec::Unet(UnetSpec {
        channels: ch.to_vec(),
        attention_levels: vec![false; 3],
        num_res_blocks: PerLevel::All(1),
        num_head_channels: PerLevel::All(32),
        norm_num_groups: 8,
    });
    let chf: Vec<f64> = ch.iter().map(|&c| c as f64).collect();
    let (amp, f32_walk, _) = unet_walk(&chf);
    let (unet_precheck, unet_tensors) = (amp / f32_walk, unet_tensor_ratio(&chf, 16, 32));
    // The DiT's walk has no aliased tensor: its ratio is the precheck's. The
    // UNet's is the precheck's classes counted tensor for tensor, with the
    // middle attention's scores (see `unet_walk`; the precheck's own figure
    // is printed beside it).
    for (family, spec, small, large, model, precheck) in [
        ("dit", &dit, 8, 16, dit_model_ratio(), dit_model_ratio()),
        ("unet", &unet, 16, 32, unet_tensors, unet_precheck),
    ] {
        let measured = measured_ratio(spec, small, large);
        eprintln!(
            "{family}: activations bf16-amp / fp32 measured {measured:.3}, dtype model {model:.3} \
             (the precheck's walk as it counts: {precheck:.3})"
        );
        assert!(
            (measured - model).abs() <= 0.03,
            "{family}: bf16-amp keeps {:.1}% of fp32's activations, the precheck's dtype model {:.1}%",
            100.0 * measured,
            100.0 * model
        );
    }
}
