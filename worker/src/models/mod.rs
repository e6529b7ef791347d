//! The four model families in Burn, built from the shared spec types.
//!
//! Every model here must report exactly `facts::params::count` parameters: the
//! precheck predicts from that count, and a measured run is only comparable with
//! its prediction when both describe the same network. The tests beside each
//! family hold the two together on tiny configs.
//!
//! Layouts follow the upstream code the research group profiled (MONAI
//! `DiffusionModelUNet`, DiT, an hourglass DiT, U-ViT); the domain notes are summarised in the README.
//! Attention ([`attention`]): the transformer families run a memory-efficient
//! kernel as PyTorch's SDPA does (q, k, v, the output and the row
//! log-sum-exp kept for backward; scores only in small chunks in the compute
//! dtype, never N x N); MONAI's UNet attention materialises its
//! B x heads x N x N scores, as MONAI's does. `--attention materialised`
//! runs the transformers through Burn's decomposed attention instead.
//! Norms and SiLU keep what PyTorch's autograd keeps ([`ops`], under autocast).

pub mod amp;
pub mod attention;
pub mod checkpoint;
pub mod columns;
pub mod dit;
pub mod hdit;
pub mod ops;
pub mod unet;
pub mod uvit;

use burn::module::Param;
use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::gelu;
use facts::{Input, ModelSpec};

use amp::{silu, AutocastForward};
use attention::{scaled_dot_product, AttentionKernel, Heads};
use checkpoint::Tape;

/// Why a spec cannot be built into a model.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("invalid spec: {0}")]
    Spec(#[from] facts::Invalid),
    #[error("{0}")]
    Shape(String),
    #[error("the worker has no {0} model: MambaDiff is planned and predicted by the orchestrator, not built here")]
    NoWorkerModel(facts::model::Family),
}

/// One model of any family, so the runner handles them alike.
// One model lives per run, so the variants' sizes do not matter; and Burn's
// `Module` derive has no implementation for `Box<M>` to shrink the UNet's.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Model {
    Unet(unet::Unet),
    Dit(dit::Dit),
    Hdit(hdit::Hdit),
    Uvit(uvit::Uvit),
}

impl Model {
    /// Build `spec` for inputs of shape `input` on `device` (weights allocated
    /// there). `attention` is the transformer families' kernel; the UNet's
    /// attention is always materialised, as MONAI's is.
    pub fn build(
        spec: &ModelSpec,
        input: &Input,
        out_channels: u32,
        attention: AttentionKernel,
        device: &Device,
    ) -> Result<Model, BuildError> {
        Ok(match spec {
            ModelSpec::Unet(u) => Model::Unet(unet::Unet::new(u, input, out_channels, device)?),
            ModelSpec::Dit(m) => Model::Dit(dit::Dit::new(m, input, out_channels, attention, device)?),
            ModelSpec::Hdit(m) => Model::Hdit(hdit::Hdit::new(m, input, out_channels, attention, device)?),
            ModelSpec::Uvit(m) => Model::Uvit(uvit::Uvit::new(m, input, attention, device)?),
            ModelSpec::Mamba(_) => return Err(BuildError::NoWorkerModel(spec.family())),
        })
    }

    /// The kernel of this model's attention layers (every family has some:
    /// the UNet's middle block always attends).
    pub fn attention(&self) -> AttentionKernel {
        match self {
            Model::Unet(_) => AttentionKernel::Materialised,
            Model::Dit(m) => m.attention(),
            Model::Hdit(m) => m.attention(),
            Model::Uvit(m) => m.attention(),
        }
    }

    /// Noise prediction for `x` `[B, C, D, H, W]` at diffusion timesteps `t`
    /// (one per sample). The transformer families checkpoint each block on
    /// `tape` when it is on; the UNet never does (MONAI's has no such hooks).
    pub fn forward<'a>(&'a self, x: Tensor<5>, t: &[f32], tape: &mut Tape<'a>) -> Tensor<5> {
        match self {
            Model::Unet(m) => m.forward(x, t, tape),
            Model::Dit(m) => m.forward(x, t, tape),
            Model::Hdit(m) => m.forward(x, t, tape),
            Model::Uvit(m) => m.forward(x, t, tape),
        }
    }
}

/// Sinusoidal timestep embedding `[B, dim]` (cos half then sin half, as MONAI and
/// DiT compute it). Computed on the host: it has no parameters and is tiny.
pub fn timestep_embedding(t: &[f32], dim: usize, device: &Device) -> Tensor<2> {
    let half = dim / 2;
    let max_period = 10_000f64;
    let mut data = Vec::with_capacity(t.len() * dim);
    for &ts in t {
        let args: Vec<f64> =
            (0..half).map(|i| ts as f64 * (-(max_period.ln()) * i as f64 / half as f64).exp()).collect();
        data.extend(args.iter().map(|a| a.cos() as f32));
        data.extend(args.iter().map(|a| a.sin() as f32));
        if dim % 2 == 1 {
            data.push(0.0);
        }
    }
    Tensor::from_data(TensorData::new(data, [t.len(), dim]), device)
}

/// Linear layer with bias from `i` to `o` features.
pub(crate) fn linear(i: usize, o: usize, device: &Device) -> Linear {
    LinearConfig::new(i, o).init(device)
}

/// LayerNorm without affine parameters over the last dim (DiT's
/// `elementwise_affine=False`), in f32 under autocast, saving what PyTorch's does.
pub(crate) fn layer_norm_plain(x: Tensor<3>, eps: f64) -> Tensor<3> {
    let x = amp::to_f32(x);
    if amp::torch_saved() {
        let [.., h] = x.dims();
        let device = x.device();
        let (gamma, beta) = (Tensor::ones([h], &device), Tensor::zeros([h], &device));
        return ops::layer_norm(x, gamma, beta, eps);
    }
    let (var, mean) = x.clone().var_mean_bias(2);
    (x - mean).div(var.add_scalar(eps).sqrt())
}

/// `x * (1 + scale) + shift`, with per-sample `[B, h]` shift and scale.
pub(crate) fn modulate(x: Tensor<3>, shift: Tensor<2>, scale: Tensor<2>) -> Tensor<3> {
    amp::add(amp::mul(x, scale.unsqueeze_dim::<3>(1).add_scalar(1.0)), shift.unsqueeze_dim::<3>(1))
}

/// The residual `x + gate * y`, gate `[B, h]` per sample, with type promotion.
pub(crate) fn gated_residual(x: Tensor<3>, gate: Tensor<2>, y: Tensor<3>) -> Tensor<3> {
    amp::add(x, amp::mul(gate.unsqueeze_dim::<3>(1), y))
}

/// An affine `LayerNorm(width, eps)` over the last dim, in f32 under autocast
/// (as PyTorch's autocast runs `layer_norm`), keeping what PyTorch's keeps.
#[derive(Module, Debug)]
pub struct Norm {
    gamma: Param<Tensor<1>>,
    beta: Param<Tensor<1>>,
    #[module(skip)]
    eps: f64,
}

impl Norm {
    pub fn new(width: usize, eps: f64, device: &Device) -> Self {
        Self {
            gamma: Param::from_tensor(Tensor::ones([width], device)),
            beta: Param::from_tensor(Tensor::zeros([width], device)),
            eps,
        }
    }

    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let x = amp::to_f32(x);
        if amp::torch_saved() {
            return ops::layer_norm(x, self.gamma.val(), self.beta.val(), self.eps);
        }
        let last = D - 1;
        let (var, mean) = x.clone().var_mean_bias(last);
        let y = (x - mean).div(var.add_scalar(self.eps).sqrt());
        let shape = |t: Tensor<1>| {
            let mut dims = [1usize; D];
            dims[last] = t.dims()[0];
            t.reshape(dims)
        };
        y.mul(shape(self.gamma.val())).add(shape(self.beta.val()))
    }
}

/// The group's qk-norm: `LayerNorm(head_dim, eps=1e-6)` on q and on k
/// (`src/medgen/models/dit_blocks.py@3140d97:135-137,152-154`).
#[derive(Module, Debug)]
pub struct QkNorm {
    q: Norm,
    k: Norm,
}

impl QkNorm {
    pub fn new(head_dim: usize, device: &Device) -> Self {
        Self { q: Norm::new(head_dim, 1e-6, device), k: Norm::new(head_dim, 1e-6, device) }
    }
}

/// Multi-head self-attention of `[B, N, 3h]` packed q/k/v into `[B, N, h]`.
///
/// With `qk_norm`, q and k are normalised per head before attention (in f32:
/// each norm keeps an f32 copy of its input and its row statistics) and cast
/// back to the compute type, so they are contiguous `[B, heads, N, hd]`; the
/// attention output is then laid out like them, as SDPA lays its output out
/// like q, and the `[B, N, h]` the projection reads is a copy. Without it, q,
/// k and v stay views of the packed qkv and the output's re-layout is a view.
pub fn self_attention(qkv: Tensor<3>, heads: Heads, qk_norm: Option<&QkNorm>) -> Tensor<3> {
    let Heads { count: heads, kernel } = heads;
    let [b, n, h3] = qkv.dims();
    let h = h3 / 3;
    let hd = h / heads;
    // [B, N, 3, heads, hd] → three [B, heads, N, hd].
    let qkv = qkv.reshape([b, n, 3, heads, hd]).permute([2, 0, 3, 1, 4]);
    let qkv = qkv.reshape([3 * b, heads, n, hd]);
    let mut parts = qkv.chunk(3, 0);
    let v = parts.pop().expect("three chunks");
    let k = parts.pop().expect("three chunks");
    let q = parts.pop().expect("three chunks");
    let Some(norm) = qk_norm else {
        return scaled_dot_product(q, k, v, kernel).swap_dims(1, 2).reshape([b, n, h]);
    };
    let dtype = v.dtype();
    let (q, k) = (amp::to_dtype(norm.q.forward(q), dtype), amp::to_dtype(norm.k.forward(k), dtype));
    let out = attention::scaled_dot_product_like_q(q, k, v, kernel);
    out.swap_dims(1, 2).reshape([b, n, h])
}

/// Attention of separate q, k, v `[B, N, C]` with `heads` heads (MONAI's UNet attention: materialised).
pub(crate) fn attention_qkv(q: Tensor<3>, k: Tensor<3>, v: Tensor<3>, heads: usize) -> Tensor<3> {
    let [b, n, c] = q.dims();
    let split = |x: Tensor<3>| x.reshape([b, n, heads, c / heads]).swap_dims(1, 2);
    let out = scaled_dot_product(split(q), split(k), split(v), AttentionKernel::Materialised);
    out.swap_dims(1, 2).reshape([b, n, c])
}

/// Timestep MLP of the transformer families: sinusoidal(256) → h → h.
#[derive(Module, Debug)]
pub struct TimeMlp {
    fc1: Linear,
    fc2: Linear,
}

impl TimeMlp {
    pub fn new(h: usize, device: &Device) -> Self {
        Self { fc1: linear(facts::params::TIME_FREQ_DIM as usize, h, device), fc2: linear(h, h, device) }
    }
    pub fn forward(&self, t: &[f32], device: &Device) -> Tensor<2> {
        let emb = timestep_embedding(t, facts::params::TIME_FREQ_DIM as usize, device);
        self.fc2.amp(silu(self.fc1.amp(emb)))
    }
}

/// The group's DiT block (DiT, HDiT): adaLN-Zero conditioning and qk-norm,
/// 18h² + 15h + 4·head_dim parameters (`facts::params::dit_block`).
#[derive(Module, Debug)]
pub struct DitBlock {
    qkv: Linear,
    qk_norm: QkNorm,
    proj: Linear,
    fc1: Linear,
    fc2: Linear,
    ada_ln: Linear,
    #[module(skip)]
    heads: Heads,
}

impl DitBlock {
    pub fn new(h: usize, heads: Heads, device: &Device) -> Self {
        Self {
            qkv: linear(h, 3 * h, device),
            qk_norm: QkNorm::new(h / heads.count.max(1), device),
            proj: linear(h, h, device),
            fc1: linear(h, 4 * h, device),
            fc2: linear(4 * h, h, device),
            ada_ln: linear(h, 6 * h, device),
            heads,
        }
    }

    /// `x` `[B, N, h]` conditioned on `c` `[B, h]`.
    pub fn forward(&self, x: Tensor<3>, c: Tensor<2>) -> Tensor<3> {
        let m = self.ada_ln.amp(silu(c)).chunk(6, 1);
        let [shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp]: [Tensor<2>; 6] =
            m.try_into().expect("six chunks");
        let h = modulate(layer_norm_plain(x.clone(), 1e-6), shift_msa, scale_msa);
        let attn = self.proj.amp(self_attention(self.qkv.amp(h), self.heads, Some(&self.qk_norm)));
        let x = gated_residual(x, gate_msa, attn);
        let h = modulate(layer_norm_plain(x.clone(), 1e-6), shift_mlp, scale_mlp);
        let mlp = self.fc2.amp(gelu(self.fc1.amp(h)));
        gated_residual(x, gate_mlp, mlp)
    }
}

/// DiT final layer: adaLN (shift, scale) and the per-token patch projection.
#[derive(Module, Debug)]
pub struct FinalLayer {
    ada_ln: Linear,
    proj: Linear,
}

impl FinalLayer {
    pub fn new(h: usize, patch: usize, out: usize, device: &Device) -> Self {
        Self { ada_ln: linear(h, 2 * h, device), proj: linear(h, patch.pow(3) * out, device) }
    }
    pub fn forward(&self, x: Tensor<3>, c: Tensor<2>) -> Tensor<3> {
        let mut m = self.ada_ln.amp(silu(c)).chunk(2, 1);
        let scale = m.pop().expect("two chunks");
        let shift = m.pop().expect("two chunks");
        self.proj.amp(modulate(layer_norm_plain(x, 1e-6), shift, scale))
    }
}

/// Token grid of a patch embedding: (D/p, H/p, W/p).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    pub d: usize,
    pub h: usize,
    pub w: usize,
}

impl Grid {
    pub fn tokens(&self) -> usize {
        self.d * self.h * self.w
    }
    /// The grid `patch` cuts `input` into; an error when it does not divide.
    pub fn of(input: &Input, patch: u32) -> Result<Grid, BuildError> {
        let [d, h, w] = input.spatial.dims();
        if patch == 0 || d % patch != 0 || h % patch != 0 || w % patch != 0 {
            return Err(BuildError::Shape(format!("patch {patch} does not divide the input {d}x{h}x{w} (D x H x W)")));
        }
        let p = patch as usize;
        Ok(Grid { d: d as usize / p, h: h as usize / p, w: w as usize / p })
    }
    /// The grid after a 2x2x2 merge; an error when a side is odd.
    pub fn halve(&self) -> Result<Grid, BuildError> {
        if !self.d.is_multiple_of(2) || !self.h.is_multiple_of(2) || !self.w.is_multiple_of(2) {
            return Err(BuildError::Shape(format!(
                "token grid {}x{}x{} cannot be merged 2x2x2",
                self.d, self.h, self.w
            )));
        }
        Ok(Grid { d: self.d / 2, h: self.h / 2, w: self.w / 2 })
    }
}

/// `[B, h, Dp, Hp, Wp]` (a patch-embedding conv's output) as tokens `[B, N, h]`.
pub(crate) fn to_tokens(x: Tensor<5>) -> Tensor<3> {
    let [b, h, d, hh, w] = x.dims();
    x.reshape([b, h, d * hh * w]).swap_dims(1, 2)
}

/// Tokens `[B, N, p³·C]` (last dim ordered c, pd, ph, pw) back to `[B, C, D, H, W]`.
/// Done in two rank-≤6 permutes, the most any Burn CPU backend is happy with.
pub(crate) fn unpatchify(x: Tensor<3>, g: Grid, patch: usize, c: usize) -> Tensor<5> {
    let [b, _, _] = x.dims();
    let p = patch;
    // [B, N, C, p³] → [B, C, N, p³]
    let x = x.reshape([b, g.tokens(), c, p * p * p]).swap_dims(1, 2);
    // [B·C, Dp, Hp, Wp, pd, ph·pw] → [B·C, Dp, pd, Hp, Wp, ph·pw]
    let x = x.reshape([b * c, g.d, g.h, g.w, p, p * p]).permute([0, 1, 4, 2, 3, 5]);
    // [B·C·D, Hp, Wp, ph, pw] → [B·C·D, Hp, ph, Wp, pw]
    let x = x.reshape([b * c * g.d * p, g.h, g.w, p, p]).permute([0, 1, 3, 2, 4]);
    x.reshape([b, c, g.d * p, g.h * p, g.w * p])
}

/// Merge 2x2x2 neighbouring tokens: `[B, N, h]` on grid `g` → `[B, N/8, 8h]`.
pub(crate) fn merge_tokens(x: Tensor<3>, g: Grid) -> Tensor<3> {
    let [b, _, h] = x.dims();
    x.reshape([b * g.d / 2, 2, g.h / 2, 2, g.w / 2, 2 * h]).permute([0, 2, 4, 1, 3, 5]).reshape([
        b,
        g.tokens() / 8,
        8 * h,
    ])
}

/// Inverse of [`merge_tokens`]: `[B, N/8, 8h]` → `[B, N, h]` on grid `g`.
pub(crate) fn split_tokens(x: Tensor<3>, g: Grid) -> Tensor<3> {
    let [b, _, h8] = x.dims();
    let h = h8 / 8;
    x.reshape([b * g.d / 2, g.h / 2, g.w / 2, 2, 2, 2 * h]).permute([0, 3, 1, 4, 2, 5]).reshape([b, g.tokens(), h])
}

/// A learned (or fixed) table `[rows, h]` as a parameter.
pub(crate) fn table(rows: usize, h: usize, device: &Device) -> Param<Tensor<2>> {
    Param::from_tensor(Tensor::random([rows, h], burn::tensor::Distribution::Normal(0.0, 0.02), device))
}

/// DiT's fixed 3D sin-cos position table `[tokens, h]` (stored as a parameter,
/// as DiT does; it counts towards the parameters).
pub(crate) fn sincos_table(g: Grid, h: usize, device: &Device) -> Tensor<2> {
    // h split over the three axes in even-sized sin/cos pairs; the remainder is zero.
    let per_axis = (h / 6) * 2;
    let mut data = vec![0f32; g.tokens() * h];
    for (i, row) in data.chunks_mut(h).enumerate() {
        let pos = [i / (g.h * g.w), (i / g.w) % g.h, i % g.w];
        for (a, &p) in pos.iter().enumerate() {
            let half = per_axis / 2;
            for k in 0..half {
                let omega = 1.0 / 10_000f64.powf(k as f64 / half.max(1) as f64);
                let v = p as f64 * omega;
                row[a * per_axis + k] = v.sin() as f32;
                row[a * per_axis + half + k] = v.cos() as f32;
            }
        }
    }
    Tensor::from_data(TensorData::new(data, [g.tokens(), h]), device)
}

#[cfg(test)]
pub(crate) mod test_util {
    use burn::prelude::*;

    pub fn device() -> Device {
        Device::flex()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use facts::{DitSpec, HditSpec, Spatial, UvitSpec, Variant};

    /// Every named variant of the papers, at a small volume (parameters are
    /// initialised lazily, so counting them allocates little).
    #[test]
    fn named_variants_match_spec_counts() {
        let device = test_util::device();
        let input = Input { channels: 1, spatial: Spatial::new(8, 8, 8) };
        let mut specs = Vec::new();
        for v in [Variant::S, Variant::B, Variant::L, Variant::XL] {
            specs.push(ModelSpec::Dit(DitSpec { variant: Some(v), hidden: None, heads: None, depth: None, patch: 4 }));
            specs.push(ModelSpec::Hdit(HditSpec {
                variant: Some(v),
                hidden: None,
                heads: None,
                patch: 2,
                level_depths: vec![2, 4, 6, 4, 2],
            }));
        }
        for v in [Variant::S, Variant::SDeep, Variant::M, Variant::L] {
            specs.push(ModelSpec::Uvit(UvitSpec {
                variant: Some(v),
                hidden: None,
                heads: None,
                depth: None,
                patch: 4,
            }));
        }
        for spec in specs {
            let expected = facts::params::count(&spec, &input, 1).unwrap();
            let model = Model::build(&spec, &input, 1, AttentionKernel::MemoryEfficient, &device).unwrap();
            assert_eq!(model.num_params() as u64, expected, "{}", spec.summary());
        }
    }

    /// The worker has no MambaDiff: a Mamba config is refused at build, with the reason, not a panic.
    #[test]
    fn a_mamba_config_is_refused_at_build_with_the_reason() {
        let device = test_util::device();
        let input = Input { channels: 2, spatial: Spatial::new(16, 16, 16) };
        let mamba: ModelSpec =
            serde_json::from_value(serde_json::json!({"family": "mamba", "variant": "S", "patch_size": 2})).unwrap();
        let err = Model::build(&mamba, &input, 1, AttentionKernel::MemoryEfficient, &device).unwrap_err();
        assert!(matches!(err, BuildError::NoWorkerModel(facts::model::Family::Mamba)), "{err}");
        assert!(err.to_string().starts_with("the worker has no mamba model"), "{err}");
    }

    #[test]
    fn merge_then_split_is_identity() {
        let device = test_util::device();
        let g = Grid { d: 2, h: 4, w: 2 };
        let x = Tensor::<3>::random([1, g.tokens(), 3], burn::tensor::Distribution::Default, &device);
        let back = split_tokens(merge_tokens(x.clone(), g), g);
        back.into_data().assert_eq(&x.into_data(), true);
    }

    #[test]
    fn unpatchify_inverts_patch_layout() {
        // A volume whose value is its linear index, cut into 2x2x2 patches by hand.
        let device = test_util::device();
        let (d, h, w, p) = (2usize, 4usize, 2usize, 2usize);
        let g = Grid { d: d / p, h: h / p, w: w / p };
        let mut tokens = vec![0f32; g.tokens() * p * p * p];
        for t in 0..g.tokens() {
            let (td, th, tw) = (t / (g.h * g.w), (t / g.w) % g.h, t % g.w);
            for k in 0..p * p * p {
                let (pd, ph, pw) = (k / (p * p), (k / p) % p, k % p);
                let (z, y, x) = (td * p + pd, th * p + ph, tw * p + pw);
                tokens[t * p * p * p + k] = ((z * h + y) * w + x) as f32;
            }
        }
        let x = Tensor::<3>::from_data(TensorData::new(tokens, [1, g.tokens(), p * p * p]), &device);
        let vol = unpatchify(x, g, p, 1);
        let expected: Vec<f32> = (0..d * h * w).map(|i| i as f32).collect();
        vol.into_data().assert_eq(&TensorData::new(expected, [1, 1, d, h, w]), true);
    }
}
