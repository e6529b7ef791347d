//! Mixed precision as PyTorch's autocast runs it (`bf16-amp`, `fp16-amp`).
//!
//! Like `torch.autocast`, a per-thread context: [`Autocast::enter`] sets the
//! half type, dropping the guard restores the previous state. Parameters,
//! gradients and AdamW state stay in the device's f32. Inside the context:
//!
//! - convolutions, linears and matmuls cast their input and weights to the half
//!   type and return a half output; the half copies are what their backward
//!   keeps (Burn's `cast` is differentiable: the f32 weight gets an f32 gradient);
//! - norms and softmax take f32 and return f32 (autocast's fp32 list), and so
//!   does the loss;
//! - an element-wise op between a half and an f32 tensor runs in f32
//!   (PyTorch's type promotion), through [`add`] and [`mul`].
//!
//! - norms, SiLU and softmax keep for backward what PyTorch's autograd keeps
//!   (the input and the row statistics; softmax its output: [`super::ops`]),
//!   not what Burn's composed ops would.
//!
//! Outside a context every helper is the plain operation. [`Autocast::torch_f32`]
//! enters a context without a half type that still saves as PyTorch does: the
//! fp32 baseline the autocast saving is measured against (`tests/autocast_memory.rs`).

use std::cell::Cell;

use burn::nn::conv::Conv3d;
use burn::nn::{GroupNorm, LayerNorm, Linear, PaddingConfig3d};
use burn::prelude::*;
use burn::tensor::module::linear;
use burn::tensor::{DType, FloatDType};

thread_local! {
    static HALF: Cell<Option<FloatDType>> = const { Cell::new(None) };
    static TORCH_SAVED: Cell<bool> = const { Cell::new(false) };
}

/// The half type of the current autocast context, if one is entered.
pub fn half() -> Option<FloatDType> {
    HALF.with(Cell::get)
}

/// An entered autocast context; leaving it restores the previous one.
#[must_use = "the context ends when the guard is dropped"]
pub struct Autocast {
    previous: Option<FloatDType>,
    previous_saved: bool,
}

impl Autocast {
    /// Enter autocast to `half` on this thread (`None`: no autocast, Burn's
    /// own ops as before).
    pub fn enter(half: Option<FloatDType>) -> Autocast {
        Self::with(half, half.is_some())
    }
    /// No half type, but norms, SiLU, softmax and MONAI's attention saving
    /// as PyTorch's (the fp32 run an autocast run's saving is measured
    /// against).
    pub fn torch_f32() -> Autocast {
        Self::with(None, true)
    }
    fn with(half: Option<FloatDType>, torch_saved: bool) -> Autocast {
        Autocast {
            previous: HALF.with(|h| h.replace(half)),
            previous_saved: TORCH_SAVED.with(|t| t.replace(torch_saved)),
        }
    }
}

impl Drop for Autocast {
    fn drop(&mut self) {
        HALF.with(|h| h.set(self.previous));
        TORCH_SAVED.with(|t| t.set(self.previous_saved));
    }
}

/// Whether norms, SiLU and softmax run as PyTorch's ([`super::ops`]).
pub fn torch_saved() -> bool {
    TORCH_SAVED.with(Cell::get)
}

/// SiLU: PyTorch's (keeps its input) inside a context, else Burn's.
pub fn silu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if torch_saved() {
        super::ops::silu(x)
    } else {
        burn::tensor::activation::silu(x)
    }
}

/// Softmax along `dim`: PyTorch's (keeps its output) inside a context, else Burn's.
pub fn softmax<const D: usize>(x: Tensor<D>, dim: usize) -> Tensor<D> {
    if torch_saved() {
        super::ops::softmax(x, dim)
    } else {
        burn::tensor::activation::softmax(x, dim)
    }
}

fn cast_to<const D: usize>(t: Tensor<D>, to: FloatDType) -> Tensor<D> {
    if t.dtype() == DType::from(to) {
        t
    } else {
        t.cast(to)
    }
}

/// `t` in the autocast half type (unchanged outside autocast).
pub fn to_half<const D: usize>(t: Tensor<D>) -> Tensor<D> {
    match half() {
        Some(h) => cast_to(t, h),
        None => t,
    }
}

/// `t` in `dtype` (a cast only when it differs).
pub fn to_dtype<const D: usize>(t: Tensor<D>, dtype: DType) -> Tensor<D> {
    cast_to(t, FloatDType::from(dtype))
}

/// `t` in f32 inside autocast (the fp32 list's inputs); unchanged outside.
pub fn to_f32<const D: usize>(t: Tensor<D>) -> Tensor<D> {
    match half() {
        Some(_) => cast_to(t, FloatDType::F32),
        None => t,
    }
}

/// Both operands in the wider of their two dtypes (PyTorch's promotion).
fn widen<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> (Tensor<D>, Tensor<D>) {
    let (da, db) = (a.dtype(), b.dtype());
    if da == db {
        (a, b)
    } else if da.size() >= db.size() {
        let to = FloatDType::from(da);
        (a, cast_to(b, to))
    } else {
        let to = FloatDType::from(db);
        (cast_to(a, to), b)
    }
}

/// `a + b` with type promotion.
pub fn add<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    let (a, b) = widen(a, b);
    a + b
}

/// `a * b` with type promotion.
pub fn mul<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    let (a, b) = widen(a, b);
    a * b
}

/// `Tensor::cat` with type promotion (autocast's promote list).
pub fn cat<const D: usize>(tensors: Vec<Tensor<D>>, dim: usize) -> Tensor<D> {
    let widest = tensors.iter().map(|t| t.dtype()).max_by_key(|d| d.size());
    let tensors = match widest {
        Some(w) => tensors.into_iter().map(|t| cast_to(t, FloatDType::from(w))).collect(),
        None => tensors,
    };
    Tensor::cat(tensors, dim)
}

/// A matmul in the half type.
pub fn matmul<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    to_half(a).matmul(to_half(b))
}

/// Layers that autocast casts around (linears, convolutions) or runs in f32 (norms).
pub trait AutocastForward<const D: usize> {
    fn amp(&self, x: Tensor<D>) -> Tensor<D>;
}

impl<const D: usize> AutocastForward<D> for Linear {
    fn amp(&self, x: Tensor<D>) -> Tensor<D> {
        if half().is_none() {
            return self.forward(x);
        }
        let bias = self.bias.as_ref().map(|b| to_half(b.val()));
        linear(to_half(x), to_half(self.weight.val()), bias)
    }
}

impl AutocastForward<5> for Conv3d {
    /// Inside a context, PyTorch's native 3D convolution ([`super::columns`]:
    /// the group's runs convolved without cuDNN), in the half type under autocast.
    fn amp(&self, x: Tensor<5>) -> Tensor<5> {
        if !torch_saved() {
            return self.forward(x);
        }
        // The models' convolutions are `Valid` or `Explicit` (Burn's own padding calculation is private).
        let padding = match self.padding {
            PaddingConfig3d::Explicit(d, h, w) => [d, h, w],
            PaddingConfig3d::Valid => [0; 3],
            PaddingConfig3d::Same => panic!("autocast conv3d: `Same` padding is not used by the models"),
        };
        assert!(self.dilation == [1; 3] && self.groups == 1, "the models' convolutions have no dilation or groups");
        let weight = to_half(self.weight.val());
        let bias = match &self.bias {
            Some(b) => to_half(b.val()),
            None => to_half(Tensor::zeros([weight.dims()[0]], &weight.device())),
        };
        super::columns::conv3d(to_half(x), weight, bias, self.stride, padding)
    }
}

impl<const D: usize> AutocastForward<D> for GroupNorm {
    fn amp(&self, x: Tensor<D>) -> Tensor<D> {
        let x = to_f32(x);
        match (&self.gamma, &self.beta) {
            (Some(g), Some(b)) if torch_saved() => {
                super::ops::group_norm(x, g.val(), b.val(), self.num_groups, self.epsilon)
            }
            _ => self.forward(x),
        }
    }
}

impl<const D: usize> AutocastForward<D> for LayerNorm {
    fn amp(&self, x: Tensor<D>) -> Tensor<D> {
        let x = to_f32(x);
        match &self.beta {
            // The models build every LayerNorm with Burn's default eps, 1e-5 (the field is private).
            Some(b) if torch_saved() => super::ops::layer_norm(x, self.gamma.val(), b.val(), 1e-5),
            _ => self.forward(x),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::LinearConfig;

    #[test]
    fn linear_runs_in_half_and_keeps_f32_weights() {
        let device = Device::flex().autodiff();
        let layer = LinearConfig::new(4, 3).init(&device);
        let x = Tensor::<2>::ones([2, 4], &device);
        let plain = layer.amp(x.clone());
        assert_eq!(plain.dtype(), DType::F32);
        let out = {
            let _ctx = Autocast::enter(Some(FloatDType::BF16));
            layer.amp(x)
        };
        assert_eq!(out.dtype(), DType::BF16);
        assert_eq!(layer.weight.val().dtype(), DType::F32);
        let grads = out.cast(FloatDType::F32).sum().backward();
        let g = layer.weight.val().grad(&grads).expect("weight gradient");
        assert_eq!(g.dtype(), DType::F32, "the f32 parameter gets an f32 gradient");
        assert_eq!(half(), None, "the context ended with its guard");
    }

    #[test]
    fn mixed_operands_promote_to_f32() {
        let device = Device::flex();
        let a = Tensor::<1>::ones([3], &device);
        let b = Tensor::<1>::ones([3], &device).cast(FloatDType::BF16);
        assert_eq!(add(a.clone(), b.clone()).dtype(), DType::F32);
        assert_eq!(mul(b, a).dtype(), DType::F32);
    }
}
