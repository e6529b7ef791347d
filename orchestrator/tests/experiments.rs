//! Every shipped experiment file plans without error, and exp9 reproduces the
//! group's reported parameter counts and shape verdicts.

use orchestrator::sweep;
use std::path::{Path, PathBuf};

fn experiments_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments")
}

fn millions(c: &sweep::SweepConfig) -> Option<f64> {
    let cfg = &c.config;
    spec::params::count(&cfg.model, &cfg.input, cfg.out_channels).ok().map(|n| (n as f64 / 1e5).round() / 10.0)
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
    let four_level_on_8x: Vec<_> =
        s.configs.iter().filter(|c| c.name.starts_with("4L_") && c.name.ends_with("lat8x")).collect();
    assert_eq!(four_level_on_8x.len(), 7);
    for c in four_level_on_8x {
        assert!(
            c.status().starts_with("invalid: a 4-level UNet needs every spatial dim divisible by 2^3 = 8"),
            "{}",
            c.status()
        );
    }
}

#[test]
fn command_line_overrides_reach_every_config() {
    let s = sweep::load(&experiments_dir().join("exp9.yaml"), &["model.num_res_blocks=3".into()]).unwrap();
    // `_d` configs become identical to their plain twins and are kept once.
    assert!(s.get("4L_large_d_lat4x").is_none());
    assert_eq!(millions(s.get("4L_large_lat4x").unwrap()), Some(3477.6));
}
