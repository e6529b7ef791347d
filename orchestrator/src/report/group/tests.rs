//! The group layouts' cells from rows with figures of our own (the group's
//! published figures are checked against `data/` in tests/group_report.rs).

use super::transformer::short_tokens;
use super::unet::running_max;
use super::*;
use crate::precheck::VerdictKind;

fn config(model: serde_json::Value, spatial: [u32; 3]) -> facts::RunConfig {
    serde_json::from_value(serde_json::json!({
        "experiment": "t", "name": "c", "model": model,
        "input": {"channels": 2, "spatial": spatial}, "out_channels": 2, "batch": 1,
        "precision": "bf16-amp", "grad_ckpt": false, "gpu": "A100-SXM4-80GB"
    }))
    .expect("config")
}

fn unet(name: &str, channels: &[u32]) -> Row {
    let attn: Vec<bool> = channels.iter().map(|_| false).collect();
    let model = serde_json::json!({"family": "unet", "channels": channels, "attention_levels": attn,
        "num_res_blocks": 1, "num_head_channels": 32});
    let mut r = crate::report::base_row(&config(model, [16, 32, 32]), name.into(), String::new(), VerdictKind::Fits);
    r.name = name.into();
    r
}

fn ran(mut r: Row, params: u64, phases: [Option<f64>; 4], status: Status) -> Row {
    r.params = Some(params);
    [r.model_gib, r.fwd_gib, r.bwd_gib, r.peak_gib] = phases;
    r.status = status;
    r
}

/// The rows of `| a | b |` lines of `text` whose first cell is `first`.
fn line<'a>(text: &'a str, first: &str) -> &'a str {
    text.lines().find(|l| l.starts_with(&format!("| {first} |"))).unwrap_or_else(|| panic!("no row {first}:\n{text}"))
}

fn report(rows: Vec<Row>, layout: ReportLayout) -> Report {
    let mut r = crate::report::tests::report_of(rows);
    r.layout = layout;
    r.budget_set = true;
    r
}

#[test]
fn fwd_bwd_total_are_running_maxima() {
    // Per-phase peaks fall after forward; the group's window never does.
    let r = ran(unet("a", &[8, 16]), 1, [Some(0.4), Some(3.0), Some(2.5), Some(2.9)], Status::Ok);
    assert_eq!(running_max(&r), [Some(3.0), Some(3.0), Some(3.0)]);
    let r = ran(unet("b", &[8, 16]), 1, [Some(0.4), None, Some(2.5), Some(4.0)], Status::Ok);
    assert_eq!(running_max(&r), [None, Some(2.5), Some(4.0)], "a phase without a figure passes the maximum on");
    let r = ran(unet("c", &[8, 16]), 1, [Some(5.0), Some(1.0), Some(2.0), Some(3.0)], Status::Ok);
    assert_eq!(running_max(&r), [Some(5.0), Some(5.0), Some(5.0)], "the build's memory counts in every phase");
}

#[test]
fn the_latent_table_prints_the_groups_columns_and_labels() {
    let mut oom = unet("c_oom", &[32, 64, 128]);
    (oom.status, oom.oom_at_gib, oom.params) = (Status::Oom, Some(70.0), Some(7_000_000));
    let mut failed = unet("d_failed", &[32, 64]);
    (failed.status, failed.detail) = (Status::Failed, Some("no record".into()));
    let rows = vec![
        ran(unet("a_ok", &[8, 16]), 12_345_678, [Some(0.123), Some(3.04), Some(2.5), Some(2.96)], Status::Ok),
        ran(
            unet("b_over", &[64, 128]),
            41_700_000,
            [Some(0.2), Some(50.0), Some(61.0), Some(61.0)],
            Status::OverBudget,
        ),
        oom,
        failed,
    ];
    let text = render(&report(rows, ReportLayout::LatentUnet));
    assert!(text.contains("## Input 2x32x32x16 (C,H,W,D)\n\n| Config | Channels | Params | Model | Fwd | Bwd | Total | Status |\n|--------|----------|--------|-------|-----|-----|-------|--------|\n"), "{text}");
    assert_eq!(line(&text, "a_ok"), "| a_ok | [8, 16] | 12.3M | 0.1G | 3.0G | 3.0G | 3.0G | OK |");
    assert_eq!(line(&text, "b_over"), "| b_over | [64, 128] | 41.7M | 0.2G | 50.0G | 61.0G | 61.0G | >60GB |");
    assert_eq!(line(&text, "c_oom"), "| c_oom | [32, 64, 128] | - | - | - | - | OOM | FAIL |");
    assert_eq!(line(&text, "d_failed"), "| d_failed | [32, 64] | - | - | - | - | - | failed: no record |");
}

#[test]
fn the_s2d_tables_split_by_levels_and_star_an_oom() {
    let mut oom = unet("oom_known", &[8, 16, 32]);
    (oom.status, oom.oom_at_gib) = (Status::Oom, Some(9.26));
    let mut unknown = unet("oom_unknown", &[8, 16, 32]);
    (unknown.status, unknown.oom_at_gib) = (Status::Oom, Some(0.0));
    let rows = vec![
        ran(unet("two", &[8, 16]), 159_600_000, [None, None, None, Some(18.44)], Status::Ok),
        oom,
        unknown,
        ran(unet("two_over", &[8, 32]), 1_000_000, [None, None, None, Some(60.5)], Status::OverBudget),
    ];
    let text = render(&report(rows, ReportLayout::S2dUnet));
    let two = text.find("## 2-Level UNets\n\n| Config | Params | VRAM | Status |\n").expect(&text);
    let three = text.find("## 3-Level UNets\n").expect(&text);
    assert!(two < three && text[two..three].contains("two_over"), "first-seen order, one table each: {text}");
    assert_eq!(line(&text, "two"), "| two | 160M | 18.4G | OK |");
    assert_eq!(line(&text, "two_over"), "| two_over | 1M | 60.5G | >60GB |");
    assert_eq!(line(&text, "oom_known"), "| oom_known | - | 9.3G* | OOM |");
    assert_eq!(line(&text, "oom_unknown"), "| oom_unknown | - | - | OOM |", "no figure, none invented");
}

fn transformer(model: serde_json::Value, spatial: [u32; 3], params: u64, peak: Option<f64>, status: Status) -> Row {
    let mut r = crate::report::base_row(&config(model, spatial), "id".into(), String::new(), VerdictKind::Fits);
    (r.params, r.peak_gib, r.status) = (Some(params), peak, status);
    r
}

#[test]
fn the_dit_tables_are_per_variant_with_the_scripts_formats() {
    let dit = |v: &str, p: u32| serde_json::json!({"family": "dit", "variant": v, "patch": p});
    let rows = vec![
        transformer(dit("S", 2), [80, 64, 64], 48_230_000, Some(11.66), Status::Ok),
        transformer(dit("L", 2), [80, 64, 64], 498_700_000, Some(62.1), Status::OverBudget),
        transformer(dit("S", 4), [80, 64, 64], 34_500_000, Some(0.74), Status::Ok),
        transformer(dit("L", 4), [160, 128, 128], 720_800_000, None, Status::Oom),
    ];
    let text = render(&report(rows, ReportLayout::Dit));
    let s = text.find("## DiT-S\n\n| Resolution | Patch | Tokens | Params | Peak VRAM | Status |\n").expect(&text);
    let l = text.find("## DiT-L\n").expect(&text);
    assert!(s < l);
    assert!(
        text[s..l].contains(
            "| 64x64x80 | 2 | 40,960 | 48.2M | 11.7 GB | OK |\n| 64x64x80 | 4 | 5,120 | 34.5M | 0.7 GB | OK |\n"
        ),
        "{text}"
    );
    // Past the budget: the free memory against the script's 80 GB, as the report keeps it there.
    assert!(text[l..].contains("| 64x64x80 | 2 | 40,960 | 498.7M | 62.1 GB | OK (17.9GB free) |\n"), "{text}");
    assert!(text[l..].contains("| 128x128x160 | 4 | 40,960 | 720.8M | --- | OOM |\n"), "{text}");
}

#[test]
fn hdit_and_uvit_tables_count_tokens_as_the_script_does() {
    let hdit = serde_json::json!({"family": "hdit", "variant": "S", "patch": 4, "level_depths": [1, 2, 4, 2, 1]});
    let uvit = serde_json::json!({"family": "uvit", "variant": "S", "patch": 8});
    let rows = vec![
        transformer(hdit, [160, 256, 256], 133_700_000, Some(5.93), Status::Ok),
        transformer(uvit.clone(), [160, 256, 256], 56_000_000, Some(2.1), Status::Ok),
        transformer(uvit, [80, 256, 256], 715_600_000, None, Status::Oom),
    ];
    assert_eq!(
        (rows[0].tokens, rows[0].bottleneck_tokens),
        (Some(163_840), Some(2_560)),
        "two merges: 40x64x64 → 20x32x32 → 10x16x16"
    );
    let text = render(&report(rows, ReportLayout::HditUvit));
    assert!(text.contains("## HDiT-S\n\n| Patch | level_depths | Tok L0 | Tok BN | Params | Peak VRAM | Status |\n|-------|--------------|--------|--------|--------|-----------|--------|\n| 4 | [1,2,4,2,1] | 164K | 3K | 133.7M | 5.9 GB | OK (74.1 GB free) |\n"), "{text}");
    assert!(text.contains("## U-ViT-S\n\n| Patch | Tokens | Params | Peak VRAM | Status |\n"), "{text}");
    assert!(
        text.contains("| 8 | 20K | 56.0M | 2.1 GB | OK (77.9 GB free) |\n| 8 | 10K | 715.6M | - | OOM |\n"),
        "{text}"
    );
    for (n, s) in [(10_485_760, "10.5M"), (1_310_720, "1.3M"), (163_840, "164K"), (2_560, "3K"), (999, "999")] {
        assert_eq!(short_tokens(n), s);
    }
}

/// A measured row is reported under each of its names, and nowhere counted twice.
#[test]
fn a_twin_is_its_rows_figures_under_its_own_name() {
    let rows = vec![ran(unet("small", &[8, 16]), 9_000_000, [Some(0.1), Some(1.0), Some(1.2), Some(1.2)], Status::Ok)];
    let mut rep = report(rows, ReportLayout::LatentUnet);
    rep.twins = vec![crate::report::Twin { name: "maisi".into(), same_as: "small".into() }];
    let text = render(&rep);
    assert_eq!(line(&text, "maisi"), line(&text, "small").replacen("small", "maisi", 1));
    assert!(text.contains("\n1 configs: 1 OK.\n"), "{text}");
    assert!(text.contains("maisi is the same model as small: measured once, reported under each name."), "{text}");
}
