//! PyTorch's native 3D convolution: a column buffer and a matrix product.
//!
//! The group's runs did not convolve through cuDNN: with cuDNN off, PyTorch
//! rebuilt from their code reproduces their UNet records, with it 48 of 64
//! read low (data/gpu-check/2026-11-27-h100/RUN.md). Without cuDNN, PyTorch's
//! CUDA convolution of a 5-D input is its native one
//! (`aten/src/ATen/native/cuda/ConvolutionMM3d.cu`), which for each batch
//! element unfolds the input into a column buffer `[C·kd·kh·kw, V]` (V the
//! output voxels, in the input's dtype: bf16 under autocast) and multiplies
//! the weight `[C_out, C·k]` into it. Its backward does the same twice, one
//! after the other: the input's gradient through a buffer of the same shape
//! (`Wᵀ · dy`, folded back onto the input), then the weight's through the
//! input unfolded again (`dy · colsᵀ`). A 1x1x1 kernel at stride 1 without
//! padding needs no buffer (the input is its own column matrix). Autograd
//! keeps the input and the weight, as for any convolution.
//!
//! On the CPU backend ([`Flex`]) this module does exactly that: the buffer is
//! a real allocation the worker's allocator counts, filled and multiplied in
//! f32 tiles (a few MiB) the way a cuBLAS bf16 GEMM accumulates in f32. On
//! the GPU backends the trait's default runs Burn's own convolution (CubeCL's
//! kernels, no column buffer).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::TensorMetadata;
use burn::backend::{backend_extension, Autodiff, Backend, Dispatch};
use burn::prelude::*;
use burn::tensor::ops::ConvOptions;

/// A 3D convolution as PyTorch's native kernel runs it, with PyTorch's saving.
#[backend_extension(
    Flex: cfg(feature = "flex"),
    Cube: cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda")),
    Autodiff
)]
pub trait NativeConv: Backend {
    /// `conv3d(x, weight) + bias` (groups and dilation 1).
    fn conv3d_native(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        steps: Steps,
    ) -> FloatTensor<Self> {
        Self::conv3d(x, weight, Some(bias), steps.options())
    }
    /// The gradient of [`NativeConv::conv3d_native`] with respect to its
    /// input (`weight_grad` false) or its weight (true), from `dy`.
    fn conv3d_native_grad(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        steps: Steps,
        weight_grad: bool,
    ) -> FloatTensor<Self> {
        if weight_grad {
            Self::conv3d_weight_backward(x, weight, dy, steps.options())
        } else {
            Self::conv3d_x_backward(x, weight, dy, steps.options())
        }
    }
}

/// How a kernel moves over the input: its stride and the input's zero
/// padding, per spatial axis (dilation and groups are 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steps {
    pub stride: [usize; 3],
    pub padding: [usize; 3],
}

impl Steps {
    fn options(self) -> ConvOptions<3> {
        ConvOptions::new(self.stride, self.padding, [1; 3], 1)
    }
}

#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
impl NativeConv for burn::backend::Cube {}

#[cfg(feature = "flex")]
impl NativeConv for burn::backend::Flex {
    fn conv3d_native(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        steps: Steps,
    ) -> FloatTensor<Self> {
        cpu::forward(x, weight, bias, steps)
    }
    fn conv3d_native_grad(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        steps: Steps,
        weight_grad: bool,
    ) -> FloatTensor<Self> {
        cpu::grad(x, weight, dy, steps, weight_grad)
    }
}

/// What the convolution's backward keeps: the input and the weight.
#[derive(Debug, Clone)]
struct ConvState<B: Backend> {
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    steps: Steps,
}

#[derive(Debug)]
struct ConvBackward;

impl<B: Backend + NativeConv> Backward<B, 3> for ConvBackward {
    type State = ConvState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let ConvState { x, weight, steps } = ops.state;
        let [px, pw, pb] = ops.parents;
        // PyTorch's order: the input's gradient, then the weight's, then the bias's.
        if let Some(node) = px {
            grads.register::<B>(node.id, B::conv3d_native_grad(x.clone(), weight.clone(), dy.clone(), steps, false));
        }
        if let Some(node) = pw {
            grads.register::<B>(node.id, B::conv3d_native_grad(x, weight, dy.clone(), steps, true));
        }
        if let Some(node) = pb {
            let db = B::float_sum_dim(B::float_reshape(dy.clone(), flat_channels(&dy.shape())), 2);
            let channels = dy.shape()[1];
            grads.register::<B>(node.id, B::float_reshape(B::float_sum_dim(db, 0), [channels].into()));
        }
    }
}

/// `[N, C, ...]` as `[N, C, rest]`.
fn flat_channels(s: &burn::tensor::Shape) -> burn::tensor::Shape {
    let rest: usize = s[2..].iter().product();
    [s[0], s[1], rest].into()
}

impl<B: Backend + NativeConv, C: CheckpointStrategy> NativeConv for Autodiff<B, C> {
    fn conv3d_native(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        steps: Steps,
    ) -> FloatTensor<Self> {
        let prep = ConvBackward.prepare::<C>([x.node(), weight.node(), bias.node()]).compute_bound().stateful();
        let (x, weight, bias) = (x.into_primitive(), weight.into_primitive(), bias.into_primitive());
        let y = B::conv3d_native(x.clone(), weight.clone(), bias, steps);
        match prep {
            OpsKind::Tracked(prep) => prep.finish(ConvState { x, weight, steps }, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }
}

/// `conv3d(x, weight) + bias` through PyTorch's native kernel (CPU: with
/// its column buffer; GPU: Burn's), keeping the input and weight for backward.
pub fn conv3d(x: Tensor<5>, weight: Tensor<5>, bias: Tensor<1>, stride: [usize; 3], padding: [usize; 3]) -> Tensor<5> {
    Tensor::from_dispatch(<Dispatch as NativeConv>::conv3d_native(
        x.into_dispatch(),
        weight.into_dispatch(),
        bias.into_dispatch(),
        Steps { stride, padding },
    ))
}

#[cfg(feature = "flex")]
mod cpu;

#[cfg(all(test, feature = "flex"))]
mod tests;
