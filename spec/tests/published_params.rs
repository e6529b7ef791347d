//! Every record of the group's measurements that reports a parameter count is
//! reproduced from the architecture: to 0.05M where the report gives one
//! decimal, to the report's rounding (±0.5M) where it gives whole millions.

use spec::record::{read_jsonl, MeasurementRecord};
use std::path::PathBuf;

/// Records whose printed count disagrees with the architecture they describe,
/// with the reason. Anything not listed must match.
const KNOWN_MISMATCHES: &[(&str, &str)] = &[
    // DiT and HDiT rows scatter ±0.06M around the exact count with no relation
    // to tokens, patch or depth (the same config differs between rows by that
    // much): the report's own rounding noise, just above the 0.05M bound.
    ("dit_latent_XL_32x32x20_p4", "report noise (+0.058M), see above"),
    ("dit_latent_XL_32x32x40_p2", "report noise (+0.057M)"),
    ("dit_latent_XL_64x64x80_p8", "report noise (+0.056M)"),
    ("dit_pixel_XL_64x64x80_p8", "report noise (+0.056M), same run as the latent row"),
    ("hdit_S_p2__2_4_6_4_2", "report noise (+0.054M)"),
    ("hdit_B_p4__2_4_4_6_4_4_2", "report noise (+0.053M)"),
    // S2D tables print whole millions; these rows' notes say "attention L3+L4
    // assumed": the figure was estimated for a layout the run did not have.
    // No single MONAI variant (attention placement, time-embedding width, up
    // path depth) reproduces them together; the exact count is 0.6–11.7M off.
    ("s2d128_4L_64_128_256_512_no-attn", "whole-million estimate, exact 160.05M"),
    ("s2d128_4L_64_128_256_512_attn-L23", "whole-million estimate, exact 166.63M"),
    ("s2d128_5L_32_64_256_512_512_attn-L34", "'attention assumed' estimate, exact 270.75M"),
    ("s2d128_5L_64_128_256_512_512_attn-L34", "'attention assumed' estimate, exact 278.99M"),
    ("s2d128_5L_64_128_256_512_1024_attn-L34", "'attention assumed' estimate, exact 664.78M"),
    ("s2d128_5L_64_128_512_512_1024_attn-L34", "'attention assumed' estimate, exact 743.11M"),
    ("s2d128_5L_128_128_256_512_512_attn-L34", "'attention assumed' estimate, exact 286.64M"),
    ("s2d128_5L_32_64_256_1024_1024_attn-L34", "'attention assumed' estimate, exact 984.13M"),
    ("s2d128_5L_64_128_512_1024_1024_attn-L34", "'attention assumed' estimate, exact 1082.76M"),
    ("s2d128_5L_128_256_512_1024_1024_attn-L34", "'attention assumed' estimate, exact 1115.66M"),
];

fn records() -> Vec<MeasurementRecord> {
    let path = std::env::var_os("VRAM_RECORDS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/vram-measurements.jsonl"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    read_jsonl(&text).unwrap_or_else(|(line, e)| panic!("{}:{line}: {e}", path.display()))
}

/// Whole-million figures (S2D tables) are held to ±0.5M, one-decimal ones to 0.05M.
fn tolerance(reported: f64) -> f64 {
    if reported.fract() == 0.0 && reported >= 50.0 {
        0.5
    } else {
        0.05
    }
}

#[test]
fn every_reported_parameter_count_is_reproduced() {
    let recs = records();
    let mut checked = 0;
    let mut failures = Vec::new();
    for r in &recs {
        let Some(reported) = r.params_m else { continue };
        let cfg = r.run_config().expect("record describes a model");
        let exact = spec::params::count(&cfg.model, &cfg.input, cfg.out_channels).expect("countable") as f64 / 1e6;
        let ok = (exact - reported).abs() <= tolerance(reported) + 1e-9;
        let listed = KNOWN_MISMATCHES.iter().any(|(id, _)| *id == r.id);
        checked += 1;
        if ok == listed {
            failures.push(format!(
                "{}: reported {reported}M, exact {exact:.3}M ({})",
                r.id,
                if listed { "listed as a mismatch but matches: remove it" } else { "mismatch" }
            ));
        }
    }
    assert!(checked >= 100, "only {checked} records with params_m");
    assert!(failures.is_empty(), "{} of {checked}:\n{}", failures.len(), failures.join("\n"));
    assert!(KNOWN_MISMATCHES.len() * 5 < checked, "too many exceptions to call them few");
}

#[test]
fn every_record_with_a_count_is_valid() {
    for r in records() {
        let cfg = r.run_config().unwrap();
        assert_eq!(spec::validate::validate(&cfg), vec![], "{}", r.id);
    }
}
