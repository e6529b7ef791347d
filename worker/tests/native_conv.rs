//! PyTorch's native 3D convolution (the group's runs convolved without
//! cuDNN) allocates a column buffer of `27·C` elements an output voxel for a
//! 3x3x3 kernel, forward and in each of its two backward products, and none
//! for a plain 1x1x1 kernel. Measured by the worker's exact allocator; its
//! own test binary, each test holding [`LOCK`] (they measure the process).

use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
use worker::alloc;
use worker::models::columns::conv3d;

static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

const C: usize = 16;
const S: usize = 24;
/// The 1x1x1 case's side: its would-be column buffer (8 MiB) well above the slack.
const S1: usize = 64;

/// Peak bytes above what was live while `f` ran (its inputs already allocated).
fn working_set<T>(device: &Device, f: impl FnOnce() -> T) -> (u64, T) {
    device.sync().unwrap();
    let before = alloc::current();
    alloc::reset_peak();
    let out = f();
    device.sync().unwrap();
    (alloc::peak().saturating_sub(before), out)
}

fn bf16<const D: usize>(dims: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::<D>::random(dims, Distribution::Normal(0.0, 1.0), device).cast(FloatDType::BF16)
}

/// The f32 working set of the products (models/columns/cpu.rs): the weight's
/// f32 copy `[C_out, K]` and one tile of each operand, `tile` output voxels
/// wide so that neither passes 4 MiB, plus 2 MiB for the GEMM's packing
/// scratch. `K` the column matrix's rows: `C·k` (`k` the kernel's voxels).
fn tiles(out_channels: usize, kernel: usize, voxels: usize) -> u64 {
    let rows = C * kernel;
    let tile = ((4usize << 20) / (4 * rows.max(out_channels))).clamp(16, voxels);
    ((out_channels * rows + (rows + out_channels) * tile) * 4 + (2 << 20)) as u64
}

#[test]
fn a_3x3x3_convolution_unfolds_27_channels_a_voxel_in_forward_and_backward() {
    let _one = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let device = Device::flex().autodiff();
    let voxels = (S * S * S) as u64;
    let columns = 27 * C as u64 * voxels * 2;
    let output = C as u64 * voxels * 2;
    // Warm the thread pool and the GEMM's scratch at this size.
    let warm =
        || conv3d(bf16([1, C, S, S, S], &device), bf16([C, C, 3, 3, 3], &device), bf16([C], &device), [1; 3], [1; 3]);
    drop(warm());

    let (x, w, b) = (
        bf16([1, C, S, S, S], &device).require_grad(),
        bf16([C, C, 3, 3, 3], &device).require_grad(),
        bf16([C], &device).require_grad(),
    );
    let (fwd, y) = working_set(&device, || conv3d(x.clone(), w.clone(), b.clone(), [1; 3], [1; 3]));
    let dy = bf16([1, C, S, S, S], &device);
    let (bwd, grads) = working_set(&device, || (y * dy).sum().backward());
    drop(grads);
    eprintln!("forward {fwd} B, backward {bwd} B; column buffer {columns} B, output {output} B");
    // Forward: the buffer and the output; backward: the buffer again beside
    // the input's gradient and the product's operand.
    assert!(fwd >= columns + output, "forward peaked {fwd} B: less than the column buffer and the output");
    assert!(
        fwd <= columns + output + tiles(C, 27, S * S * S),
        "forward peaked {fwd} B: more than the buffer, the output and the tiles"
    );
    assert!(bwd >= columns + output, "backward peaked {bwd} B: less than a column buffer and the input's gradient");
    assert!(bwd <= 2 * columns, "backward peaked {bwd} B: two column buffers at once");
}

#[test]
fn a_plain_1x1x1_convolution_needs_no_column_buffer() {
    let _one = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let device = Device::flex();
    let voxels = (S1 * S1 * S1) as u64;
    let (x, w, b) = (bf16([1, C, S1, S1, S1], &device), bf16([2 * C, C, 1, 1, 1], &device), bf16([2 * C], &device));
    drop(conv3d(x.clone(), w.clone(), b.clone(), [1; 3], [0; 3]));
    let (fwd, _y) = working_set(&device, || conv3d(x, w, b, [1; 3], [0; 3]));
    let output = 2 * C as u64 * voxels * 2;
    eprintln!("1x1x1 forward {fwd} B, output {output} B");
    // A column buffer (the input again, 2 bytes a channel and voxel) would pass the bound.
    assert!(fwd >= output, "1x1x1 forward peaked {fwd} B for a {output} B output");
    assert!(
        fwd <= output + tiles(2 * C, 1, S1 * S1 * S1),
        "1x1x1 forward peaked {fwd} B: more than its output and tiles"
    );
}
