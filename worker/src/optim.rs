//! `torch.optim.AdamW` as the group's runs step it: on CUDA its default is the
//! multi-tensor (`foreach`) implementation, `_multi_tensor_adamw`, which works
//! on the whole parameter list at once:
//!
//! 1. the first step creates both moments for every parameter (`zeros_like`,
//!    f32: 8 bytes a parameter);
//! 2. `_foreach_mul_(params, 1 - lr·wd)`, `_foreach_lerp_(exp_avgs, grads,
//!    1 - β1)`, `_foreach_mul_(exp_avg_sqs, β2)`, `_foreach_addcmul_(...)`: in
//!    place;
//! 3. `exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs)`: a new tensor per
//!    parameter, the whole list alive at once (4 bytes a parameter), then
//!    `_foreach_div_` and `_foreach_add_(eps)` in place;
//! 4. `_foreach_addcdiv_(params, exp_avgs, exp_avg_sq_sqrt, step_size)`.
//!
//! The gradients stay alive through the step (`p.grad` until `zero_grad`).
//! So the step's peak is weights + gradients + moments + that square-root
//! list: 20 bytes a parameter. Burn's `AdamW` steps one tensor at a time
//! (one parameter's temporaries), 16 bytes a parameter; this reproduces the
//! list-wide temporaries. Where PyTorch's fused foreach kernels need no
//! temporary (`lerp_`, `addcmul_`, `addcdiv_`) Burn's elementwise ops make
//! one tensor of the parameter being updated, freed before the next.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;

/// AdamW with PyTorch's defaults (β 0.9, 0.999, eps 1e-8, weight decay 0.01).
#[derive(Debug, Default)]
pub struct ForeachAdamW {
    /// (exp_avg, exp_avg_sq) per parameter, flat f32.
    moments: HashMap<ParamId, (Tensor<1>, Tensor<1>)>,
    /// The parameters in the module's order, as their state was made: every
    /// list-wide op walks them so. (A `HashMap`'s order differs from process
    /// to process, and with it CubeCL's fused kernels: a kernel cache that
    /// never settles, and other peaks.)
    order: Vec<ParamId>,
    step: i32,
}

const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;
const EPS: f64 = 1e-8;
const WEIGHT_DECAY: f64 = 0.01;

/// Steps 1 and 2 over every parameter with a gradient, one list at a time.
/// The gradients are read in their own layout: a flat copy of a strided
/// gradient (Burn's conv weight gradients are permuted views) would be a
/// parameter-sized tensor PyTorch's foreach ops never make.
struct Moments<'a> {
    grads: &'a GradientsParams,
    moments: &'a mut HashMap<ParamId, (Tensor<1>, Tensor<1>)>,
    order: &'a mut Vec<ParamId>,
    list: List,
}

#[derive(Clone, Copy)]
enum List {
    /// `_init_group`: both moments, zeros, for every parameter without them.
    Init,
    /// `_foreach_lerp_(exp_avgs, grads, 1 - β1)`.
    ExpAvg,
    /// `_foreach_mul_(exp_avg_sqs, β2)`, `_foreach_addcmul_(.., grads, grads, 1 - β2)`.
    ExpAvgSq,
}

impl ModuleVisitor for Moments<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let Some(g) = self.grads.get::<D>(param.id) else { return };
        let shape = g.shape();
        let n = shape.num_elements();
        match self.list {
            List::Init => {
                if let std::collections::hash_map::Entry::Vacant(e) = self.moments.entry(param.id) {
                    let device = g.device();
                    e.insert((Tensor::zeros([n], &device), Tensor::zeros([n], &device)));
                    self.order.push(param.id);
                }
            }
            List::ExpAvg => {
                let (m, _) = self.moments.get_mut(&param.id).expect("state made first");
                let old = std::mem::replace(m, Tensor::empty([0], &g.device()));
                *m = old.reshape(shape).mul_scalar(BETA1).add(g.mul_scalar(1.0 - BETA1)).reshape([n]);
            }
            List::ExpAvgSq => {
                let (_, v) = self.moments.get_mut(&param.id).expect("state made first");
                let old = std::mem::replace(v, Tensor::empty([0], &g.device()));
                *v = old.reshape(shape).mul_scalar(BETA2).add(g.clone().mul(g).mul_scalar(1.0 - BETA2)).reshape([n]);
            }
        }
    }
}

/// Step 4 on each parameter: decay, then `p -= step_size · m / denom`.
struct Apply<'a> {
    moments: &'a HashMap<ParamId, (Tensor<1>, Tensor<1>)>,
    denoms: HashMap<ParamId, Tensor<1>>,
    lr: f64,
    step_size: f64,
}

impl ModuleMapper for Apply<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(denom) = self.denoms.remove(&id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let exp_avg = self.moments[&id].0.clone();
        let (require_grad, strategy) = (tensor.is_require_grad(), tensor.gradient_checkpointing_strategy());
        let shape = tensor.shape();
        let p = tensor.inner().mul_scalar(1.0 - self.lr * WEIGHT_DECAY);
        let update = exp_avg.div(denom).mul_scalar(self.step_size).reshape(shape);
        let mut p = Tensor::from_inner(p.sub(update));
        if let Some(s) = strategy {
            p = p.with_gradient_checkpointing_strategy(s);
        }
        if require_grad {
            p = p.require_grad();
        }
        Param::from_mapped_value(id, p, mapper)
    }
}

impl ForeachAdamW {
    pub fn new() -> Self {
        Self::default()
    }

    /// One step at learning rate `lr` over every parameter of `module` with a
    /// gradient in `grads`; the gradients are dropped when it returns.
    pub fn step<M: Module>(&mut self, lr: f64, module: M, grads: GradientsParams) -> M {
        self.step += 1;
        // 1. State for every parameter before any update (`_init_group`),
        // 2. the moments, in place, list by list.
        for list in [List::Init, List::ExpAvg, List::ExpAvgSq] {
            module.visit(&mut Moments { grads: &grads, moments: &mut self.moments, order: &mut self.order, list });
        }
        // 3. The square roots, the whole list at once.
        let bc1 = 1.0 - BETA1.powi(self.step);
        let bc2_sqrt = (1.0 - BETA2.powi(self.step)).sqrt();
        let denoms: HashMap<ParamId, Tensor<1>> = self
            .order
            .iter()
            .map(|id| (*id, self.moments[id].1.clone().sqrt().div_scalar(bc2_sqrt).add_scalar(EPS)))
            .collect();
        // 4. The parameters.
        let mut apply = Apply { moments: &self.moments, denoms, lr, step_size: lr / bc1 };
        let module = module.map(&mut apply);
        drop(grads);
        module
    }
}
