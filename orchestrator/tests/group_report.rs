//! The group's report, regenerated (issue 43): `report` on a replayed exp9,
//! exp11, exp13 and exp16 prints the tables of the group's script each
//! experiment follows (`report_layout:`), and every figure of a row the group
//! published, the records in data/vram-measurements.jsonl, is the group's
//! figure as their report prints it (docs/profiling_results.md@0ee6133 in
//! ModeS7/AIS4900_master: latent `0.7G`, S2D `160M` and `9.3G*`, DiT
//! `0.7 GB` and `40,960`, HDiT `OK (36.6 GB free)`). Rows are matched to
//! records by the model they print (name, or variant, resolution, patch and
//! depths), through the experiment file, never through the report's code;
//! every record of each experiment's tables is compared at least once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use facts::record::{MeasuredStatus, MeasurementRecord};
use facts::ModelSpec;
use orchestrator::sweep::{Sweep, SweepConfig};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `orchestrator ARGS --state-dir STATE` from the repository root; its stdout.
fn run(state: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .current_dir(root())
        .args(args)
        .arg("--state-dir")
        .arg(state)
        .env("NO_COLOR", "1")
        .output()
        .expect("orchestrator runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{args:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// One Markdown table: the heading above it, its header cells and rows.
struct Table {
    heading: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

fn cells(line: &str) -> Vec<String> {
    line.trim().trim_matches('|').split(" | ").map(|c| c.trim().to_string()).collect()
}

fn tables(md: &str) -> Vec<Table> {
    let (mut out, mut heading, mut lines) = (Vec::new(), String::new(), md.lines().peekable());
    while let Some(l) = lines.next() {
        if l.starts_with('#') {
            heading = l.trim_start_matches('#').trim().to_string();
        } else if l.starts_with("| ") {
            let header = cells(l);
            let sep = lines.next().expect("a separator line");
            assert!(sep.starts_with("|--"), "{sep}");
            let mut rows = Vec::new();
            while let Some(r) = lines.next_if(|r| r.starts_with("| ")) {
                let c = cells(r);
                assert_eq!(c.len(), header.len(), "{r}");
                rows.push(c);
            }
            out.push(Table { heading: heading.clone(), header, rows });
        }
    }
    out
}

fn group_records() -> Vec<MeasurementRecord> {
    let text = std::fs::read_to_string(root().join("data/vram-measurements.jsonl")).expect("records");
    facts::record::read_jsonl(&text).expect("records parse").into_iter().filter(|r| r.superseded.is_none()).collect()
}

/// The config a printed row shows: by its name (a second name is its twin's
/// config), or by the variant of its table and the columns that tell its model.
fn config_of<'a>(sweep: &'a Sweep, t: &Table, row: &[String]) -> &'a SweepConfig {
    let col = |name: &str| t.header.iter().position(|h| h == name).map(|i| row[i].as_str());
    if let Some(name) = col("Config") {
        let kept = sweep.collapsed.iter().find(|(twin, _)| twin == name).map_or(name, |(_, kept)| kept.as_str());
        return sweep.get(kept).unwrap_or_else(|| panic!("{}: row {name} is no config of the sweep", t.heading));
    }
    let variant = t.heading.rsplit('-').next().expect("a variant heading");
    let found = sweep.configs.iter().find(|c| {
        let m = &c.config.model;
        let v = match m {
            ModelSpec::Dit(d) => d.variant,
            ModelSpec::Hdit(h) => h.variant,
            ModelSpec::Uvit(u) => u.variant,
            ModelSpec::Mamba(m) => m.variant,
            ModelSpec::Unet(_) => None,
        };
        v.map(|v| v.to_string()).as_deref() == Some(variant)
            && col("Patch") == m.patch().map(|p| p.to_string()).as_deref()
            && col("Resolution").is_none_or(|r| r == c.config.input.spatial.to_string())
            && col("level_depths").is_none_or(|d| match m {
                ModelSpec::Hdit(h) => format!("{:?}", h.level_depths).replace(' ', "") == d,
                _ => false,
            })
    });
    found.unwrap_or_else(|| panic!("{}: no config prints as {row:?}", t.heading))
}

/// `40,960`.
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// What the group's report prints in `column` for record `r`, in the table
/// of `layout`; `None` where it printed no figure there (or the column is
/// none the records carry).
fn published(layout: &str, column: &str, r: &MeasurementRecord) -> Option<String> {
    let oom = r.status == MeasuredStatus::Oom;
    let g = |x: Option<f64>| x.map(|x| format!("{x:.1}G"));
    let dash = || Some("-".to_string());
    match (layout, column) {
        ("latent-unet", "Params") if oom => dash(),
        ("latent-unet", "Model" | "Fwd" | "Bwd") if oom => dash(),
        ("latent-unet", "Total") if oom => Some("OOM".into()),
        ("latent-unet", "Model") => g(r.model_gb),
        ("latent-unet", "Fwd") => g(r.fwd_gb),
        ("latent-unet", "Bwd") => g(r.bwd_gb),
        ("latent-unet", "Total") => g(r.peak_gb),
        ("latent-unet", "Status") => Some(
            match r.status {
                MeasuredStatus::Ok => "OK",
                MeasuredStatus::OverBudget => ">60GB",
                MeasuredStatus::Oom => "FAIL",
            }
            .into(),
        ),
        ("s2d-unet", "Params") if oom => dash(),
        ("s2d-unet", "Params") => r.params_m.map(|p| format!("{p:.0}M")),
        ("s2d-unet", "VRAM") if oom => r.oom_reported_gb.map(|g| format!("{g:.1}G*")).or_else(dash),
        ("s2d-unet", "VRAM") => g(r.peak_gb),
        ("s2d-unet", "Status") => Some(
            match r.status {
                MeasuredStatus::Ok => "OK",
                MeasuredStatus::OverBudget => ">60GB",
                MeasuredStatus::Oom => "OOM",
            }
            .into(),
        ),
        (_, "Params") => r.params_m.map(|p| format!("{p:.1}M")),
        ("dit", "Tokens") => r.tokens.map(thousands),
        ("dit", "Peak VRAM") if oom => Some("---".into()),
        (_, "Peak VRAM") if oom => dash(),
        (_, "Peak VRAM") => r.peak_gb.map(|p| format!("{p:.1} GB")),
        (_, "Status") if oom => Some("OOM".into()),
        // The DiT report prints the free memory where the peak passes 60 GB
        // (the budget), the HDiT/U-ViT one on every row.
        ("dit", "Status") => r.peak_gb.map(|p| match p > 60.0 {
            true => format!("OK ({:.1}GB free)", 80.0 - p),
            false => "OK".into(),
        }),
        ("hdit-uvit", "Status") => r.peak_gb.map(|p| format!("OK ({:.1} GB free)", 80.0 - p)),
        _ => None,
    }
}

/// Replays `file`, prints its report, and compares every figure of every row
/// that has a record; returns the ids of the records compared and the names
/// of the rows with a Config column.
fn regenerated(file: &str, layout: &str, records: &[MeasurementRecord]) -> (BTreeSet<String>, Vec<String>) {
    let sweep = orchestrator::sweep::load(&root().join(file), &[]).expect("experiment file");
    assert_eq!(sweep.experiment.report_layout.to_string(), layout, "{file} names its script's layout");
    let d = tempfile::tempdir().expect("tempdir");
    let state = d.path().join("state");
    run(&state, &["submit", file, "--cluster", "replay", "--force"]);
    let printed = run(&state, &["report", &sweep.experiment.name]);
    let written = std::fs::read_to_string(state.join(&sweep.experiment.name).join("report/report.md")).expect("md");
    assert!(printed.starts_with(&written), "report prints the tables it writes:\n{printed}");
    let mut by_hash: BTreeMap<String, Vec<&MeasurementRecord>> = BTreeMap::new();
    for r in records {
        if let Ok(cfg) = r.run_config() {
            by_hash.entry(format!("{}@{}", cfg.hash(), r.gpu)).or_default().push(r);
        }
    }
    let (mut compared, mut names) = (BTreeSet::new(), Vec::new());
    let tables = tables(&written);
    assert!(!tables.is_empty(), "{written}");
    for t in &tables {
        for row in &t.rows {
            let c = config_of(&sweep, t, row);
            if let Some(i) = t.header.iter().position(|h| h == "Config") {
                names.push(row[i].clone());
            }
            let status = row.last().expect("a status");
            let recs = by_hash.get(&format!("{}@{}", c.hash, c.config.gpu.name())).cloned().unwrap_or_default();
            if recs.is_empty() {
                // No record: no figure of the group's, none made up.
                assert!(status.starts_with("failed"), "{file} {}: {row:?}", c.name);
                continue;
            }
            for r in recs {
                for (col, cell) in t.header.iter().zip(row) {
                    if let Some(want) = published(layout, col, r) {
                        assert_eq!(cell, &want, "{file}, {}, {row:?}: {col} of record {}", t.heading, r.id);
                    }
                }
                compared.insert(r.id.clone());
            }
        }
    }
    (compared, names)
}

#[test]
fn the_regenerated_tables_print_the_groups_figures() {
    let records = group_records();
    for (file, layout, tables, n) in [
        ("experiments/exp9.yaml", "latent-unet", &["unet_latent_4x", "unet_latent_8x"][..], 17),
        ("experiments/exp11.yaml", "s2d-unet", &["s2d_128_"][..], 50),
        ("experiments/exp13.yaml", "dit", &["dit_latent"][..], 45),
        ("experiments/exp16.yaml", "hdit-uvit", &["hdit_256"][..], 14),
    ] {
        let (compared, names) = regenerated(file, layout, &records);
        let of_tables: BTreeSet<String> = records
            .iter()
            .filter(|r| r.table.as_deref().is_some_and(|t| tables.iter().any(|p| t.starts_with(p))))
            .map(|r| r.id.clone())
            .collect();
        assert_eq!(of_tables.len(), n, "{file}: the records of its tables");
        let missing: Vec<&String> = of_tables.difference(&compared).collect();
        assert!(missing.is_empty(), "{file}: records no row printed: {missing:?}");
        if file.ends_with("exp9.yaml") {
            // 4L_maisi is 4L_small's model: both rows, each with the figures of both records.
            for name in ["4L_small_lat4x", "4L_maisi_lat4x"] {
                assert_eq!(names.iter().filter(|n| *n == name).count(), 1, "{name}: {names:?}");
            }
            assert!(compared.contains("unet_lat4x_4L_maisi") && compared.contains("unet_lat4x_4L_small"));
        }
    }
}
