//! MambaDiff (the group's LaMamba-Diff U-Net, `facts::mamba`): stages of
//! blocks, each block an SS2D (six-direction selective scan), a shifted-window
//! attention and an FFN, every sub-layer adaLN-modulated and gated.
//!
//! What one block keeps for backward, per token of its stage (C the width,
//! E = `int(ssm_ratio x C)` the SS2D inner width, K = 6 scan directions, R the
//! dt rank, N the state, H the FFN width), read from `ModeS7/AIS4900_master`
//! `src/medgen/models/mamba_diff.py@0d7f625:120-154` and
//! `src/medgen/models/mamba_blocks.py@0d7f625:228-319,501-552`, under bf16
//! autocast:
//!
//! - wide (fp32: norms run in f32, the residual stream is f32): the three
//!   LayerNorms' inputs and normalised outputs (the modulation multiplies
//!   them), 6C; the scan's `delta`, K·E (`dt_out` is allocated in the block
//!   input's dtype, f32, `:276`); the merged scan output, E, and its product
//!   with SiLU(z), E (`out_norm`'s input, `:313-315`);
//! - f32 whatever the precision: the scan's `u`, the K directions'
//!   `.float()` copies of the bf16 stack (K·E, `:297`; in fp32 they are the
//!   stack itself), B and C (2KN, `:300-301`), the LayerNorms' row statistics
//!   (4 norms x 8 bytes), and the selective scan's saved state (mamba_ssm's
//!   `SelectiveScanFn` without `z` saves u, delta, A, B, C, D, delta_bias and
//!   its chunk states x, per direction E x ceil(L / 2048) chunks x 2N f32);
//! - half (the matmul type): in_proj's cast (C), the depthwise conv's
//!   contiguous input and its output, SiLU's input (2E, `:249-254`), the
//!   stacked scans x_proj reads (K·E, `:257-264`), x_dbl, read by the dt
//!   einsum and sliced for B and C (K(R + 2N)), z's copy and SiLU(z) (2E,
//!   `:314`), out_proj's cast (E), the three sub-layers' outputs the gates
//!   multiply (3C), fc1's cast (C), fc1's output and GELU's (2H);
//! - per *padded* token of the window attention (each grid side padded up to
//!   a multiple of the window, `mamba_blocks.py@0d7f625:349-363`): qkv's cast
//!   of the windowed copy (C), qkv (3C, kept as the views q, k, v), the
//!   output's re-layout copy proj reads (C);
//! - the attention scores, materialised by `q @ k.T` (`:531`): heads x w³
//!   elements per padded token, kept as the f32 softmax output (the f32 bias
//!   added to bf16 scores promotes them) and its bf16 cast for `attn @ v`,
//!   6 bytes an element under autocast, which is what the fitted
//!   `score_saved_bytes` x `score_scale` stands for (5.98 fitted on MONAI's
//!   materialised attention); `score_transient_bytes` likewise for their
//!   gradients while the attention's backward runs.
//!
//! Under autocast that is 6C + (K + 2)E wide, (K + 5)E + 5C + K(R + 2N) + 2H
//! half, KE + 2KN f32 a token: about 207C bytes for the group's ratios (E =
//! 2C, H = 4C), beside 5C half a padded token and 6·heads·w³ bytes of scores.
//!
//! Checkpointing (`training.gradient_checkpointing`) wraps every block of
//! every stage, encoder, bottleneck and decoder (`mamba_diff.py@0d7f625:242-248,448-453`):
//! a block then keeps its f32 input and is recomputed whole at its backward;
//! the downsamples, upsamples and projections between stages are not wrapped
//! and keep their casts and their LayerNorms' f32 inputs. Each encoder stage's
//! output is held for the decoder's skip add (`:501-515`): where a transition
//! follows it the transition's segment holds it (until the decoder's backward
//! its gradient, the same size, takes its place); where none does it is the
//! next block's input, counted there.

use super::dit::{head_seg, Stage};
use super::{PrecheckError, Seg, Walk};
use facts::mamba::{MambaPart, MambaSpec, Role, TransitionKind, SCAN_DIRECTIONS};
use facts::{Input, Spatial};

/// mamba_ssm's selective scan saves its state every 2048 steps of a sequence.
const SCAN_CHUNK: f64 = 2048.0;

/// Bytes one block of width `dim` on `grid` keeps for backward: in-block
/// activations (the walk's bytes, before `act_scale`) and score elements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct BlockBytes {
    pub activations: f64,
    pub score_elems: f64,
}

/// Tokens of `grid` once each side is padded to a multiple of `window`.
fn padded(grid: Spatial, window: u32) -> f64 {
    let w = window.max(1);
    grid.dims().iter().map(|&s| s.div_ceil(w) as f64 * w as f64).product()
}

/// What one block keeps (module docs), at the walk's precision.
pub(super) fn block_bytes(w: &Walk, m: &MambaSpec, dim: u32, grid: Spatial) -> BlockBytes {
    let i = m.inner(dim);
    let (c, e, r, h) = (dim as f64, i.ssm as f64, i.dt_rank as f64, i.mlp as f64);
    let (k, n) = (SCAN_DIRECTIONS as f64, m.ssm_d_state as f64);
    let (wide, half) = (w.dt.wide, w.dt.mm);
    let tokens = grid.voxels() as f64;
    // The scan's `u`: a copy of the half-type stack, or the f32 stack itself.
    let u_copies = if half < 4.0 { 4.0 * k * e } else { 0.0 };
    let f32_per_token = u_copies + 4.0 * 2.0 * k * n + 4.0 * 8.0 + 4.0 * k * e * 2.0 * n / SCAN_CHUNK;
    let per_token = wide * (6.0 * c + (k + 2.0) * e)
        + half * ((k + 5.0) * e + 5.0 * c + k * (r + 2.0 * n) + 2.0 * h)
        + f32_per_token;
    let padded_tokens = padded(grid, m.window_size);
    let heads = m.dims().map(|d| d.heads).unwrap_or(1) as f64;
    BlockBytes {
        activations: per_token * tokens + half * 5.0 * c * padded_tokens,
        score_elems: heads * i.window_tokens as f64 * padded_tokens,
    }
}

/// One block of width `dim` on `grid`: checkpointed, its f32 input kept and
/// the block recomputed at its backward; else everything it keeps.
fn block_seg(w: &Walk, m: &MambaSpec, (dim, grid): (u32, Spatial), level: usize, params: u64) -> Seg {
    let c = w.c;
    let b = block_bytes(w, m, dim, grid);
    let full = w.act(b.activations);
    let scores = w.batch * c.score_saved_bytes * w.dt.score_scale() * b.score_elems;
    let mut s = Seg::new("mamba blocks", Some(level));
    if w.ckpt {
        s.kept = w.exact(w.dt.wide * dim as f64 * grid.voxels() as f64);
        s.recompute = c.recompute_scale * w.batch * b.activations + scores;
    } else {
        s.kept = full;
        s.scores = scores;
    }
    s.transient = c.bwd_transient * full + w.batch * c.score_transient_bytes * w.dt.score_scale() * b.score_elems;
    s.params = params as f64;
    s
}

/// A transition on `grid` (its input's): the Linear's or conv's half-type
/// input and the LayerNorm's f32 input and statistics; in the encoder, the
/// stage output it reads, held for the decoder's skip add.
fn transition_seg(
    w: &Walk,
    (kind, from, to): (TransitionKind, u32, u32),
    (grid, stage): (Spatial, usize),
    role: Role,
) -> Seg {
    let (wide, half) = (w.dt.wide, w.dt.mm);
    let tokens_in = grid.voxels() as f64;
    let (name, tokens_out) = match kind {
        TransitionKind::Down => ("downsample", tokens_in / 8.0),
        TransitionKind::Project => ("channel projection", tokens_in),
        TransitionKind::Up => ("upsample", tokens_in * 8.0),
    };
    let mut s = Seg::new(name, Some(stage));
    s.kept = w.act(half * from as f64 * tokens_in + (wide * to as f64 + 8.0) * tokens_out);
    if kind == TransitionKind::Up {
        // The Linear's output before the voxel shuffle copies it.
        s.transient = w.act(half * to as f64 * tokens_out);
    }
    if role == Role::Encoder {
        s.skip = w.exact(wide * from as f64 * tokens_in);
    }
    s.params = facts::params::mamba_transition(kind, from as u64, to as u64) as f64;
    s
}

pub(super) fn walk(m: &MambaSpec, input: &Input, out_channels: u32, w: &mut Walk) -> Result<(), PrecheckError> {
    let d = m.dims()?;
    let cond = *d.stage_dims.last().unwrap_or(&0) as u64;
    let grid0 = input.spatial.div(m.patch_size.max(1));
    // The patch embed keeps its input's cast; its f32 output (+ positions) is the first block's input.
    let mut embed = Seg::new("patch embed", Some(0));
    embed.kept = w.exact(w.dt.mm * input.channels as f64 * input.spatial.voxels() as f64);
    w.push(embed);
    let mut role = Role::Encoder;
    for part in m.layout(input)? {
        match part {
            MambaPart::Blocks { role: r, stage, dim, blocks, grid } => {
                role = r;
                let params = facts::params::mamba_block(m, dim as u64, cond, d.heads as u64);
                let seg = block_seg(w, m, (dim, grid), stage, params);
                for _ in 0..blocks {
                    w.push(seg);
                }
            }
            MambaPart::Transition { kind, stage, from, to, grid } => {
                w.push(transition_seg(w, (kind, from, to), (grid, stage), role));
            }
        }
    }
    let d0 = d.stage_dims[0] as f64;
    let stage0 = Stage::dit(d0, d.heads as f64, grid0.voxels() as f64);
    w.push(head_seg(w, input, stage0, (m.patch_size as f64, out_channels as f64), Some(0)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precheck::{Calibration, Dtypes};
    use facts::Precision;

    fn l() -> MambaSpec {
        serde_json::from_value(serde_json::json!({"variant": "L", "patch_size": 4})).expect("Mamba-L")
    }

    fn with_walk<T>(precision: Precision, ckpt: bool, f: impl FnOnce(&mut Walk) -> T) -> T {
        let c = Calibration::builtin().coefficients("pytorch", Precision::Bf16Amp).expect("pytorch fit");
        let mut segs = Vec::new();
        let mut w = Walk { c: &c, dt: Dtypes::of(precision), batch: 1.0, ckpt, segs: &mut segs };
        f(&mut w)
    }

    #[test]
    fn a_stage_0_block_of_l_keeps_207c_bytes_a_token_and_its_window_scores() {
        // C = 256 on a 40x64x64 grid (no padding: 8 divides every side).
        let grid = Spatial::new(40, 64, 64);
        let b = with_walk(Precision::Bf16Amp, false, |w| block_bytes(w, &l(), 256, grid));
        let (c, e, tokens) = (256.0, 512.0, grid.voxels() as f64);
        let wide = 4.0 * (6.0 * c + 8.0 * e); // norms' inputs and outputs, delta, merge, product
        let half = 2.0 * (11.0 * e + 5.0 * c + 6.0 * 18.0 + 2.0 * 1024.0); // casts, conv, stack, x_dbl, z, gates, FFN
        let f32 = 4.0 * 6.0 * e + 4.0 * 12.0 + 32.0 + 4.0 * 6.0 * e * 2.0 / 2048.0; // u, B and C, stats, state
        let attention = 2.0 * 5.0 * c; // qkv's cast, qkv, the output's copy
        assert_eq!(b.activations, (wide + half + f32 + attention) * tokens);
        assert!(((wide + half + f32) / c - 207.0).abs() < 0.5, "{}", (wide + half + f32) / c);
        assert_eq!(b.score_elems, 16.0 * 512.0 * tokens);
    }

    #[test]
    fn the_window_attention_pads_the_grid_to_whole_windows() {
        // The bottleneck's 10x16x16 grid is attended as 16x16x16.
        assert_eq!(padded(Spatial::new(10, 16, 16), 8), 4096.0);
        let b = with_walk(Precision::Bf16Amp, false, |w| block_bytes(w, &l(), 1024, Spatial::new(10, 16, 16)));
        assert_eq!(b.score_elems, 16.0 * 512.0 * 4096.0);
    }

    #[test]
    fn in_fp32_the_scan_reads_the_stack_itself() {
        let grid = Spatial::new(8, 8, 8);
        let amp = with_walk(Precision::Bf16Amp, false, |w| block_bytes(w, &l(), 256, grid));
        let fp32 = with_walk(Precision::Fp32, false, |w| block_bytes(w, &l(), 256, grid));
        let tokens = 512.0;
        // fp32: every half entry doubles, the u copies (4·K·E) go.
        let half_elems = 11.0 * 512.0 + 5.0 * 256.0 + 6.0 * 18.0 + 2.0 * 1024.0 + 5.0 * 256.0;
        assert_eq!(fp32.activations - amp.activations, (2.0 * half_elems - 4.0 * 6.0 * 512.0) * tokens);
    }

    #[test]
    fn checkpointed_blocks_keep_their_f32_input_and_the_stage_outputs_are_held_once() {
        let input = Input { channels: 2, spatial: Spatial::new(160, 256, 256) };
        let segs = with_walk(Precision::Bf16Amp, true, |w| {
            walk(&l(), &input, 1, w).unwrap();
            w.segs.clone()
        });
        // Embed, 2+2+2+2 encoder, 2 downsamples, 2 bottleneck, 3x4 decoder, 2 upsamples, head.
        assert_eq!(segs.len(), 1 + 8 + 2 + 2 + 12 + 2 + 1);
        assert_eq!(segs[1].kept, 4.0 * 256.0 * 40.0 * 64.0 * 64.0);
        assert!(segs[1].recompute > 10.0 * segs[1].kept);
        let skips: Vec<f64> = segs.iter().filter(|s| s.skip > 0.0).map(|s| s.skip).collect();
        // Stages 0 and 1 before their downsamples; stages 2 and 3 are the next blocks' inputs.
        assert_eq!(skips, vec![4.0 * 256.0 * 163_840.0, 4.0 * 512.0 * 20_480.0]);
    }
}
