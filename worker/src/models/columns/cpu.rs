//! The native 3D convolution on the CPU backend: the column buffer as a real
//! allocation, the products in f32 tiles.
//!
//! Per batch element (as PyTorch's kernel loops), with `K = C·kd·kh·kw` rows
//! and `V` output voxels:
//! - forward: `cols[K, V] = vol2col(x)`, `y[C_out, V] = W[C_out, K] · cols + b`;
//! - input's gradient: `gcols[K, V] = Wᵀ · dy`, `dx = col2vol(gcols)`;
//! - weight's gradient: `cols = vol2col(x)` again, `dW += dy · colsᵀ`.
//!
//! Each buffer lives for its step only, one at a time, as in PyTorch. A
//! 1x1x1 kernel at stride 1 without padding reads the input as its column
//! matrix and writes the input's gradient directly. The f32 tiles the products
//! run on are bounded by [`TILE_BYTES`] (the weight's f32 copy, `C_out·K`,
//! besides: at most 28 MB for a 512-wide 3x3x3 convolution).

use super::Steps;
use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{bf16, f16, Bytes, DType, Element, Shape};
use rayon::prelude::*;

/// The most bytes one f32 tile of a product's operand takes.
const TILE_BYTES: usize = 4 << 20;

/// An element the kernels read and write (the models' float types).
trait Elem: bytemuck::Pod + Element + Send + Sync {
    fn f32(self) -> f32;
    fn of(v: f32) -> Self;
}

impl Elem for f32 {
    fn f32(self) -> f32 {
        self
    }
    fn of(v: f32) -> Self {
        v
    }
}

impl Elem for bf16 {
    fn f32(self) -> f32 {
        self.to_f32()
    }
    fn of(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl Elem for f16 {
    fn f32(self) -> f32 {
        self.to_f32()
    }
    fn of(v: f32) -> Self {
        f16::from_f32(v)
    }
}

/// The shapes of one convolution.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    batch: usize,
    channels: usize,
    out_channels: usize,
    input: [usize; 3],
    kernel: [usize; 3],
    stride: [usize; 3],
    padding: [usize; 3],
    output: [usize; 3],
}

impl Geometry {
    fn new(x: &Shape, w: &Shape, Steps { stride, padding }: Steps) -> Geometry {
        assert_eq!(x[1], w[1], "native conv3d: input channels {} against the weight's {} (groups 1)", x[1], w[1]);
        let (input, kernel) = ([x[2], x[3], x[4]], [w[2], w[3], w[4]]);
        let output = std::array::from_fn(|i| (input[i] + 2 * padding[i] - kernel[i]) / stride[i] + 1);
        Geometry { batch: x[0], channels: x[1], out_channels: w[0], input, kernel, stride, padding, output }
    }
    fn kernel_voxels(&self) -> usize {
        self.kernel.iter().product()
    }
    /// Rows of the column matrix: `C·kd·kh·kw`.
    fn rows(&self) -> usize {
        self.channels * self.kernel_voxels()
    }
    fn out_voxels(&self) -> usize {
        self.output.iter().product()
    }
    fn in_voxels(&self) -> usize {
        self.input.iter().product()
    }
    /// Whether the input must be unfolded (PyTorch skips it for a plain 1x1x1).
    fn needs_columns(&self) -> bool {
        self.kernel != [1; 3] || self.stride != [1; 3] || self.padding != [0; 3]
    }
    /// Output voxels a tile of a product spans.
    fn tile(&self) -> usize {
        let widest = self.rows().max(self.out_channels).max(1);
        (TILE_BYTES / (4 * widest)).clamp(16, self.out_voxels().max(16))
    }
    /// The input coordinate kernel offset `k` reads for output `o` along `axis`.
    fn source(&self, axis: usize, o: usize, k: usize) -> Option<usize> {
        (o * self.stride[axis] + k).checked_sub(self.padding[axis]).filter(|&i| i < self.input[axis])
    }
    /// The output coordinate whose kernel offset `k` reads input `i` along `axis`.
    fn target(&self, axis: usize, i: usize, k: usize) -> Option<usize> {
        let t = (i + self.padding[axis]).checked_sub(k)?;
        (t % self.stride[axis] == 0).then_some(t / self.stride[axis]).filter(|&o| o < self.output[axis])
    }
}

fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.layout().contiguous_offsets().is_some() {
        t
    } else {
        t.to_contiguous()
    }
}

fn data<T: Elem>(t: &FlexTensor) -> &[T] {
    t.as_slice::<T>().expect("a contiguous tensor of the convolution's dtype")
}

fn tensor<T: Elem>(v: Vec<T>, shape: Shape) -> FlexTensor {
    FlexTensor::new(Bytes::from_elems(v), Layout::contiguous(shape), T::dtype())
}

/// Runs `$body` with `$T` the element type of `$dtype`.
macro_rules! typed {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::BF16 => {
                type $T = bf16;
                $body
            }
            DType::F16 => {
                type $T = f16;
                $body
            }
            other => panic!("native conv3d: no kernel for {other:?}"),
        }
    };
}

pub(super) fn forward(x: FlexTensor, w: FlexTensor, b: FlexTensor, steps: Steps) -> FlexTensor {
    let g = Geometry::new(x.layout().shape(), w.layout().shape(), steps);
    let (x, w, b) = (contiguous(x), contiguous(w), contiguous(b));
    typed!(x.dtype(), T => {
        let y = forward_typed::<T>(&g, data(&x), data(&w), data(&b));
        tensor(y, [g.batch, g.out_channels, g.output[0], g.output[1], g.output[2]].into())
    })
}

/// The input's gradient (`weight_grad` false: `x` only gives its shape) or
/// the weight's (true: `w` only gives its shape).
pub(super) fn grad(x: FlexTensor, w: FlexTensor, dy: FlexTensor, steps: Steps, weight_grad: bool) -> FlexTensor {
    let g = Geometry::new(x.layout().shape(), w.layout().shape(), steps);
    let dy = contiguous(dy);
    if weight_grad {
        let (shape, x) = (w.layout().shape().clone(), contiguous(x));
        typed!(dy.dtype(), T => tensor(grad_weight_typed::<T>(&g, data(&x), data(&dy)), shape))
    } else {
        let (shape, w) = (x.layout().shape().clone(), contiguous(w));
        typed!(dy.dtype(), T => tensor(grad_input_typed::<T>(&g, data(&w), data(&dy)), shape))
    }
}

fn forward_typed<T: Elem>(g: &Geometry, x: &[T], w: &[T], b: &[T]) -> Vec<T> {
    let (k, v, co) = (g.rows(), g.out_voxels(), g.out_channels);
    let w32: Vec<f32> = w.iter().map(|e| e.f32()).collect(); // [co, k]
    let mut y = vec![T::of(0.0); g.batch * co * v];
    let mut cols = g.needs_columns().then(|| vec![T::of(0.0); k * v]);
    let tile = g.tile();
    let (mut rhs, mut dst) = (vec![0f32; k * tile], vec![0f32; co * tile]);
    for n in 0..g.batch {
        let cols = column_matrix(g, &x[n * g.channels * g.in_voxels()..][..g.channels * g.in_voxels()], &mut cols);
        let y_n = &mut y[n * co * v..][..co * v];
        for start in (0..v).step_by(tile) {
            let len = tile.min(v - start);
            gather_rows(cols, v, start, len, &mut rhs[..k * len]);
            for (o, row) in dst[..co * len].chunks_mut(len).enumerate() {
                row.fill(b[o].f32());
            }
            let lhs = Mat { data: &w32, rows: co, cols: k, row_stride: k, col_stride: 1 };
            let rhs = Mat { data: &rhs[..k * len], rows: k, cols: len, row_stride: len, col_stride: 1 };
            multiply(&mut dst[..co * len], lhs, rhs, true);
            scatter_rows(&dst[..co * len], v, start, len, y_n);
        }
    }
    y
}

fn grad_input_typed<T: Elem>(g: &Geometry, w: &[T], dy: &[T]) -> Vec<T> {
    let (k, v, co, cv) = (g.rows(), g.out_voxels(), g.out_channels, g.channels * g.in_voxels());
    let w32: Vec<f32> = w.iter().map(|e| e.f32()).collect(); // [co, k]
    let mut dx = vec![T::of(0.0); g.batch * cv];
    let mut gcols = g.needs_columns().then(|| vec![T::of(0.0); k * v]);
    let tile = g.tile();
    let (mut rhs, mut dst) = (vec![0f32; co * tile], vec![0f32; k * tile]);
    for n in 0..g.batch {
        let dy_n = &dy[n * co * v..][..co * v];
        let dx_n = &mut dx[n * cv..][..cv];
        let target: &mut [T] = gcols.as_deref_mut().unwrap_or(dx_n);
        for start in (0..v).step_by(tile) {
            let len = tile.min(v - start);
            gather_rows(dy_n, v, start, len, &mut rhs[..co * len]);
            // Wᵀ: element (r, o) of [k, co] is w32[o·k + r].
            let lhs = Mat { data: &w32, rows: k, cols: co, row_stride: 1, col_stride: k };
            let rhs = Mat { data: &rhs[..co * len], rows: co, cols: len, row_stride: len, col_stride: 1 };
            multiply(&mut dst[..k * len], lhs, rhs, false);
            scatter_rows(&dst[..k * len], v, start, len, target);
        }
        if let Some(gcols) = gcols.as_deref() {
            col2vol(g, gcols, dx_n);
        }
    }
    dx
}

fn grad_weight_typed<T: Elem>(g: &Geometry, x: &[T], dy: &[T]) -> Vec<T> {
    let (k, v, co) = (g.rows(), g.out_voxels(), g.out_channels);
    let mut dw = vec![0f32; co * k];
    let mut cols = g.needs_columns().then(|| vec![T::of(0.0); k * v]);
    let tile = g.tile();
    let (mut lhs, mut rhs) = (vec![0f32; co * tile], vec![0f32; k * tile]);
    for n in 0..g.batch {
        let cols = column_matrix(g, &x[n * g.channels * g.in_voxels()..][..g.channels * g.in_voxels()], &mut cols);
        let dy_n = &dy[n * co * v..][..co * v];
        for start in (0..v).step_by(tile) {
            let len = tile.min(v - start);
            gather_rows(dy_n, v, start, len, &mut lhs[..co * len]);
            gather_rows(cols, v, start, len, &mut rhs[..k * len]);
            let a = Mat { data: &lhs[..co * len], rows: co, cols: len, row_stride: len, col_stride: 1 };
            // colsᵀ: element (t, r) of [len, k] is rhs[r·len + t].
            let b = Mat { data: &rhs[..k * len], rows: len, cols: k, row_stride: 1, col_stride: len };
            multiply(&mut dw, a, b, true);
        }
    }
    dw.into_iter().map(T::of).collect()
}

/// Batch element `x_n`'s column matrix: unfolded into `buf` when the
/// convolution needs a column buffer, else the input itself.
fn column_matrix<'a, T: Elem>(g: &Geometry, x_n: &'a [T], buf: &'a mut Option<Vec<T>>) -> &'a [T] {
    match buf {
        Some(buf) => {
            vol2col(g, x_n, buf);
            buf
        }
        None => x_n,
    }
}

/// Columns `start..start + len` of the row-major `[rows, width]` matrix `m`, as f32 `[rows, len]`.
fn gather_rows<T: Elem>(m: &[T], width: usize, start: usize, len: usize, out: &mut [f32]) {
    out.par_chunks_mut(len).enumerate().for_each(|(r, row)| {
        for (o, e) in row.iter_mut().zip(&m[r * width + start..][..len]) {
            *o = e.f32();
        }
    });
}

/// The f32 `[rows, len]` tile `t` into columns `start..` of the row-major `[rows, width]` matrix `m`.
fn scatter_rows<T: Elem>(t: &[f32], width: usize, start: usize, len: usize, m: &mut [T]) {
    m.par_chunks_mut(width).zip(t.par_chunks(len)).for_each(|(row, tile)| {
        for (o, &e) in row[start..start + len].iter_mut().zip(tile) {
            *o = T::of(e);
        }
    });
}

/// Unfold one batch element `x` `[C, D, H, W]` into `cols` `[C·kd·kh·kw, V]`.
fn vol2col<T: Elem>(g: &Geometry, x: &[T], cols: &mut [T]) {
    let (kv, iv, [_, o1, o2]) = (g.kernel_voxels(), g.in_voxels(), g.output);
    let [_, k1, k2] = g.kernel;
    let [_, i1, i2] = g.input;
    cols.par_chunks_mut(g.out_voxels()).enumerate().for_each(|(r, row)| {
        let (c, k) = (r / kv, r % kv);
        let (kd, kh, kw) = (k / (k1 * k2), k / k2 % k1, k % k2);
        let plane = &x[c * iv..][..iv];
        for (od, slab) in row.chunks_mut(o1 * o2).enumerate() {
            let id = g.source(0, od, kd);
            for (oh, line) in slab.chunks_mut(o2).enumerate() {
                let ih = id.and_then(|_| g.source(1, oh, kh));
                for (ow, e) in line.iter_mut().enumerate() {
                    *e = match (id, ih, g.source(2, ow, kw)) {
                        (Some(d), Some(h), Some(w)) => plane[(d * i1 + h) * i2 + w],
                        _ => T::of(0.0),
                    };
                }
            }
        }
    });
}

/// Fold `cols` `[C·kd·kh·kw, V]` back onto one batch element `dx` `[C, D, H, W]`:
/// each input voxel sums, in f32, what every kernel offset that read it wrote.
fn col2vol<T: Elem>(g: &Geometry, cols: &[T], dx: &mut [T]) {
    let (kv, v, [_, o1, o2]) = (g.kernel_voxels(), g.out_voxels(), g.output);
    let [k0, k1, k2] = g.kernel;
    let [_, i1, i2] = g.input;
    dx.par_chunks_mut(g.in_voxels()).enumerate().for_each(|(c, plane)| {
        let rows = &cols[c * kv * v..][..kv * v];
        for (i, e) in plane.iter_mut().enumerate() {
            let (id, ih, iw) = (i / (i1 * i2), i / i2 % i1, i % i2);
            let mut acc = 0f32;
            for kd in 0..k0 {
                let Some(od) = g.target(0, id, kd) else { continue };
                for kh in 0..k1 {
                    let Some(oh) = g.target(1, ih, kh) else { continue };
                    for kw in 0..k2 {
                        let Some(ow) = g.target(2, iw, kw) else { continue };
                        acc += rows[((kd * k1 + kh) * k2 + kw) * v + (od * o1 + oh) * o2 + ow].f32();
                    }
                }
            }
            *e = T::of(acc);
        }
    });
}

/// A strided f32 matrix view.
#[derive(Clone, Copy)]
struct Mat<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl Mat<'_> {
    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride < self.data.len()
    }
}

/// `dst = (accumulate ? dst : 0) + a · b`, `dst` row-major `[a.rows, b.cols]`.
fn multiply(dst: &mut [f32], a: Mat<'_>, b: Mat<'_>, accumulate: bool) {
    assert!(a.cols == b.rows && a.fits() && b.fits() && dst.len() == a.rows * b.cols, "native conv3d: product shapes");
    if a.rows == 0 || b.cols == 0 {
        return;
    }
    if a.cols == 0 {
        if !accumulate {
            dst.fill(0.0);
        }
        return;
    }
    // SAFETY: every index the product reads or writes is inside its slice
    // (`fits`, and `dst` is exactly `[a.rows, b.cols]` row-major); `dst`
    // does not alias `a` or `b` (it is borrowed mutably).
    unsafe {
        gemm::gemm(
            a.rows,
            b.cols,
            a.cols,
            dst.as_mut_ptr(),
            1,
            b.cols as isize,
            accumulate,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
}
