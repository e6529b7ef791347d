//! Norms, SiLU and softmax that keep for backward what PyTorch's autograd keeps.
//!
//! Burn's `GroupNorm`, `LayerNorm` and `silu` are compositions of elementwise
//! ops, and its autodiff saves what each op needs: a group norm keeps the
//! centred input and the normalised tensor (and its affine multiply the
//! latter again), `silu = x * sigmoid(x)` keeps `x` and `sigmoid(x)`.
//! PyTorch's `native_group_norm` / `native_layer_norm` save the input, the
//! weight and the per-row mean and reciprocal standard deviation; `silu`
//! saves its input; `softmax` its output (Burn's composition keeps the
//! exponent's input and output: two f32 copies of MONAI's attention scores
//! where PyTorch keeps one). Under autocast ([`super::amp`]) the worker runs these
//! custom autodiff ops instead, so what its forward holds is PyTorch's,
//! tensor for tensor: one f32 tensor per norm (the upcast input) and one per
//! SiLU (its input), plus `[rows]` statistics.
//!
//! The forward runs on the inner backend; the backward recomputes the
//! normalised input from `x`, mean and rstd (as PyTorch's kernels do).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::TensorMetadata;
use burn::backend::{backend_extension, Autodiff, Backend, Dispatch};
use burn::prelude::*;
use burn::tensor::Scalar;

/// How a norm sees its input: statistics over the rows of `stats` `[a, rows,
/// m]` (dim 2); the affine per channel of the view `affine`, the channel in
/// dim 1 (group norm: `[B, C, S]`) or dim 2 (layer norm: `[1, R, h]`).
#[derive(Debug, Clone, Copy)]
struct Layout {
    stats: [usize; 3],
    affine: [usize; 3],
    channel_last: bool,
    eps: f64,
}

impl Layout {
    /// Group norm of `[B, C, ...]`: rows `[B, G, C/G·S]`, affine `[B, C, S]`.
    fn group(x: &[usize], groups: usize, eps: f64) -> Layout {
        let (b, c) = (x[0], x[1]);
        let s: usize = x[2..].iter().product();
        Layout { stats: [b, groups, c / groups * s], affine: [b, c, s], channel_last: false, eps }
    }
    /// Layer norm over the last dim `h`: rows `[1, R, h]`, affine the same view.
    fn layer(x: &[usize], eps: f64) -> Layout {
        let h = x[x.len() - 1];
        let r: usize = x[..x.len() - 1].iter().product();
        Layout { stats: [1, r, h], affine: [1, r, h], channel_last: true, eps }
    }
    /// Channels.
    fn channels(&self) -> usize {
        self.affine[if self.channel_last { 2 } else { 1 }]
    }
    /// The shape `gamma` broadcasts as over the affine view.
    fn gamma_view(&self) -> [usize; 3] {
        if self.channel_last {
            [1, 1, self.channels()]
        } else {
            [1, self.channels(), 1]
        }
    }
}

fn shape3(s: [usize; 3]) -> burn::tensor::Shape {
    burn::tensor::Shape::new(s)
}

/// The custom ops on every backend this build has; autodiff gets PyTorch's saved state.
#[backend_extension(
    Flex: cfg(feature = "flex"),
    Cube: cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda")),
    Autodiff
)]
pub trait TorchSaved: Backend {
    /// `GroupNorm(groups)` of `x` `[B, C, ...]` with per-channel `gamma`, `beta` `[C]`.
    fn group_norm_saving_input(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        groups: usize,
        eps: f64,
    ) -> FloatTensor<Self> {
        let layout = Layout::group(&x.shape(), groups, eps);
        norm_forward::<Self>(x, gamma, beta, layout).0
    }
    /// `LayerNorm` over the last dim of `x` with `gamma`, `beta` `[h]`.
    fn layer_norm_saving_input(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> FloatTensor<Self> {
        let layout = Layout::layer(&x.shape(), eps);
        norm_forward::<Self>(x, gamma, beta, layout).0
    }
    /// `x * sigmoid(x)`.
    fn silu_saving_input(x: FloatTensor<Self>) -> FloatTensor<Self> {
        silu_forward::<Self>(x)
    }
    /// Softmax of `x` along `dim`.
    fn softmax_saving_output(x: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        softmax_forward::<Self>(x, dim)
    }
}

#[cfg(feature = "flex")]
impl TorchSaved for burn::backend::Flex {}
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
impl TorchSaved for burn::backend::Cube {}

/// Normalised `x` with the affine, and the row statistics `[a, rows, 1]` (mean, rstd).
fn norm_forward<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    l: Layout,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let shape = x.shape();
    let xs = B::float_reshape(x, shape3(l.stats)); // [a, rows, m]
    let mean = B::float_mean_dim(xs.clone(), 2); // [a, rows, 1]
    let centred = B::float_sub(xs, mean.clone()); // [a, rows, m]
    let var = B::float_mean_dim(B::float_mul(centred.clone(), centred.clone()), 2); // [a, rows, 1]
    let rstd = B::float_recip(B::float_sqrt(B::float_add_scalar(var, Scalar::Float(l.eps))));
    let xhat = B::float_reshape(B::float_mul(centred, rstd.clone()), shape3(l.affine)); // [b, c, s]
    let g = B::float_reshape(gamma, shape3(l.gamma_view()));
    let bt = B::float_reshape(beta, shape3(l.gamma_view()));
    let y = B::float_add(B::float_mul(xhat, g), bt);
    (B::float_reshape(y, shape), mean, rstd)
}

/// `[dx, dgamma, dbeta]` of the norm from `x`, its statistics and `dy`;
/// `dgamma` and `dbeta` only where `affine` asks for them (a norm whose
/// weight and bias are constants, as the DiT's adaLN LayerNorm, computes
/// neither: PyTorch's `native_layer_norm_backward` output mask).
fn norm_backward<B: Backend>(s: NormState<B>, dy: FloatTensor<B>, affine: [bool; 2]) -> [Option<FloatTensor<B>>; 3] {
    let NormState { x, gamma, mean, rstd, layout: l } = s;
    let shape = x.shape();
    let c = l.channels();
    let xs = B::float_reshape(x, shape3(l.stats)); // [a, rows, m]
    let xhat = B::float_mul(B::float_sub(xs, mean), rstd.clone()); // [a, rows, m]
    let xhat_a = B::float_reshape(xhat.clone(), shape3(l.affine)); // [b, c, s]
    let dy = B::float_reshape(dy, shape3(l.affine)); // [b, c, s]
                                                     // Sum over every dim but the channel's.
    let other = if l.channel_last { 1 } else { 2 };
    let per_channel = |t: FloatTensor<B>| {
        let t = B::float_sum_dim(B::float_sum_dim(t, other), 0);
        B::float_reshape(t, burn::tensor::Shape::new([c]))
    };
    let dbeta = affine[1].then(|| per_channel(dy.clone()));
    let dgamma = affine[0].then(|| per_channel(B::float_mul(dy.clone(), xhat_a)));
    let g = B::float_mul(dy, B::float_reshape(gamma, shape3(l.gamma_view()))); // [b, c, s]
    let g = B::float_reshape(g, shape3(l.stats)); // [a, rows, m]
    let mean_g = B::float_mean_dim(g.clone(), 2); // [a, rows, 1]
    let mean_gx = B::float_mean_dim(B::float_mul(g.clone(), xhat.clone()), 2); // [a, rows, 1]
    let dx = B::float_sub(B::float_sub(g, mean_g), B::float_mul(xhat, mean_gx));
    let dx = B::float_mul(dx, rstd); // [a, rows, m]
    [Some(B::float_reshape(dx, shape)), dgamma, dbeta]
}

fn silu_forward<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    B::float_mul(x.clone(), B::sigmoid(x))
}

/// `dy * s * (1 + x (1 - s))`, `s = sigmoid(x)`.
fn silu_backward<B: Backend>(x: FloatTensor<B>, dy: FloatTensor<B>) -> FloatTensor<B> {
    let s = B::sigmoid(x.clone());
    let one_minus = B::float_add_scalar(B::float_neg(s.clone()), Scalar::Float(1.0));
    let inner = B::float_add_scalar(B::float_mul(x, one_minus), Scalar::Float(1.0));
    B::float_mul(dy, B::float_mul(s, inner))
}

/// `exp(x - max) / sum`, each step on the tensor the one before handed over
/// (no copy of `x` outlives the op).
fn softmax_forward<B: Backend>(x: FloatTensor<B>, dim: usize) -> FloatTensor<B> {
    let max = B::float_max_dim(x.clone(), dim);
    let e = B::float_exp(B::float_sub(x, max));
    let sum = B::float_sum_dim(e.clone(), dim);
    B::float_div(e, sum)
}

/// `y * (dy - sum(dy * y))` along `dim`: PyTorch's `_softmax_backward_data`,
/// from the output alone.
fn softmax_backward<B: Backend>(y: FloatTensor<B>, dy: FloatTensor<B>, dim: usize) -> FloatTensor<B> {
    let dot = B::float_sum_dim(B::float_mul(dy.clone(), y.clone()), dim);
    B::float_mul(y, B::float_sub(dy, dot))
}

/// What a norm's backward keeps: PyTorch's input, weight, mean and rstd.
#[derive(Debug, Clone)]
struct NormState<B: Backend> {
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    mean: FloatTensor<B>,
    rstd: FloatTensor<B>,
    layout: Layout,
}

#[derive(Debug)]
struct NormBackward;

impl<B: Backend> Backward<B, 3> for NormBackward {
    type State = NormState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let affine = [ops.parents[1].is_some(), ops.parents[2].is_some()];
        for (parent, grad) in ops.parents.into_iter().zip(norm_backward::<B>(ops.state, dy, affine)) {
            if let (Some(node), Some(grad)) = (parent, grad) {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

#[derive(Debug)]
struct SiluBackward;

impl<B: Backend> Backward<B, 1> for SiluBackward {
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let [parent] = ops.parents;
        if let Some(node) = parent {
            grads.register::<B>(node.id, silu_backward::<B>(ops.state, dy));
        }
    }
}

#[derive(Debug)]
struct SoftmaxBackward;

impl<B: Backend> Backward<B, 1> for SoftmaxBackward {
    /// The output and the dim.
    type State = (FloatTensor<B>, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let [parent] = ops.parents;
        if let Some(node) = parent {
            let (y, dim) = ops.state;
            grads.register::<B>(node.id, softmax_backward::<B>(y, dy, dim));
        }
    }
}

/// The tracked norm: forward on the inner backend, PyTorch's state for backward.
fn tracked_norm<B: Backend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    gamma: FloatTensor<Autodiff<B, C>>,
    beta: FloatTensor<Autodiff<B, C>>,
    layout: Layout,
) -> FloatTensor<Autodiff<B, C>> {
    let prep = NormBackward.prepare::<C>([x.node(), gamma.node(), beta.node()]).compute_bound().stateful();
    let (x, gamma, beta) = (x.into_primitive(), gamma.into_primitive(), beta.into_primitive());
    let (y, mean, rstd) = norm_forward::<B>(x.clone(), gamma.clone(), beta, layout);
    match prep {
        OpsKind::Tracked(prep) => prep.finish(NormState { x, gamma, mean, rstd, layout }, y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    }
}

impl<B: Backend + TorchSaved, C: CheckpointStrategy> TorchSaved for Autodiff<B, C> {
    fn group_norm_saving_input(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        groups: usize,
        eps: f64,
    ) -> FloatTensor<Self> {
        let layout = Layout::group(&x.shape(), groups, eps);
        tracked_norm::<B, C>(x, gamma, beta, layout)
    }

    fn layer_norm_saving_input(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> FloatTensor<Self> {
        let layout = Layout::layer(&x.shape(), eps);
        tracked_norm::<B, C>(x, gamma, beta, layout)
    }

    fn silu_saving_input(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let prep = SiluBackward.prepare::<C>([x.node()]).compute_bound().stateful();
        let x = x.into_primitive();
        let y = silu_forward::<B>(x.clone());
        match prep {
            OpsKind::Tracked(prep) => prep.finish(x, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn softmax_saving_output(x: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        let prep = SoftmaxBackward.prepare::<C>([x.node()]).compute_bound().stateful();
        let y = softmax_forward::<B>(x.into_primitive(), dim);
        match prep {
            OpsKind::Tracked(prep) => prep.finish((y.clone(), dim), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }
}

/// `GroupNorm(groups, eps)` of `x` `[B, C, ...]` (f32), affine `gamma`, `beta` `[C]`.
pub fn group_norm<const D: usize>(
    x: Tensor<D>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    groups: usize,
    eps: f64,
) -> Tensor<D> {
    Tensor::from_dispatch(<Dispatch as TorchSaved>::group_norm_saving_input(
        x.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        groups,
        eps,
    ))
}

/// `LayerNorm(eps)` over the last dim of `x`, affine `gamma`, `beta` `[h]`.
pub fn layer_norm<const D: usize>(x: Tensor<D>, gamma: Tensor<1>, beta: Tensor<1>, eps: f64) -> Tensor<D> {
    Tensor::from_dispatch(<Dispatch as TorchSaved>::layer_norm_saving_input(
        x.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        eps,
    ))
}

/// SiLU keeping only its input for backward.
pub fn silu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    Tensor::from_dispatch(<Dispatch as TorchSaved>::silu_saving_input(x.into_dispatch()))
}

/// Softmax along `dim` keeping only its output for backward (PyTorch's
/// `_softmax`); Burn's composition keeps the exponent's input and output.
pub fn softmax<const D: usize>(x: Tensor<D>, dim: usize) -> Tensor<D> {
    Tensor::from_dispatch(<Dispatch as TorchSaved>::softmax_saving_output(x.into_dispatch(), dim))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn close(what: &str, a: Tensor<1>, b: Tensor<1>) {
        let (a, b) = (a.into_data().try_to_vec::<f32>().unwrap(), b.into_data().try_to_vec::<f32>().unwrap());
        assert_eq!(a.len(), b.len(), "{what}");
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs() / (1e-3 + y.abs())).fold(0f32, f32::max);
        assert!(worst < 2e-3, "{what}: largest relative difference {worst}");
    }

    /// Outputs and gradients (the input's, and the weight's and bias's)
    /// equal Burn's own modules' (group norm, layer norm with affine, SiLU)
    /// on random inputs.
    #[test]
    fn gradients_match_burns_composed_ops() {
        let device = Device::flex().autodiff();
        let x = Tensor::<3>::random([2, 8, 5], Distribution::Normal(0.0, 1.0), &device);
        let w = Tensor::<3>::random([2, 8, 5], Distribution::Normal(0.0, 1.0), &device);
        let gn = burn::nn::GroupNormConfig::new(4, 8).with_epsilon(1e-6).init(&device);
        let ln = burn::nn::LayerNormConfig::new(5).init(&device);
        type F<'a> = Box<dyn Fn(Tensor<3>) -> Tensor<3> + 'a>;
        let (gamma, beta) = (gn.gamma.as_ref().unwrap().val(), gn.beta.as_ref().unwrap().val());
        let (lg, lb) = (ln.gamma.val(), ln.beta.as_ref().unwrap().val());
        let cases: [(&str, F<'_>, F<'_>, Vec<Tensor<1>>); 4] = [
            (
                "group norm",
                Box::new(|x| gn.forward(x)),
                Box::new(|x| group_norm(x, gamma.clone(), beta.clone(), 4, 1e-6)),
                vec![gamma.clone(), beta.clone()],
            ),
            (
                "layer norm",
                Box::new(|x| ln.forward(x)),
                Box::new(|x| layer_norm(x, lg.clone(), lb.clone(), 1e-5)),
                vec![lg.clone(), lb.clone()],
            ),
            ("silu", Box::new(burn::tensor::activation::silu::<3>), Box::new(silu::<3>), vec![]),
            ("softmax", Box::new(|x| burn::tensor::activation::softmax(x, 2)), Box::new(|x| softmax(x, 2)), vec![]),
        ];
        for (what, reference, ours, params) in cases {
            let run = |f: &F<'_>| {
                let xi = x.clone().detach().require_grad();
                let y = f(xi.clone());
                let g = (y.clone() * w.clone()).sum().backward();
                let param_grads: Vec<Tensor<1>> = params.iter().map(|p| p.grad(&g).expect("a weight's grad")).collect();
                (y.flatten::<1>(0, 2), xi.grad(&g).unwrap().flatten::<1>(0, 2), param_grads)
            };
            let ((y0, g0, p0), (y1, g1, p1)) = (run(&reference), run(&ours));
            close(what, y1, y0);
            close(what, g1, g0);
            for (i, (a, b)) in p1.into_iter().zip(p0).enumerate() {
                close(&format!("{what}: {}", ["weight", "bias"][i]), a, b);
            }
        }
    }

    /// The norm's backward computes the weight's and bias's gradients only
    /// when asked (PyTorch's output mask), and the input's always.
    #[test]
    fn norm_backward_computes_only_the_gradients_asked_for() {
        let device = Device::flex();
        let t = |dims: [usize; 3]| Tensor::<3>::random(dims, Distribution::Normal(0.0, 1.0), &device).into_dispatch();
        let (x, dy) = (t([2, 8, 5]), t([2, 8, 5]));
        let (gamma, beta) =
            (Tensor::<1>::ones([5], &device).into_dispatch(), Tensor::<1>::zeros([5], &device).into_dispatch());
        let layout = Layout::layer(&x.shape(), 1e-5);
        for affine in [[false, false], [true, false], [true, true]] {
            let (_, mean, rstd) = norm_forward::<Dispatch>(x.clone(), gamma.clone(), beta.clone(), layout);
            let state = NormState { x: x.clone(), gamma: gamma.clone(), mean, rstd, layout };
            let [dx, dgamma, dbeta] = norm_backward::<Dispatch>(state, dy.clone(), affine);
            assert!(dx.is_some(), "{affine:?}");
            assert_eq!([dgamma.is_some(), dbeta.is_some()], affine);
        }
    }

    /// A norm whose weight and bias are constants (the DiT's adaLN LayerNorm,
    /// whose backward skips their gradients) gives the input the same gradient
    /// as with them learnt, and them none.
    #[test]
    fn a_norm_with_constant_affine_gives_the_same_input_gradient() {
        let device = Device::flex().autodiff();
        let x = Tensor::<3>::random([2, 8, 5], Distribution::Normal(0.0, 1.0), &device);
        let w = Tensor::<3>::random([2, 8, 5], Distribution::Normal(0.0, 1.0), &device);
        let grad = |gamma: Tensor<1>, beta: Tensor<1>| {
            let xi = x.clone().detach().require_grad();
            let g = (layer_norm(xi.clone(), gamma.clone(), beta.clone(), 1e-5) * w.clone()).sum().backward();
            assert_eq!(gamma.grad(&g).is_some(), gamma.is_require_grad());
            xi.grad(&g).unwrap().flatten::<1>(0, 2)
        };
        let fixed = grad(Tensor::ones([5], &device), Tensor::zeros([5], &device));
        let learnt = grad(Tensor::ones([5], &device).require_grad(), Tensor::zeros([5], &device).require_grad());
        close("constant affine", fixed, learnt);
    }
}
