//! Every phase ends by reading a value back from the device.
//!
//! A device sync is not enough to trust a phase: CubeCL 0.11 attaches a failed
//! allocation to its buffer instead of raising, skips the kernels that read
//! that buffer and marks their outputs failed too, and reports the failure only
//! when one of those buffers is read (`Client::sync` documents that a launch
//! failure "is not this sync's to report"). So each phase reduces what it made
//! to one number on the device and reads that number back: the parameter
//! checksum after `model` and `step`, the output's mean after `fwd`, the loss
//! and the gradient norm after `bwd`. A read that fails carries the device's
//! error, which the runner classifies as `oom` or `failed`; a number that came
//! back proves every kernel that phase's number depends on ran.
//!
//! The reduction itself allocates a few bytes per parameter tensor; that is
//! after the phase's peak and inside no measured window that matters.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;

/// The number a phase read back, or the device's error as text.
pub type Readback = Result<f64, String>;

/// Read a one-element tensor back: the device's error surfaces here.
pub fn scalar(t: Tensor<1>, what: &str) -> Readback {
    let data = t.try_into_data().map_err(|e| format!("reading back the {what}: {e}"))?;
    let value = data.iter::<f64>().next();
    value.ok_or_else(|| format!("reading back the {what}: the device returned no value"))
}

/// Sum over every float parameter of the model, one value read back.
pub fn param_checksum<M: Module>(model: &M) -> Readback {
    struct Sum(Option<Tensor<1>>);
    impl ModuleVisitor for Sum {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let s = param.val().detach().sum().cast(burn::tensor::FloatDType::F32);
            self.0 = Some(match self.0.take() {
                Some(acc) => acc + s,
                None => s,
            });
        }
    }
    let mut sum = Sum(None);
    model.visit(&mut sum);
    match sum.0 {
        Some(t) => scalar(t, "parameter checksum"),
        None => Ok(0.0),
    }
}

/// The L2 norm of every parameter's gradient, one value read back.
pub fn grad_norm<M: Module>(model: &M, grads: &GradientsParams) -> Readback {
    struct Norm<'a> {
        grads: &'a GradientsParams,
        acc: Option<Tensor<1>>,
        missing: usize,
    }
    impl ModuleVisitor for Norm<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if !param.val().is_require_grad() {
                return;
            }
            let Some(g) = self.grads.get::<D>(param.id) else {
                self.missing += 1;
                return;
            };
            let s = g.cast(burn::tensor::FloatDType::F32).square().sum();
            self.acc = Some(match self.acc.take() {
                Some(acc) => acc + s,
                None => s,
            });
        }
    }
    let mut norm = Norm { grads, acc: None, missing: 0 };
    model.visit(&mut norm);
    if norm.missing > 0 {
        return Err(format!("backward produced no gradient for {} parameter tensor(s)", norm.missing));
    }
    match norm.acc {
        Some(t) => scalar(t, "gradient norm").map(f64::sqrt),
        None => Ok(0.0),
    }
}

/// After `model`, the device's pool must hold at least the parameters' bytes:
/// fewer means some allocations never happened (a failed allocation that
/// CubeCL attached to its buffer instead of raising). Backends without a pool
/// report (the CPU) have nothing to check.
pub fn pool_holds_params<M: Module>(device: &Device, model: &M) -> Result<(), String> {
    struct Bytes(u64);
    impl ModuleVisitor for Bytes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let t = param.val();
            self.0 += (t.shape().num_elements() * t.dtype().size()) as u64;
        }
    }
    let Some(usage) = device.memory_pool_usage() else { return Ok(()) };
    let mut bytes = Bytes(0);
    model.visit(&mut bytes);
    let held = usage.bytes_in_use + usage.bytes_padding;
    if held < bytes.0 {
        return Err(format!(
            "the device pool holds {held} bytes in {} allocations after building a model of {} parameter bytes: allocations are missing",
            usage.number_allocs, bytes.0
        ));
    }
    Ok(())
}
