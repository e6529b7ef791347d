//! exp15 (U-ViT) and exp16 (HDiT) against the config lists of the group's
//! HDiT/U-ViT script, exp10 against the group's first pixel-UNet script
//! (ModeS7/AIS4900_master; the lists below are written by hand from them).

use orchestrator::sweep;
use std::path::Path;

/// The script's one volume, H = W = 256, D = 160
/// (`misc/profiling/profile_hdit_uvit_memory.py@ff513e0:58`), as [D, H, W].
const VOLUME: [u32; 3] = [160, 256, 256];

/// `DIT_VARIANTS` in its order (`src/medgen/models/dit.py@ff513e0:26-31`),
/// which the script walks for HDiT (`:498`): name, hidden size, heads.
const HDIT_VARIANTS: &[(&str, u32, u32)] = &[("S", 384, 6), ("B", 768, 12), ("L", 1024, 16), ("XL", 1152, 16)];

/// `HDIT_CONFIGS` (`profile_hdit_uvit_memory.py@ff513e0:69-94`): patch,
/// level depths and the script's label.
const HDIT_CONFIGS: &[(u32, &[u32], &str)] = &[
    (1, &[1, 1, 1, 4, 1, 1, 1], "p1 [1,1,1,4,1,1,1]"),
    (1, &[1, 1, 2, 4, 2, 1, 1], "p1 [1,1,2,4,2,1,1]"),
    (1, &[1, 2, 2, 4, 2, 2, 1], "p1 [1,2,2,4,2,2,1]"),
    (2, &[1, 2, 6, 2, 1], "p2 [1,2,6,2,1]"),
    (2, &[2, 4, 6, 4, 2], "p2 [2,4,6,4,2]"),
    (2, &[2, 4, 8, 4, 2], "p2 [2,4,8,4,2]"),
    (2, &[1, 1, 2, 6, 2, 1, 1], "p2 [1,1,2,6,2,1,1]"),
    (2, &[1, 2, 4, 6, 4, 2, 1], "p2 [1,2,4,6,4,2,1]"),
    (4, &[1, 2, 6, 2, 1], "p4 [1,2,6,2,1]"),
    (4, &[2, 4, 6, 4, 2], "p4 [2,4,6,4,2]"),
    (4, &[2, 6, 8, 6, 2], "p4 [2,6,8,6,2]"),
    (4, &[4, 6, 8, 6, 4], "p4 [4,6,8,6,4]"),
    (4, &[1, 2, 4, 6, 4, 2, 1], "p4 [1,2,4,6,4,2,1]"),
    (4, &[2, 4, 4, 6, 4, 4, 2], "p4 [2,4,4,6,4,4,2]"),
];

/// HDiT runs with more level-0 tokens than this are reported "skip" without
/// a model built (`:200-209`).
const HDIT_SKIP_TOKENS: u64 = 2_000_000;

/// `UVIT_VARIANTS` in its order (`src/medgen/models/uvit.py@ff513e0:35-40`),
/// which the script walks (`:468`): name, hidden size, depth, heads.
const UVIT_VARIANTS: &[(&str, u32, u32, u32)] =
    &[("S", 512, 13, 8), ("S-Deep", 512, 17, 8), ("M", 768, 17, 12), ("L", 1024, 21, 16)];

/// The patches of `UVIT_CONFIGS` (`:100-105`).
const UVIT_PATCHES: &[u32] = &[1, 2, 4, 8];

/// U-ViT runs with more tokens than this are reported "skip" (`:280-289`).
const UVIT_SKIP_TOKENS: u64 = 5_000_000;

/// Tokens of a [D, H, W] volume cut in `patch`-sized cubes (`:122-137`).
fn tokens(patch: u32) -> u64 {
    VOLUME.iter().map(|&n| u64::from(n / patch)).product()
}

/// What one transformer config of the sweep is: every field the test holds
/// the file to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Transformer {
    name: String,
    variant: String,
    hidden: u32,
    heads: u32,
    depth: u32,
    patch: u32,
    level_depths: Vec<u32>,
    spatial: [u32; 3],
    channels: (u32, u32),
    gpu: &'static str,
    grad_ckpt: bool,
    batch: u32,
}

/// How the script ran every config: `--grad-ckpt` and the default 2 channels
/// (`IDUN/profiling/profile_hdit_uvit.slurm@0ee6133:37`, script `:441-444`),
/// the model's out channels its in channels (`hdit.py@ff513e0:218`,
/// `uvit.py@ff513e0:166`), bf16 autocast (`:175`), on the A100 PCIe the
/// report names (`docs/profiling_results.md@054a15f:689`).
fn as_the_script_ran(name: String, variant: &str, dims: (u32, u32, u32), patch: u32, depths: &[u32]) -> Transformer {
    let (hidden, heads, depth) = dims;
    Transformer {
        name,
        variant: variant.to_string(),
        hidden,
        heads,
        depth,
        patch,
        level_depths: depths.to_vec(),
        spatial: VOLUME,
        channels: (2, 2),
        gpu: "A100-PCIe-80GB",
        grad_ckpt: true,
        batch: 1,
    }
}

fn transformer(c: &sweep::SweepConfig) -> Transformer {
    let cfg = &c.config;
    let (variant, dims, patch, depths) = match &cfg.model {
        facts::ModelSpec::Hdit(h) => (h.variant, h.dims(), h.patch, h.level_depths.clone()),
        facts::ModelSpec::Uvit(u) => (u.variant, u.dims(), u.patch, Vec::new()),
        other => panic!("{}: not an HDiT or U-ViT: {other:?}", c.name),
    };
    let d = dims.unwrap_or_else(|e| panic!("{}: {e}", c.name));
    assert_eq!(cfg.precision, facts::Precision::Bf16Amp, "{}", c.name);
    let variant = variant.map(|v| v.name().to_string()).unwrap_or_default();
    Transformer {
        name: c.name.clone(),
        variant,
        hidden: d.hidden,
        heads: d.heads,
        depth: d.depth,
        patch,
        level_depths: depths,
        spatial: cfg.input.spatial.dims(),
        channels: (cfg.input.channels, cfg.out_channels),
        gpu: cfg.gpu.name(),
        grad_ckpt: cfg.grad_ckpt,
        batch: cfg.batch,
    }
}

/// The files' naming rule for HDiT: the variant, then the script's label with
/// every character other than a letter, digit or `-` made `_` and the
/// trailing one dropped ("p2 [1,2,6,2,1]" → `S_p2__1_2_6_2_1`), as the
/// record ids `hdit_<name>` have it.
fn hdit_name(variant: &str, label: &str) -> String {
    let tidy: String = label.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    format!("{variant}_{}", tidy.trim_end_matches('_'))
}

fn load(file: &str) -> sweep::Sweep {
    let s = sweep::load(&super::experiments_dir().join(file), &[]).unwrap_or_else(|e| panic!("{e}"));
    assert!(s.collapsed.is_empty(), "{file}: configs folded: {:?}", s.collapsed);
    for c in &s.configs {
        assert!(c.is_valid(), "{file} {}: {}", c.name, c.status());
    }
    s
}

fn sorted(mut v: Vec<Transformer>) -> Vec<Transformer> {
    v.sort();
    v
}

/// exp16 is the HDiT half of the script: each DiT variant with each of its
/// (patch, level depths) configs, less the patch-1 ones it skips; the ten
/// L/XL patch-2 runs that ran out of memory stay.
#[test]
fn exp16_is_the_group_hdit_scripts_config_list() {
    let s = load("exp16.yaml");
    let mut expected = Vec::new();
    for &(variant, hidden, heads) in HDIT_VARIANTS {
        for &(patch, depths, label) in HDIT_CONFIGS {
            if tokens(patch) > HDIT_SKIP_TOKENS {
                continue;
            }
            let dims = (hidden, heads, depths.iter().sum());
            expected.push(as_the_script_ran(hdit_name(variant, label), variant, dims, patch, depths));
        }
    }
    assert_eq!(expected.len(), 44, "4 variants x 11 configs the script does not skip");
    let got: Vec<Transformer> = s.configs.iter().map(transformer).collect();
    assert_eq!(sorted(got), sorted(expected));
}

/// exp15 is the U-ViT half: each U-ViT variant with each patch, less patch 1
/// (skipped); patch 2, out of memory for every variant, stays.
#[test]
fn exp15_is_the_group_uvit_scripts_config_list() {
    let s = load("exp15.yaml");
    let mut expected = Vec::new();
    for &(variant, hidden, depth, heads) in UVIT_VARIANTS {
        for &patch in UVIT_PATCHES {
            if tokens(patch) > UVIT_SKIP_TOKENS {
                continue;
            }
            let name = format!("{variant}_p{patch}");
            expected.push(as_the_script_ran(name, variant, (hidden, heads, depth), patch, &[]));
        }
    }
    assert_eq!(expected.len(), 12, "4 variants x patches 2, 4, 8");
    let got: Vec<Transformer> = s.configs.iter().map(transformer).collect();
    assert_eq!(sorted(got), sorted(expected));
}

/// Every `hdit_256` / `uvit_256` record has the config its id names
/// (`hdit_<name>`, `uvit_<name>`) with the record's fields.
#[test]
fn the_hdit_and_uvit_records_are_named_by_their_configs() {
    let hdit = load("exp16.yaml");
    let uvit = load("exp15.yaml");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/vram-measurements.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut seen = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        let (sweep, prefix) = match r["table"].as_str() {
            Some("hdit_256") => (&hdit, "hdit_"),
            Some("uvit_256") => (&uvit, "uvit_"),
            _ => continue,
        };
        let id = r["id"].as_str().unwrap();
        let name = id.strip_prefix(prefix).unwrap_or_else(|| panic!("{id}: no {prefix} prefix"));
        let c = transformer(sweep.get(name).unwrap_or_else(|| panic!("{id}: no config {name}")));
        let num = |k: &str| r[k].as_u64().map(|n| n as u32);
        assert_eq!(Some(c.variant.as_str()), r["variant"].as_str(), "{id}");
        assert_eq!((Some(c.hidden), Some(c.heads), Some(c.patch)), (num("hidden"), num("heads"), num("patch")), "{id}");
        if let Some(depth) = num("depth") {
            assert_eq!(c.depth, depth, "{id}");
        }
        let depths: Vec<u32> =
            r["level_depths"].as_array().map_or(Vec::new(), |a| a.iter().map(|d| d.as_u64().unwrap() as u32).collect());
        assert_eq!(c.level_depths, depths, "{id}");
        let spatial: Vec<u32> = r["spatial"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as u32).collect();
        assert_eq!(c.spatial.to_vec(), spatial, "{id}");
        assert_eq!((Some(c.channels.0), Some(c.channels.1)), (num("in_channels"), num("out_channels")), "{id}");
        assert_eq!((Some(c.grad_ckpt), Some(c.gpu)), (r["grad_ckpt"].as_bool(), r["gpu"].as_str()), "{id}");
        seen += 1;
    }
    assert_eq!(seen, 19, "14 hdit_256 and 5 uvit_256 records");
}

/// One config of the group's first pixel-UNet script
/// (`misc/profiling/profile_pixel_3d_unet.py@b8e04ab`): its label, widths,
/// attention per level, res blocks per level, head channels, GroupNorm groups.
type PixelConfig = (&'static str, &'static [u32], &'static [bool], &'static [u32], u32, u32);

const F: bool = false;
const T: bool = true;

/// `get_configs()` (`profile_pixel_3d_unet.py@b8e04ab:149-305`), written by
/// hand; head channels 32 and 16 groups where a config names none (`:77-78`).
const PIXEL_SCRIPT: &[PixelConfig] = &[
    (
        "REF 6L [16,32,64,256,512,512] r=1,1,1,2,2,2 h=16",
        &[16, 32, 64, 256, 512, 512],
        &[F, F, F, F, T, T],
        &[1, 1, 1, 2, 2, 2],
        16,
        16,
    ),
    (
        "6L [32,64,128,256,512,512] r=1,1,1,2,2,2",
        &[32, 64, 128, 256, 512, 512],
        &[F, F, F, F, T, T],
        &[1, 1, 1, 2, 2, 2],
        32,
        16,
    ),
    (
        "6L [32,64,128,256,512,512] r=1,1,2,2,2,2",
        &[32, 64, 128, 256, 512, 512],
        &[F, F, F, F, T, T],
        &[1, 1, 2, 2, 2, 2],
        32,
        16,
    ),
    (
        "6L [32,64,128,256,512,512] attn-L345",
        &[32, 64, 128, 256, 512, 512],
        &[F, F, F, T, T, T],
        &[1, 1, 1, 2, 2, 2],
        32,
        16,
    ),
    (
        "6L [32,64,128,256,256,512] r=1,1,1,2,2,2",
        &[32, 64, 128, 256, 256, 512],
        &[F, F, F, F, T, T],
        &[1, 1, 1, 2, 2, 2],
        32,
        16,
    ),
    (
        "6L [32,64,128,256,256,256] r=1,1,1,2,2,2",
        &[32, 64, 128, 256, 256, 256],
        &[F, F, F, F, T, T],
        &[1, 1, 1, 2, 2, 2],
        32,
        16,
    ),
    (
        "6L [32,64,128,256,256,512] r=1,1,2,2,3,3",
        &[32, 64, 128, 256, 256, 512],
        &[F, F, F, F, T, T],
        &[1, 1, 2, 2, 3, 3],
        32,
        16,
    ),
    (
        "6L [32,64,128,256,512,512] r=2,2,2,2,2,2",
        &[32, 64, 128, 256, 512, 512],
        &[F, F, F, F, T, T],
        &[2, 2, 2, 2, 2, 2],
        32,
        16,
    ),
    ("5L [32,64,256,512,512] r=1,1,2,2,2", &[32, 64, 256, 512, 512], &[F, F, F, T, T], &[1, 1, 2, 2, 2], 32, 16),
    ("5L [32,64,128,256,512] r=2,2,2,2,2", &[32, 64, 128, 256, 512], &[F, F, F, T, T], &[2, 2, 2, 2, 2], 32, 16),
    ("5L [32,64,128,512,512] r=1,1,2,2,2", &[32, 64, 128, 512, 512], &[F, F, F, T, T], &[1, 1, 2, 2, 2], 32, 16),
    ("5L [32,64,256,512,1024] r=1,1,2,2,2", &[32, 64, 256, 512, 1024], &[F, F, F, T, T], &[1, 1, 2, 2, 2], 32, 16),
    ("5L [32,128,256,512,512] r=1,2,2,2,2", &[32, 128, 256, 512, 512], &[F, F, F, T, T], &[1, 2, 2, 2, 2], 32, 16),
    ("5L [32,128,256,512,512] r=2,2,2,3,3", &[32, 128, 256, 512, 512], &[F, F, F, T, T], &[2, 2, 2, 3, 3], 32, 16),
    (
        "6L [32,64,128,256,512,512] attn-L45 h=16",
        &[32, 64, 128, 256, 512, 512],
        &[F, F, F, F, T, T],
        &[1, 1, 1, 2, 2, 2],
        16,
        16,
    ),
    (
        "6L [32,64,128,256,512,512] attn-L45 h=64",
        &[32, 64, 128, 256, 512, 512],
        &[F, F, F, F, T, T],
        &[1, 1, 1, 2, 2, 2],
        64,
        16,
    ),
    (
        "6L [32,64,128,256,512,512] attn-L345 h=64",
        &[32, 64, 128, 256, 512, 512],
        &[F, F, F, T, T, T],
        &[1, 1, 1, 2, 2, 2],
        64,
        16,
    ),
    (
        "6L [32,64,128,256,512,512] r=1,1,1,2,2,2 ng=32",
        &[32, 64, 128, 256, 512, 512],
        &[F, F, F, F, T, T],
        &[1, 1, 1, 2, 2, 2],
        32,
        32,
    ),
];

/// The volumes every config ran on, 128x128x160 first (`:366-376`), as
/// [D, H, W], with the name suffix the file gives them.
const PIXEL_VOLUMES: &[([u32; 3], &str)] = &[([160, 128, 128], "128x128x160"), ([160, 256, 256], "256x256x160")];

/// exp10's naming rule: the script's label with spaces as `_`, a width list
/// as its widths joined by `-`, `key=a,b` as `keya-b`
/// ("REF 6L [16,32,64,256,512,512] r=1,1,1,2,2,2 h=16" →
/// `REF_6L_16-32-64-256-512-512_r1-1-1-2-2-2_h16`).
fn pixel_name(label: &str) -> String {
    let word = |w: &str| w.trim_start_matches('[').trim_end_matches(']').replace(',', "-");
    label
        .split(' ')
        .map(|w| match w.split_once('=') {
            Some((k, v)) => format!("{k}{}", v.replace(',', "-")),
            None => word(w),
        })
        .collect::<Vec<_>>()
        .join("_")
}

/// What one UNet config of exp10 is: every field the test holds it to.
type Unet = (String, Vec<u32>, Vec<bool>, Vec<u32>, Vec<u32>, u32, [u32; 3], (u32, u32), &'static str, bool, u32);

/// exp10 is the group's first pixel-UNet script's sweep: its 18 configs on
/// both volumes, bravo mode (2 channels in, 1 out: `:88-90`), every one
/// checkpointed block by block (`:32-48`, `:104`), batch 1 (`:368`, `:374`).
#[test]
fn exp10_is_the_group_pixel_unet_scripts_config_list() {
    assert_eq!(
        pixel_name("REF 6L [16,32,64,256,512,512] r=1,1,1,2,2,2 h=16"),
        "REF_6L_16-32-64-256-512-512_r1-1-1-2-2-2_h16"
    );
    let s = load("exp10.yaml");
    let mut expected: Vec<Unet> = Vec::new();
    for &(label, widths, attn, res, heads, groups) in PIXEL_SCRIPT {
        for &(spatial, volume) in PIXEL_VOLUMES {
            expected.push((
                format!("{}_{volume}", pixel_name(label)),
                widths.to_vec(),
                attn.to_vec(),
                res.to_vec(),
                vec![heads; widths.len()],
                groups,
                spatial,
                (2, 1),
                "A100-PCIe-80GB",
                true,
                1,
            ));
        }
    }
    let mut got: Vec<Unet> = Vec::new();
    for c in &s.configs {
        let cfg = &c.config;
        let facts::ModelSpec::Unet(u) = &cfg.model else { panic!("{}: not a UNet", c.name) };
        assert_eq!(cfg.precision, facts::Precision::Bf16Amp, "{}", c.name);
        got.push((
            c.name.clone(),
            u.channels.clone(),
            u.attention_levels.clone(),
            u.res_blocks(),
            u.head_channels(),
            u.norm_num_groups,
            cfg.input.spatial.dims(),
            (cfg.input.channels, cfg.out_channels),
            cfg.gpu.name(),
            cfg.grad_ckpt,
            cfg.batch,
        ));
    }
    expected.sort();
    got.sort();
    assert_eq!(got.len(), 36, "18 configs x 2 volumes");
    assert_eq!(got, expected);
}
