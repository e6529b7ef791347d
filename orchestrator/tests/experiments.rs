//! Every shipped experiment file plans without error, and exp9 reproduces the
//! group's reported parameter counts and shape verdicts.

use orchestrator::sweep;
use std::path::{Path, PathBuf};

// Each experiment file against the config list of the group's script behind it.
#[path = "experiments/dit.rs"]
mod dit;
#[path = "experiments/hdit_uvit.rs"]
mod hdit_uvit;
#[path = "experiments/s2d.rs"]
mod s2d;

fn experiments_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments")
}

fn millions(c: &sweep::SweepConfig) -> Option<f64> {
    let cfg = &c.config;
    facts::params::count(&cfg.model, &cfg.input, cfg.out_channels).ok().map(|n| (n as f64 / 1e5).round() / 10.0)
}

#[test]
fn every_experiment_file_plans() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(experiments_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let names: Vec<String> = files.iter().map(|p| p.file_stem().unwrap().to_string_lossy().into_owned()).collect();
    for want in ["demo", "exp9", "exp10", "exp11", "exp11_1", "exp12", "exp12_1", "exp13", "exp14", "exp15", "exp16"] {
        assert!(names.iter().any(|n| n == want), "experiments/{want}.yaml missing");
    }
    for f in &files {
        let s = sweep::load(f, &[]).unwrap_or_else(|e| panic!("{e}"));
        assert!(!s.configs.is_empty(), "{}", f.display());
        let mut seen = std::collections::HashSet::new();
        for c in &s.configs {
            assert!(seen.insert(&c.name), "{}: duplicate name {}", f.display(), c.name);
        }
    }
}

#[test]
fn exp9_matches_the_reports() {
    let s = sweep::load(&experiments_dir().join("exp9.yaml"), &[]).unwrap();
    for (name, params) in [
        ("4L_tiny_lat4x", 29.0),
        ("4L_small_lat4x", 166.6),
        ("4L_medium_lat4x", 666.2),
        ("4L_medium_d_lat4x", 869.5),
        ("4L_large_lat4x", 2664.6),
        ("4L_large_d_lat4x", 3477.6),
        ("3L_tiny_lat8x", 7.3),
        ("3L_large_lat8x", 665.8),
        ("3L_xlarge_lat8x", 1497.9),
        ("3L_huge_lat8x", 2662.8),
        ("3L_huge_d_lat8x", 3473.7),
    ] {
        let c = s.get(name).unwrap_or_else(|| panic!("{name} missing"));
        assert!(c.is_valid(), "{name}: {}", c.status());
        assert_eq!(millions(c), Some(params), "{name}");
    }
    // The group's script ran its 4-level UNets on the 4x latent alone
    // (profile_latent_3d_unet.py@02d6741:63): the file excludes the 8x ones.
    assert!(s.configs.iter().all(|c| !(c.name.starts_with("4L_") && c.name.ends_with("lat8x"))));
    assert_eq!(s.configs.len(), 26, "17 configs, 4L_maisi as 4L_small, the 10 3-level ones on both latents");
    assert!(s.configs.iter().all(|c| c.is_valid()));
}

#[test]
fn command_line_overrides_reach_every_config() {
    let s = sweep::load(&experiments_dir().join("exp9.yaml"), &["model.num_res_blocks=3".into()]).unwrap();
    // `_d` configs become identical to their plain twins and are kept once.
    assert!(s.get("4L_large_d_lat4x").is_none());
    assert_eq!(millions(s.get("4L_large_lat4x").unwrap()), Some(3477.6));
}

/// One config of the group's latent script: name, widths, attention per
/// level, res blocks per level, head channels.
type ScriptConfig = (&'static str, &'static [u32], &'static [bool], &'static [u32], u32);

/// The group's latent script's configs, written by hand from
/// `misc/profiling/profile_latent_3d_unet.py@02d6741:36-57` (ModeS7/AIS4900_master).
const LATENT_SCRIPT: &[ScriptConfig] = &[
    ("4L_tiny", &[32, 64, 128, 256], &[false, false, true, true], &[1, 1, 1, 1], 32),
    ("4L_small", &[64, 128, 256, 512], &[false, false, true, true], &[2, 2, 2, 2], 32),
    ("4L_maisi", &[64, 128, 256, 512], &[false, false, true, true], &[2, 2, 2, 2], 32),
    ("4L_medium", &[128, 256, 512, 1024], &[false, false, true, true], &[2, 2, 2, 2], 64),
    ("4L_medium_d", &[128, 256, 512, 1024], &[false, false, true, true], &[3, 3, 3, 3], 64),
    ("4L_large", &[256, 512, 1024, 2048], &[false, false, true, true], &[2, 2, 2, 2], 64),
    ("4L_large_d", &[256, 512, 1024, 2048], &[false, false, true, true], &[3, 3, 3, 3], 64),
    ("3L_tiny", &[32, 64, 128], &[false, true, true], &[1, 1, 1], 32),
    ("3L_small", &[64, 128, 256], &[false, true, true], &[2, 2, 2], 32),
    ("3L_medium", &[128, 256, 512], &[false, true, true], &[2, 2, 2], 64),
    ("3L_medium_d", &[128, 256, 512], &[false, true, true], &[3, 3, 3], 64),
    ("3L_large", &[256, 512, 1024], &[false, true, true], &[2, 2, 2], 64),
    ("3L_large_d", &[256, 512, 1024], &[false, true, true], &[3, 3, 3], 64),
    ("3L_xlarge", &[384, 768, 1536], &[false, true, true], &[2, 2, 2], 64),
    ("3L_xlarge_d", &[384, 768, 1536], &[false, true, true], &[3, 3, 3], 64),
    ("3L_huge", &[512, 1024, 2048], &[false, true, true], &[2, 2, 2], 64),
    ("3L_huge_d", &[512, 1024, 2048], &[false, true, true], &[3, 3, 3], 64),
];

/// exp9 is exactly the latent script's sweep: each of its configs on the 4x
/// latent (8, 40, 64, 64), the 3-level ones also on the 8x latent (8, 20, 32,
/// 32) (`:61-66`), with MONAI's 32 GroupNorm groups; `4L_maisi` is
/// `4L_small`'s model, planned once under `4L_small`.
#[test]
fn exp9_is_the_group_latent_scripts_config_list() {
    let s = sweep::load(&experiments_dir().join("exp9.yaml"), &[]).unwrap();
    let mut expected = Vec::new();
    for (name, widths, attn, res, heads) in LATENT_SCRIPT {
        for (latent, spatial) in [("lat4x", [40, 64, 64]), ("lat8x", [20, 32, 32])] {
            if widths.len() == 4 && latent == "lat8x" || *name == "4L_maisi" {
                continue;
            }
            expected.push((format!("{name}_{latent}"), widths.to_vec(), attn.to_vec(), res.to_vec(), *heads, spatial));
        }
    }
    let mut got = Vec::new();
    for c in &s.configs {
        let facts::ModelSpec::Unet(u) = &c.config.model else { panic!("{}: not a UNet", c.name) };
        assert_eq!(u.norm_num_groups, 32, "{}", c.name);
        assert_eq!((c.config.input.channels, c.config.out_channels), (8, 4), "{}", c.name);
        // Heads where attention runs (MONAI reads the head channels nowhere else).
        let attends: Vec<u32> =
            u.head_channels().iter().zip(&u.attention_levels).filter(|(_, a)| **a).map(|(h, _)| *h).collect();
        assert!(attends.windows(2).all(|w| w[0] == w[1]), "{}: {attends:?}", c.name);
        let spatial = c.config.input.spatial.dims();
        got.push((c.name.clone(), u.channels.clone(), u.attention_levels.clone(), u.res_blocks(), attends[0], spatial));
    }
    expected.sort();
    got.sort();
    assert_eq!(got, expected);
}
