use super::*;
use burn::tensor::module::conv3d as burn_conv3d;
use burn::tensor::{Distribution, Tolerance};

fn random<const D: usize>(dims: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::random(dims, Distribution::Normal(0.0, 1.0), device)
}

/// Output and the input's, weight's and bias's gradients equal Burn's own
/// convolution's: 3x3x3 with padding, strided, an odd kernel without
/// padding, a plain 1x1x1 (no column buffer), batch 2.
#[test]
fn the_native_convolution_equals_burns_forward_and_backward() {
    let device = Device::flex().autodiff();
    type Case = ([usize; 5], [usize; 5], [usize; 3], [usize; 3]);
    let cases: [Case; 5] = [
        ([1, 3, 5, 6, 7], [4, 3, 3, 3, 3], [1; 3], [1; 3]),
        ([1, 3, 8, 7, 6], [5, 3, 3, 3, 3], [2; 3], [1; 3]),
        ([2, 2, 6, 5, 4], [3, 2, 2, 3, 1], [1, 2, 1], [0, 1, 0]),
        ([1, 6, 4, 5, 3], [2, 6, 1, 1, 1], [1; 3], [0; 3]),
        ([2, 4, 5, 5, 5], [4, 4, 3, 3, 3], [1; 3], [1; 3]),
    ];
    for (xs, ws, stride, padding) in cases {
        let (x, w, b) = (random(xs, &device), random(ws, &device), random([ws[0]], &device));
        let dy_weights = {
            let y = burn_conv3d(x.clone(), w.clone(), Some(b.clone()), Steps { stride, padding }.options());
            random(y.dims(), &device)
        };
        let run = |native: bool| {
            let (x, w, b) = (x.clone().require_grad(), w.clone().require_grad(), b.clone().require_grad());
            let y = if native {
                conv3d(x.clone(), w.clone(), b.clone(), stride, padding)
            } else {
                burn_conv3d(x.clone(), w.clone(), Some(b.clone()), Steps { stride, padding }.options())
            };
            let grads = (y.clone() * dy_weights.clone()).sum().backward();
            let flat = |t: Tensor<5>| t.flatten::<1>(0, 4).into_data();
            (flat(y), flat(x.grad(&grads).unwrap()), flat(w.grad(&grads).unwrap()), b.grad(&grads).unwrap().into_data())
        };
        let (ours, burns) = (run(true), run(false));
        let what = format!("x {xs:?}, weight {ws:?}, stride {stride:?}, padding {padding:?}");
        for (name, a, b) in
            [("output", ours.0, burns.0), ("dx", ours.1, burns.1), ("dw", ours.2, burns.2), ("db", ours.3, burns.3)]
        {
            eprintln!("{what}: {name}");
            a.assert_approx_eq::<f32>(&b, Tolerance::rel_abs(1e-4, 1e-4));
        }
    }
}

/// Under bf16 the output is bf16: the f32 result over the same bf16 inputs,
/// rounded once (the products accumulate in f32).
#[test]
fn a_bf16_convolution_accumulates_in_f32() {
    let device = Device::flex();
    let half = |t: Tensor<5>| t.cast(burn::tensor::FloatDType::BF16);
    let full = |t: Tensor<5>| t.cast(burn::tensor::FloatDType::F32);
    let (x, w) = (half(random([1, 8, 6, 6, 6], &device)), half(random([4, 8, 3, 3, 3], &device)));
    let b = random([4], &device).cast(burn::tensor::FloatDType::BF16);
    let exact = burn_conv3d(
        full(x.clone()),
        full(w.clone()),
        Some(b.clone().cast(burn::tensor::FloatDType::F32)),
        Steps { stride: [1; 3], padding: [1; 3] }.options(),
    );
    let y = conv3d(x, w, b, [1; 3], [1; 3]);
    assert_eq!(y.dtype(), burn::tensor::DType::BF16);
    let y = full(y).flatten::<1>(0, 4).into_data();
    y.assert_approx_eq::<f32>(&exact.flatten::<1>(0, 4).into_data(), Tolerance::rel_abs(8e-3, 1e-2));
}
