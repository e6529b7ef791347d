//! Attention as the group's PyTorch runs compute it.
//!
//! - [`AttentionKernel::MemoryEfficient`] (the transformer families: PyTorch's
//!   SDPA with its flash / memory-efficient kernels): a custom autodiff op. The
//!   forward pass walks the queries in chunks, computing each chunk's scores,
//!   softmax and output and the row log-sum-exp, and keeps for backward only q,
//!   k, v, the output and the log-sum-exp. Backward recomputes each chunk's
//!   scores from them (the flash-attention backward). No N x N tensor outlives
//!   a chunk, so what a block holds for backward grows linearly in tokens. A
//!   chunk's scores are at most [`CHUNK_SCORE_ELEMS`] elements (2 MiB in the
//!   half type, 4 MiB as the f32 softmax tile): its working set is a few MiB
//!   whatever the token count, below anything a run's peak would show, as
//!   SDPA's kernels hold their tiles on chip.
//! - [`AttentionKernel::Materialised`] (MONAI's UNet attention, and the old
//!   behaviour for comparison): `burn::tensor::module::attention`, which Burn
//!   0.22's autodiff decomposes into matmul, softmax and matmul, holding the
//!   B x heads x N x N scores for backward.
//!
//! Softmax and its statistics are computed in f32 whatever the input dtype
//! (as PyTorch's kernels do); the matmuls run in the input dtype.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{backend_extension, Autodiff, Backend, Dispatch};
use std::sync::atomic::{AtomicUsize, Ordering};

use burn::backend::TensorMetadata;
use burn::prelude::*;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{DType, FloatDType, Scalar, Slice};
pub use facts::event::AttentionKernel;

use super::amp;

/// Heads of a transformer block's attention and the kernel that computes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    pub count: usize,
    pub kernel: AttentionKernel,
}

/// Upper bound of the elements of one chunk's scores (`[B, heads, chunk, N]`):
/// 1 Mi, 2 MiB in the half type, 4 MiB as the f32 softmax tile.
pub const CHUNK_SCORE_ELEMS: usize = 1 << 20;

/// The bound in use: a variable only so that tests can force many chunks on small inputs.
static CHUNK_ELEMS: AtomicUsize = AtomicUsize::new(CHUNK_SCORE_ELEMS);

/// Attention of `q`, `k`, `v` `[B, heads, N, head_dim]` with the given kernel;
/// the memory-efficient kernel lays its output out `[B, N, heads, head_dim]`
/// (as SDPA does for q that is a view of a packed qkv).
pub fn scaled_dot_product(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, kernel: AttentionKernel) -> Tensor<4> {
    attend(q, k, v, kernel, false)
}

/// [`scaled_dot_product`] of contiguous q and k (the group's qk-norm outputs):
/// the output is laid out like q, `[B, heads, N, head_dim]`, as SDPA's kernels
/// lay theirs out, so a `[B, N, heads·head_dim]` view of it needs a copy.
pub fn scaled_dot_product_like_q(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, kernel: AttentionKernel) -> Tensor<4> {
    attend(q, k, v, kernel, true)
}

fn attend(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, kernel: AttentionKernel, out_like_q: bool) -> Tensor<4> {
    match kernel {
        AttentionKernel::MemoryEfficient => {
            Tensor::from_dispatch(<Dispatch as MemoryEfficientAttention>::mem_efficient_attention(
                q.into_dispatch(),
                k.into_dispatch(),
                v.into_dispatch(),
                out_like_q,
            ))
        }
        AttentionKernel::Materialised | AttentionKernel::Fused if amp::torch_saved() => {
            // MONAI's as PyTorch runs it: scores from a matmul, softmax in f32
            // keeping its output, the probabilities into the second matmul
            // (under autocast: half scores, half probabilities; 6 bytes a
            // score kept for backward, 4 in f32 where both keep one tensor).
            let scale = 1.0 / (q.dims()[3] as f64).sqrt();
            let scores = amp::matmul(q, k.swap_dims(2, 3)).mul_scalar(scale);
            let probs = amp::softmax(amp::to_f32(scores), 3);
            amp::matmul(probs, v)
        }
        AttentionKernel::Materialised | AttentionKernel::Fused => {
            attention(q, k, v, None, None, AttentionModuleOptions::default())
        }
    }
}

/// The op on every backend this build has; autodiff gets the flash backward.
#[backend_extension(
    Flex: cfg(feature = "flex"),
    Cube: cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda")),
    Autodiff
)]
pub trait MemoryEfficientAttention: Backend {
    /// Softmax(q kᵀ / √d) v of `[B, heads, N, d]` tensors, computed chunk by
    /// chunk; the output laid out like contiguous q when `out_like_q`, else `[B, N, heads, d]`.
    fn mem_efficient_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out_like_q: bool,
    ) -> FloatTensor<Self> {
        forward::<Self>(q, k, v, out_like_q).0
    }
}

#[cfg(feature = "flex")]
impl MemoryEfficientAttention for burn::backend::Flex {}
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
impl MemoryEfficientAttention for burn::backend::Cube {}

/// What backward keeps: q, k, v, the output and the row log-sum-exp, nothing N x N.
type Saved<B> = [FloatTensor<B>; 5];

#[derive(Debug)]
struct FlashBackward;

impl<B: Backend> Backward<B, 3> for FlashBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad_out = grads.consume::<B>(&ops.node);
        let [q, k, v, out, lse] = ops.state;
        let [dq, dk, dv] = backward::<B>(q, k, v, out, lse, grad_out);
        for (parent, grad) in ops.parents.into_iter().zip([dq, dk, dv]) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: Backend + MemoryEfficientAttention, C: CheckpointStrategy> MemoryEfficientAttention for Autodiff<B, C> {
    fn mem_efficient_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out_like_q: bool,
    ) -> FloatTensor<Self> {
        let prep = FlashBackward.prepare::<C>([q.node(), k.node(), v.node()]).compute_bound().stateful();
        let (q, k, v) = (q.into_primitive(), k.into_primitive(), v.into_primitive());
        let (out, lse) = forward::<B>(q.clone(), k.clone(), v.clone(), out_like_q);
        match prep {
            OpsKind::Tracked(prep) => prep.finish([q, k, v, out.clone(), lse], out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}

/// `[B, heads, N, d]` of a tensor.
fn dims4<B: Backend>(t: &FloatTensor<B>) -> [usize; 4] {
    let s = t.shape();
    [s[0], s[1], s[2], s[3]]
}

fn float_dtype<B: Backend>(t: &FloatTensor<B>) -> FloatDType {
    FloatDType::from(t.dtype())
}

fn cast<B: Backend>(t: FloatTensor<B>, to: FloatDType) -> FloatTensor<B> {
    if t.dtype() == DType::from(to) {
        t
    } else {
        B::float_cast(t, to)
    }
}

/// Rows `start..end` of dim 2.
fn rows<B: Backend>(t: FloatTensor<B>, start: usize, end: usize) -> FloatTensor<B> {
    let all = Slice::full();
    B::float_slice(t, &[all, all, Slice::new(start as isize, Some(end as isize), 1), all])
}

/// Query rows per chunk so that one chunk's scores stay within [`CHUNK_SCORE_ELEMS`].
fn chunk_rows(batch_heads: usize, n: usize) -> usize {
    (CHUNK_ELEMS.load(Ordering::Relaxed) / (batch_heads * n).max(1)).clamp(1, n.max(1))
}

/// Chunked forward: (output `[B, h, N, d]`, a view of `[B, N, h, d]` storage,
/// or contiguous when `out_like_q`; row log-sum-exp `[B, h, N, 1]` in f32).
fn forward<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    out_like_q: bool,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let [b, h, n, d] = dims4::<B>(&q);
    let dtype = float_dtype::<B>(&q);
    let scale = Scalar::Float(1.0 / (d as f64).sqrt());
    let kt = B::float_transpose(k); // [B, h, d, N]
    let chunk = chunk_rows(b * h, n);
    let (mut outs, mut lses) = (Vec::new(), Vec::new());
    for start in (0..n).step_by(chunk) {
        let qi = rows::<B>(q.clone(), start, (start + chunk).min(n)); // [B, h, c, d]
        let s = cast::<B>(B::float_mul_scalar(B::float_matmul(qi, kt.clone()), scale), FloatDType::F32); // [B, h, c, N]
        let m = B::float_max_dim(s.clone(), 3); // [B, h, c, 1]
        let p = B::float_exp(B::float_sub(s, m.clone())); // [B, h, c, N]
        let l = B::float_sum_dim(p.clone(), 3); // [B, h, c, 1]
        let o = B::float_matmul(cast::<B>(p, dtype), v.clone()); // [B, h, c, d]
        let o = B::float_div(cast::<B>(o, FloatDType::F32), l.clone());
        let o = cast::<B>(o, dtype);
        outs.push(if out_like_q { o } else { B::float_swap_dims(o, 1, 2) }); // [B, h, c, d] or [B, c, h, d]
        lses.push(B::float_add(m, B::float_log(l)));
    }
    if out_like_q {
        return (B::float_cat(outs, 2), B::float_cat(lses, 2));
    }
    // Laid out [B, N, h, d] and handed on as a [B, h, N, d] view, as SDPA's
    // kernels return theirs: the caller's `[B, N, h·d]` for the projection is
    // then the same storage, not a second copy of the output.
    (B::float_swap_dims(B::float_cat(outs, 1), 1, 2), B::float_cat(lses, 2))
}

/// The flash-attention backward: scores recomputed chunk by chunk from q, k and
/// the saved log-sum-exp. Returns `[dq, dk, dv]`.
fn backward<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    out: FloatTensor<B>,
    lse: FloatTensor<B>,
    grad_out: FloatTensor<B>,
) -> [FloatTensor<B>; 3] {
    let [b, h, n, d] = dims4::<B>(&q);
    let dtype = float_dtype::<B>(&q);
    let f32 = FloatDType::F32;
    let scale = Scalar::Float(1.0 / (d as f64).sqrt());
    // D_i = rowsum(dO ∘ O), [B, h, N, 1].
    let delta = B::float_sum_dim(B::float_mul(cast::<B>(grad_out.clone(), f32), cast::<B>(out, f32)), 3);
    let kt = B::float_transpose(k.clone()); // [B, h, d, N]
    let vt = B::float_transpose(v); // [B, h, d, N]
    let chunk = chunk_rows(b * h, n);
    let (mut dqs, mut dk, mut dv) = (Vec::new(), None::<FloatTensor<B>>, None::<FloatTensor<B>>);
    let accumulate = |acc: Option<FloatTensor<B>>, x: FloatTensor<B>| {
        Some(match acc {
            Some(a) => B::float_add(a, x),
            None => x,
        })
    };
    for start in (0..n).step_by(chunk) {
        let end = (start + chunk).min(n);
        let qi = rows::<B>(q.clone(), start, end); // [B, h, c, d]
        let doi = rows::<B>(grad_out.clone(), start, end); // [B, h, c, d]
        let s = cast::<B>(B::float_mul_scalar(B::float_matmul(qi.clone(), kt.clone()), scale), f32); // [B, h, c, N]
        let p = B::float_exp(B::float_sub(s, rows::<B>(lse.clone(), start, end))); // softmax rows, [B, h, c, N]
        let p_in = cast::<B>(p.clone(), dtype);
        dv = accumulate(dv, cast::<B>(B::float_matmul(B::float_transpose(p_in), doi.clone()), f32)); // [B, h, N, d]
        let dp = cast::<B>(B::float_matmul(doi, vt.clone()), f32); // [B, h, c, N]
        let ds = cast::<B>(B::float_mul(p, B::float_sub(dp, rows::<B>(delta.clone(), start, end))), dtype);
        dqs.push(B::float_mul_scalar(B::float_matmul(ds.clone(), k.clone()), scale)); // [B, h, c, d]
        let dki = B::float_mul_scalar(B::float_matmul(B::float_transpose(ds), qi), scale); // [B, h, N, d]
        dk = accumulate(dk, cast::<B>(dki, f32));
    }
    let dk = cast::<B>(dk.expect("at least one chunk"), dtype);
    let dv = cast::<B>(dv.expect("at least one chunk"), dtype);
    [B::float_cat(dqs, 2), dk, dv]
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    /// Gradients of `sum(attention(q, k, v) * w)` with respect to q, k, v.
    fn grads(kernel: AttentionKernel, inputs: &[Tensor<4>; 4]) -> (Vec<f32>, [Vec<f32>; 3]) {
        let [q, k, v, w] = inputs.clone();
        let (q, k, v) = (q.require_grad(), k.require_grad(), v.require_grad());
        let out = scaled_dot_product(q.clone(), k.clone(), v.clone(), kernel);
        let values = out.clone().into_data().try_to_vec::<f32>().unwrap();
        let g = (out * w).sum().backward();
        let grad = |t: &Tensor<4>| t.grad(&g).expect("a gradient").into_data().try_to_vec::<f32>().unwrap();
        (values, [grad(&q), grad(&k), grad(&v)])
    }

    fn assert_close(what: &str, a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len(), "{what}");
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs() / (1e-3 + y.abs())).fold(0f32, f32::max);
        assert!(worst < 1e-3, "{what}: largest relative difference {worst}");
    }

    /// The memory-efficient op computes the same outputs and gradients as
    /// Burn's decomposed attention, in one chunk and in many (37 tokens in
    /// chunks of 4 rows, the last one short).
    #[test]
    fn memory_efficient_gradients_match_the_decomposed_attention() {
        let device = Device::flex().autodiff();
        let shape = [2, 3, 37, 8];
        let input = || Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        let inputs = [input(), input(), input(), input()];
        let (reference, reference_grads) = grads(AttentionKernel::Materialised, &inputs);
        for budget in [CHUNK_SCORE_ELEMS, 2 * 3 * 37 * 4] {
            CHUNK_ELEMS.store(budget, Ordering::Relaxed);
            let (out, g) = grads(AttentionKernel::MemoryEfficient, &inputs);
            CHUNK_ELEMS.store(CHUNK_SCORE_ELEMS, Ordering::Relaxed);
            assert_close("output", &out, &reference);
            for (name, (a, b)) in ["dq", "dk", "dv"].iter().zip(g.iter().zip(&reference_grads)) {
                assert_close(name, a, b);
            }
        }
    }
}
