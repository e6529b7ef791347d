//! The replay cluster answers the group's own sweeps: every config of
//! exp9, exp11, exp12 and exp13 that the group's records measured (same model,
//! however either writes it; same input, GPU and precision) is answered with
//! that record, and `submit --active --cluster replay` measures some of them.
//! Which configs have a record is decided here field by field, not by the
//! config hash the replay matches on. docs/active.md's table of exp9–exp16 is
//! what `orchestrator evidence --experiments` prints.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::orchestrator;
use facts::record::MeasurementRecord;
use facts::ModelSpec;
use orchestrator::sweep::SweepConfig;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn group_records() -> Vec<MeasurementRecord> {
    let text = std::fs::read_to_string(root().join("data/vram-measurements.jsonl")).expect("records");
    facts::record::read_jsonl(&text).expect("records parse").into_iter().filter(|r| r.superseded.is_none()).collect()
}

/// Whether record `r` measured config `c`, compared field by field: the run
/// (GPU, precision, checkpointing, batch, channels, input), then the model:
/// a UNet's widths, attention, res blocks per level and head channels where
/// attention runs, GroupNorm groups; a transformer's sizes, patch and level depths.
fn measured(r: &MeasurementRecord, c: &SweepConfig) -> bool {
    let cfg = &c.config;
    let run = r.gpu == cfg.gpu.name()
        && r.precision == cfg.precision
        && r.grad_ckpt == cfg.grad_ckpt
        && r.batch == cfg.batch
        && (r.in_channels, r.out_channels) == (cfg.input.channels, cfg.out_channels)
        && r.spatial == cfg.input.spatial.dims();
    if !run || r.family != cfg.model.family() {
        return false;
    }
    match &cfg.model {
        ModelSpec::Unet(u) => {
            let levels = u.channels.len();
            let per_level = |p: &Option<facts::PerLevel>, default: u32| {
                p.as_ref().map(|p| p.expand(levels)).unwrap_or_else(|| vec![default; levels])
            };
            let attends = |l: usize| u.attention_levels[l] || l + 1 == levels;
            let (rh, ch) = (per_level(&r.num_head_channels, 64), u.head_channels());
            r.channels.as_ref() == Some(&u.channels)
                && r.norm_num_groups == Some(u.norm_num_groups)
                && r.attention_levels.as_ref() == Some(&u.attention_levels)
                && per_level(&r.num_res_blocks, 2) == u.res_blocks()
                && (0..levels).filter(|&l| attends(l)).all(|l| rh[l] == ch[l])
        }
        m => {
            let d = m.transformer_dims().and_then(Result::ok);
            let recorded = r.model().ok().and_then(|rm| rm.transformer_dims()).and_then(Result::ok);
            let depths = match m {
                ModelSpec::Hdit(h) => r.level_depths.as_ref() == Some(&h.level_depths),
                _ => true,
            };
            d.is_some() && d == recorded && r.patch == m.patch() && depths
        }
    }
}

/// The `result` line's message of config `c`'s run, if it ran.
fn result_message(state: &Path, c: &SweepConfig) -> Option<String> {
    let text = std::fs::read_to_string(state.join(&c.config.experiment).join(c.config.events_rel())).ok()?;
    let line = text.lines().find(|l| l.contains("\"event\":\"result\""))?;
    let v: serde_json::Value = serde_json::from_str(line).expect("a result line");
    Some(v["message"].as_str().unwrap_or_default().to_string())
}

/// Submits every valid config of `file` to the replay (`--force`: the
/// predicted OOMs too) and checks each answer: a config with a record gets
/// that record, the rest are named as having none. Returns how many had one.
fn every_config_with_a_record_is_answered(file: &str, records: &[MeasurementRecord]) -> usize {
    let sweep = orchestrator::sweep::load(&root().join(file), &[]).expect("experiment file");
    let d = tempfile::tempdir().expect("tempdir");
    let state = d.path().join("state");
    orchestrator(&state, &["submit", file, "--cluster", "replay", "--force"]);
    let mut with_record = 0;
    for c in sweep.configs.iter().filter(|c| c.is_valid()) {
        let message = result_message(&state, c).unwrap_or_else(|| panic!("{file} {}: not run", c.name));
        match records.iter().find(|r| measured(r, c)) {
            Some(r) => {
                with_record += 1;
                assert!(message.contains(&format!("replayed: record `{}`", r.id)), "{file} {}: {message}", c.name);
                // The corrected records name every field (norm_num_groups too): nothing assumed.
                assert!(!message.contains("assumed"), "assumed nothing: {message}");
            }
            None => assert!(message.contains("has no record of config"), "{file} {}: {message}", c.name),
        }
    }
    with_record
}

/// The group's sweeps whose every record the replay answers (issue 43): the
/// configs of its latent, S2D and DiT latent scripts with a record in `data/`,
/// all of them, and the records each file's tables hold, each one answered.
#[test]
fn every_config_the_group_measured_is_answered_with_its_record() {
    let records = group_records();
    for (file, tables, configs) in [
        ("experiments/exp9.yaml", &["unet_latent_4x", "unet_latent_8x"][..], 16),
        ("experiments/exp11.yaml", &["s2d_128_"][..], 48),
        ("experiments/exp12.yaml", &["s2d_128_"][..], 48),
        ("experiments/exp13.yaml", &["dit_latent"][..], 51),
    ] {
        let with_record = every_config_with_a_record_is_answered(file, &records);
        assert_eq!(with_record, configs, "{file}");
        // Every record of the file's tables names one of its configs.
        let sweep = orchestrator::sweep::load(&root().join(file), &[]).expect("experiment file");
        let of_the_file =
            |r: &&MeasurementRecord| r.table.as_deref().is_some_and(|t| tables.iter().any(|p| t.starts_with(p)));
        for r in records.iter().filter(of_the_file) {
            assert!(sweep.configs.iter().any(|c| measured(r, c)), "{file}: record {} answers no config", r.id);
        }
    }
}

#[test]
fn the_active_loop_on_exp9_measures_from_the_records_and_answers_the_rest() {
    let sweep = orchestrator::sweep::load(&root().join("experiments/exp9.yaml"), &[]).expect("exp9");
    let records = group_records();
    let d = tempfile::tempdir().expect("tempdir");

    // The active loop measures from those records and answers the rest.
    let state = d.path().join("active");
    let args = ["submit", "experiments/exp9.yaml", "--cluster", "replay", "--active", "--poll-interval", "0.05"];
    let text = orchestrator(&state, &args);
    let summary = text.lines().find(|l| l.contains(" configs: ") && l.contains(" measured")).expect("a summary");
    let n_measured: usize = summary
        .split(" configs: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(n_measured >= 1, "{text}");
    for c in sweep.configs.iter().filter(|c| c.is_valid()) {
        if let (Some(m), true) = (result_message(&state, c), records.iter().any(|r| measured(r, c))) {
            assert!(m.starts_with("replayed: record"), "{}: a config with a record failed: {m}", c.name);
        }
    }
}

#[test]
fn the_documented_table_of_the_groups_sweeps_is_what_the_command_prints() {
    let (shown, page) = common::doc_block(&root(), "docs/active.md", "evidence-experiments");
    assert!(page.contains("orchestrator evidence --experiments experiments/exp*.yaml\n"));
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .current_dir(root())
        .args(["evidence", "--experiments"])
        .args(common::group_experiment_files(&root()))
        .output()
        .expect("orchestrator runs");
    let printed = common::text(&out);
    assert!(out.status.success(), "{printed}");
    assert_eq!(
        shown, printed,
        "docs/active.md's table of the group's sweeps is stale: rerun the command, paste its output"
    );
    let row = |exp: &str| printed.lines().find(|l| l.starts_with(&format!("| {exp} |"))).expect("a row").to_string();
    let cells: Vec<String> = row("exp9").split('|').map(|c| c.trim().to_string()).collect();
    let (with_record, measured): (usize, usize) = (cells[3].parse().expect("n"), cells[4].parse().expect("n"));
    assert!(measured >= 1 && with_record >= 10, "{printed}");
}
