//! exp13 and exp14 against the group's DiT script: its latent and pixel grids,
//! each variant and patch, less the configs it never runs.

use orchestrator::sweep;

/// The group's DiT variants: (name, hidden, heads, depth), written by hand
/// from `src/medgen/models/dit.py@3140d97:26-31` (ModeS7/AIS4900_master);
/// the script runs all four (`misc/profile_dit_memory.py@3140d97:323`).
const VARIANTS: &[(&str, u32, u32, u32)] =
    &[("S", 384, 6, 12), ("B", 768, 12, 12), ("L", 1024, 16, 24), ("XL", 1152, 16, 28)];

/// The script's latent sizes, (in-plane size H = W, depth D):
/// `misc/profile_dit_memory.py@3140d97:49-57`.
const LATENT_SIZES: &[(u32, u32)] = &[(16, 10), (16, 20), (32, 20), (32, 40), (64, 40), (64, 80)];

/// The script's pixel sizes, (H = W, D): `misc/profile_dit_memory.py@3140d97:60-66`.
const PIXEL_SIZES: &[(u32, u32)] = &[(64, 40), (64, 80), (128, 80), (128, 160), (256, 160)];

/// Patch sizes, tried at every size: `misc/profile_dit_memory.py@3140d97:69`.
const PATCHES: &[u32] = &[2, 4, 8];

/// The script passes over a (size, patch) whose patch does not divide both
/// the in-plane size and the depth (`:102-103`, `:367-368`, `:396-397`) ...
fn divides(hw: u32, d: u32, patch: u32) -> bool {
    hw.is_multiple_of(patch) && d.is_multiple_of(patch)
}

/// ... and reports one over this many tokens "skipped" without a run
/// (`:136-143`; tokens = (D/p)(H/p)(W/p), `:98-99`).
const MAX_TOKENS: u64 = 1_000_000;

/// The (H = W, D, patch) the two rules leave out, worked out by hand: four
/// latent ones the patch does not divide, one pixel one over 1M tokens.
const LATENT_NOT_RUN: &[(u32, u32, u32)] = &[(16, 10, 4), (16, 10, 8), (16, 20, 8), (32, 20, 8)];
const PIXEL_NOT_RUN: &[(u32, u32, u32)] = &[(256, 160, 2)];

/// The script's `--channels 1` (launcher `IDUN/profiling/profile_dit_memory.slurm@0ee6133:34`)
/// is the model's input; no `out_channels` (`:154-163`) means as many out
/// (`dit.py@3140d97:93-94`); `model(x, t)` passes no conditioning to concatenate (`:184`).
const CHANNELS: (u32, u32) = (1, 1);

/// One expected config: name, variant, (hidden, heads, depth), patch, [D, H, W].
type Expected = (String, String, (u32, u32, u32), u32, [u32; 3]);

/// The script's configs over `sizes`, less `not_run`; each rule above is
/// checked to leave out exactly `not_run`.
fn script_configs(sizes: &[(u32, u32)], not_run: &[(u32, u32, u32)]) -> Vec<Expected> {
    let mut out = Vec::new();
    for &(variant, hidden, heads, depth) in VARIANTS {
        for &(hw, d) in sizes {
            for &p in PATCHES {
                let tokens = u64::from(d / p) * u64::from(hw / p) * u64::from(hw / p);
                let skipped = !divides(hw, d, p) || tokens > MAX_TOKENS;
                assert_eq!(skipped, not_run.contains(&(hw, d, p)), "{variant} {hw}x{hw}x{d} p{p}");
                if !skipped {
                    let name = format!("{variant}_{hw}x{hw}x{d}_p{p}");
                    out.push((name, variant.to_string(), (hidden, heads, depth), p, [d, hw, hw]));
                }
            }
        }
    }
    out
}

/// What an experiment file expands to, in the fixture's terms; every run
/// field the fixture does not vary is checked to be the script's.
fn expanded(file: &str) -> Vec<Expected> {
    let s = sweep::load(&super::experiments_dir().join(file), &[]).unwrap_or_else(|e| panic!("{e}"));
    assert!(s.collapsed.is_empty(), "{file}: no two configs of the script are alike: {:?}", s.collapsed);
    s.configs
        .iter()
        .map(|c| {
            let cfg = &c.config;
            let facts::ModelSpec::Dit(m) = &cfg.model else { panic!("{file} {}: not a DiT", c.name) };
            assert!(c.is_valid(), "{file} {}: {}", c.name, c.status());
            assert_eq!((cfg.input.channels, cfg.out_channels), CHANNELS, "{file} {}", c.name);
            assert_eq!(cfg.gpu, facts::Gpu::A100Sxm80, "{file} {}", c.name);
            assert_eq!(cfg.precision, facts::Precision::Bf16Amp, "{file} {}", c.name);
            assert_eq!(cfg.mode, facts::Mode::Profile, "{file} {}", c.name);
            assert!(!cfg.grad_ckpt, "{file} {}: the launcher passes no --grad-ckpt", c.name);
            assert_eq!(cfg.batch, 1, "{file} {}", c.name);
            let variant = m.variant.map(|v| v.to_string()).unwrap_or_default();
            let dims = m.dims().unwrap_or_else(|e| panic!("{file} {}: {e}", c.name));
            (c.name.clone(), variant, (dims.hidden, dims.heads, dims.depth), m.patch, cfg.input.spatial.dims())
        })
        .collect()
}

/// exp13 is the script's latent grid: 4 variants x 14 (size, patch) pairs.
#[test]
fn exp13_is_the_group_dit_scripts_latent_grid() {
    let mut expected = script_configs(LATENT_SIZES, LATENT_NOT_RUN);
    assert_eq!(expected.len(), 56);
    let mut got = expanded("exp13.yaml");
    expected.sort();
    got.sort();
    assert_eq!(got, expected);
}

/// exp14 is the script's pixel grid: 4 variants x 15 (size, patch) pairs
/// less 256x256x160 at patch 2 (1,310,720 tokens).
#[test]
fn exp14_is_the_group_dit_scripts_pixel_grid() {
    let mut expected = script_configs(PIXEL_SIZES, PIXEL_NOT_RUN);
    assert_eq!(expected.len(), 56);
    let mut got = expanded("exp14.yaml");
    expected.sort();
    got.sort();
    assert_eq!(got, expected);
}
