//! Loading and expanding experiment files: errors with positions, axes, names.

use super::*;

const BASE: &str = "\
name: t
gpu: A100-SXM4-80GB
input:
  channels: 8
  spatial: [40, 64, 64]
output_channels: 4
model:
  family: unet
  channels: [32, 64, 128, 256]
  attention_levels: [false, false, true, true]
  num_head_channels: 32
";

fn plan(text: &str, overrides: &[&str]) -> Result<Sweep, String> {
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    parse(Path::new("exp.yaml"), text, &o).map_err(|e| e.to_string())
}

#[test]
fn base_without_sweep_is_one_config_named_after_the_experiment() {
    let s = plan(BASE, &[]).unwrap();
    assert_eq!(s.configs.len(), 1);
    assert_eq!(s.configs[0].name, "t");
    assert!(s.configs[0].is_valid());
}

#[test]
fn typo_in_a_model_key_names_file_line_column_and_key() {
    let text = BASE.replace("  channels: [32", "  chanels: [32");
    let e = plan(&text, &[]).unwrap_err();
    assert!(e.starts_with("exp.yaml:9:3: model.chanels: unknown field `chanels`"), "{e}");
}

/// Every config gives a whole `model:` block (as experiments/demo.yaml
/// does), so none reads the base's: its misspelt key is still an error at its
/// line. A key of another family is not (a config may switch to it).
#[test]
fn typo_in_a_base_model_no_config_reads_is_an_error_at_its_line() {
    let sweep = "sweep:\n  configs:\n    - {name: a, model: {family: dit, hidden: 64, heads: 4, depth: 2, patch: 4}}\n";
    let text = format!("{}  num_res_blok: 1\n{sweep}", BASE);
    let e = plan(&text, &[]).unwrap_err();
    assert!(e.starts_with("exp.yaml:12:3: model.num_res_blok: unknown field `num_res_blok`"), "{e}");
    let text = format!("{}  patch: 4\n{sweep}", BASE);
    assert_eq!(plan(&text, &[]).unwrap().configs.len(), 1);
}

#[test]
fn typo_at_top_level() {
    let e = plan(&format!("{BASE}batchsize: 2\n"), &[]).unwrap_err();
    assert!(e.starts_with("exp.yaml:12:1: batchsize: unknown field `batchsize`"), "{e}");
}

#[test]
fn string_where_a_list_belongs() {
    let text = BASE.replace("[false, false, true, true]", "yes");
    let e = plan(&text, &[]).unwrap_err();
    assert!(
        e.starts_with("exp.yaml:10:3: model.attention_levels: invalid type: string \"yes\", expected a sequence"),
        "{e}"
    );
}

#[test]
fn negative_width_points_at_the_list_item() {
    let text = BASE.replace("[32, 64, 128, 256]", "[32, -64, 128, 256]");
    let e = plan(&text, &[]).unwrap_err();
    assert!(e.starts_with("exp.yaml:9:18: model.channels[1]: invalid value: integer `-64`"), "{e}");
}

#[test]
fn missing_model_field() {
    let text = BASE.replace("  num_head_channels: 32\n", "");
    let e = plan(&text, &[]).unwrap_err();
    assert!(e.starts_with("exp.yaml:7:1: model: missing field `num_head_channels`"), "{e}");
}

#[test]
fn unknown_gpu_is_named() {
    let e = plan(&BASE.replace("A100-SXM4-80GB", "A100-80"), &[]).unwrap_err();
    assert!(e.starts_with("exp.yaml:2:1: gpu: unknown variant `A100-80`"), "{e}");
}

#[test]
fn syntax_error_has_a_position() {
    let e = plan("name: [unclosed\n", &[]).unwrap_err();
    assert!(e.starts_with("exp.yaml:"), "{e}");
    assert!(e.contains("(syntax)"), "{e}");
}

#[test]
fn bad_value_in_a_grid_points_at_the_grid_entry() {
    let text =
        format!("{BASE}sweep:\n  grid:\n    model.channels:\n      - [32, 64, 128, 256]\n      - [32, x, 128, 256]\n");
    let e = plan(&text, &[]).unwrap_err();
    assert!(e.starts_with("exp.yaml:16:14: sweep.grid.\"model.channels\"[1][1]: invalid type: string \"x\""), "{e}");
}

#[test]
fn bad_override_names_the_argument() {
    let e = plan(BASE, &["model.num_res_blocks=many"]).unwrap_err();
    assert!(e.starts_with("command-line override `model.num_res_blocks=many`: model.num_res_blocks:"), "{e}");
}

#[test]
fn overrides_apply_and_win_over_the_sweep() {
    let text = format!("{BASE}sweep:\n  grid:\n    model.num_res_blocks: [1, 2]\n");
    let s = plan(&text, &["model.channels=[64, 128, 256, 512]", "batch=2"]).unwrap();
    assert_eq!(s.configs.len(), 2);
    for c in &s.configs {
        let facts::ModelSpec::Unet(u) = &c.config.model else { panic!() };
        assert_eq!(u.channels, vec![64, 128, 256, 512]);
        assert_eq!(c.config.batch, 2);
    }
    let s = plan(&text, &["model.num_res_blocks=3"]).unwrap();
    // Both grid points collapse to the same config: kept once.
    assert_eq!(s.configs.len(), 1);
}

#[test]
fn grid_zip_configs_and_exclude_compose() {
    let text = "\
name: d
gpu: A100-SXM4-80GB
input: {channels: 1, spatial: [40, 64, 64]}
output_channels: 1
model: {family: dit, variant: S, patch: 2}
sweep:
  grid:
    model.variant: [S, B, L, XL]
    model.patch: [2, 4, 8]
  exclude:
    - {model.variant: XL, model.patch: 2}
";
    let s = plan(text, &[]).unwrap();
    assert_eq!(s.configs.len(), 11);
    assert_eq!(s.configs[0].name, "S_patch2");
    assert!(s.get("XL_patch2").is_none());

    // An exclude rule that drops nothing is a mistake, said with its line.
    let e = plan(&text.replace("{model.variant: XL, model.patch: 2}", "{model.varient: XL, model.patch: 2}"), &[])
        .unwrap_err();
    assert!(
        e.starts_with("exp.yaml:11:7: sweep.exclude[0]: this exclude rule names `model.varient`, which no config has"),
        "{e}"
    );
    let e = plan(&text.replace("{model.variant: XL, model.patch: 2}", "{model.variant: XXL, model.patch: 2}"), &[])
        .unwrap_err();
    assert!(e.starts_with("exp.yaml:11:7: sweep.exclude[0]: this exclude rule matches no config of the sweep"), "{e}");

    let zipped = text.replace("  exclude:\n    - {model.variant: XL, model.patch: 2}\n", "")
        .replace("  grid:\n    model.variant: [S, B, L, XL]\n    model.patch: [2, 4, 8]\n",
                 "  name: \"{model.variant}-{input.spatial}-p{model.patch}\"\n  zip:\n    model.variant: [S, B]\n    model.patch: [2, 4]\n");
    let s = plan(&zipped, &[]).unwrap();
    let names: Vec<&str> = s.configs.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["S-64x64x40-p2", "B-64x64x40-p4"]);
}

#[test]
fn named_configs_keep_their_names_and_invalid_ones_are_kept_with_reasons() {
    let text = format!(
        "{BASE}sweep:\n  configs:\n    - {{name: 4L_tiny, model.num_res_blocks: 1}}\n  grid:\n    input.spatial: {{lat4x: [40, 64, 64], lat8x: [20, 32, 32]}}\n"
    );
    let s = plan(&text, &[]).unwrap();
    let names: Vec<&str> = s.configs.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["4L_tiny_lat4x", "4L_tiny_lat8x"]);
    assert!(s.configs[0].is_valid());
    assert!(s.configs[1].status().contains("divisible by 2^3 = 8"), "{}", s.configs[1].status());
    assert_ne!(s.configs[0].hash, s.configs[1].hash);
}

#[test]
fn worker_block_parses_sizes_and_names_the_bad_key() {
    let s = plan(&format!("{BASE}worker: {{backend: flex, memory_limit: 512MiB}}\n"), &[]).unwrap();
    assert_eq!(s.experiment.worker.memory_limit, Some(512 << 20));
    assert_eq!(s.experiment.worker.args(), ["--backend", "flex", "--memory-limit", "536870912"]);
    let s = plan(&format!("{BASE}worker:\n  memory_limit: 2000000\n"), &[]).unwrap();
    assert_eq!(s.experiment.worker.memory_limit, Some(2_000_000));
    assert_eq!(plan(BASE, &[]).unwrap().experiment.worker.args(), Vec::<String>::new());
    assert_eq!(plan(BASE, &[]).unwrap().experiment.worker.configs_per_task, 1, "one config per task by default");
    let s = plan(&format!("{BASE}worker: {{configs_per_task: 3}}\n"), &[]).unwrap();
    assert_eq!(s.experiment.worker.configs_per_task, 3);
    assert_eq!(s.experiment.worker.args(), Vec::<String>::new(), "the manifest carries it, not the arguments");
    for (bad, want) in [
        ("worker: {memory_limit: 2 lots}", "worker.memory_limit: invalid size \"2 lots\""),
        ("worker: {memory_limit: 0}", "worker.memory_limit: a memory limit of 0 bytes"),
        ("worker: {backend: rocm}", "worker.backend: unknown variant `rocm`"),
        ("worker: {memry_limit: 1G}", "worker.memry_limit: unknown field `memry_limit`"),
        ("worker: {configs_per_task: 0}", "worker.configs_per_task: 0 configs per array task would run nothing"),
        ("worker: {configs_per_task: -2}", "worker.configs_per_task: expected a whole number of configs per array"),
        ("worker: {configs_per_task: many}", "worker.configs_per_task: expected a whole number"),
    ] {
        let e = plan(&format!("{BASE}{bad}\n"), &[]).unwrap_err();
        assert!(e.starts_with("exp.yaml:12:") && e.contains(want), "{bad}: {e}");
    }
    for (text, bytes) in [("1.5GiB", 3 << 29), ("64G", 64 << 30), ("1GB", 1_000_000_000), ("100 kib", 102_400)] {
        assert_eq!(crate::util::size::parse(text), Ok(bytes), "{text}");
    }
}

#[test]
fn experiment_level_keys_cannot_be_swept() {
    let text = format!("{BASE}sweep:\n  grid:\n    slurm.time: [\"1:00:00\"]\n");
    let e = plan(&text, &[]).unwrap_err();
    assert!(e.contains("`slurm.time` cannot vary per config"), "{e}");
}

#[test]
fn hashes_ignore_names() {
    let a = plan(BASE, &[]).unwrap();
    let b = plan(&BASE.replace("name: t", "name: other"), &[]).unwrap();
    assert_eq!(a.configs[0].hash, b.configs[0].hash);
}

#[test]
fn a_repeated_key_is_reported_where_it_repeats() {
    let text = BASE.replace("output_channels: 4\n", "output_channels: 4\ngpu: H100-80GB-HBM3\n");
    let e = plan(&text, &[]).unwrap_err();
    assert!(e.starts_with("exp.yaml:7:1: gpu: duplicate key (first at line 2, column 1)"), "{e}");
}

#[test]
fn budgets_must_be_positive_wherever_they_come_from() {
    let e = plan(&format!("{BASE}budget_gb: -5\n"), &[]).unwrap_err();
    assert!(e.starts_with("exp.yaml:12:1: budget_gb: -5 GiB: a budget must be a positive number"), "{e}");
    let e = plan(BASE, &["budget_gb=0"]).unwrap_err();
    assert!(e.starts_with("command-line override `budget_gb=0`: budget_gb: 0 GiB"), "{e}");
    assert_eq!(plan(&format!("{BASE}budget_gb: 60\n"), &[]).unwrap().experiment.budget_gb, Some(60.0));
}

#[test]
fn empty_axis_lists_are_refused_at_their_key() {
    let e = plan(&format!("{BASE}sweep:\n  grid:\n    model.num_res_blocks: []\n"), &[]).unwrap_err();
    assert!(e.starts_with("exp.yaml:14:5: sweep.grid.\"model.num_res_blocks\": empty list"), "{e}");
    let e = plan(&format!("{BASE}sweep:\n  zip:\n    model.num_res_blocks: {{}}\n"), &[]).unwrap_err();
    assert!(e.starts_with("exp.yaml:14:5: sweep.zip.\"model.num_res_blocks\": empty list"), "{e}");
    let e = plan(&format!("{BASE}sweep:\n  configs: []\n"), &[]).unwrap_err();
    assert!(e.starts_with("exp.yaml:13:3: sweep.configs: empty list"), "{e}");
}

#[test]
fn an_empty_file_says_so_and_a_missing_field_has_a_position() {
    for empty in ["", "# only a comment\n", "\n\n"] {
        let e = plan(empty, &[]).unwrap_err();
        assert!(e.starts_with("exp.yaml:1:1: (document): the file is empty"), "{e}");
    }
    let e = plan("# header\nname: t\n", &[]).unwrap_err();
    assert!(e.starts_with("exp.yaml:2:1: (document): missing field `gpu`"), "{e}");
}

#[test]
fn a_binary_file_is_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("exp.yaml");
    std::fs::write(&f, b"name: t\ngpu: \xff\xfe\x00junk\n").unwrap();
    let e = load(&f, &[]).unwrap_err();
    let msg = format!("{:#}", anyhow::Error::from(e));
    assert!(
        msg.ends_with("exp.yaml:2:6: (file): not UTF-8 text (byte 0xff): an experiment file is YAML text"),
        "{msg}"
    );
    assert_eq!(msg.matches("UTF-8").count(), 1, "{msg}");
    let gone = load(&dir.path().join("nope.yaml"), &[]).unwrap_err();
    let msg = format!("{:#}", anyhow::Error::from(gone));
    assert_eq!(msg.matches("No such file").count(), 1, "{msg}");
}

#[test]
fn a_template_key_the_config_lacks_is_an_error_at_the_template() {
    let text = format!(
        "{BASE}sweep:\n  name: \"{{model.variant}}_p{{model.patch}}\"\n  grid:\n    model.num_res_blocks: [1, 2]\n"
    );
    let e = plan(&text, &[]).unwrap_err();
    assert!(
        e.starts_with("exp.yaml:13:3: sweep.name: the name template uses `{model.variant}`, which config num_res_blocks1 (a unet) does not set"),
        "{e}"
    );
    let e = plan(&format!("{BASE}sweep:\n  name: \"{{model.channels\"\n"), &[]).unwrap_err();
    assert!(e.starts_with("exp.yaml:13:3: sweep.name: `{` without `}`"), "{e}");
    let ok =
        format!("{BASE}sweep:\n  name: \"r{{model.num_res_blocks}}\"\n  grid:\n    model.num_res_blocks: [1, 2]\n");
    let names: Vec<String> = plan(&ok, &[]).unwrap().configs.into_iter().map(|c| c.name).collect();
    assert_eq!(names, ["r1", "r2"]);
}

#[test]
fn overrides_that_collapse_configs_keep_true_names_and_list_what_collapsed() {
    let text = format!(
        "{BASE}sweep:\n  configs:\n    - {{name: tiny, model.channels: [8, 16, 32, 64], model.num_res_blocks: 1}}\n    - {{name: small, model.channels: [16, 32, 64, 128]}}\n    - {{name: wide_heads, model.channels: [16, 32, 64, 128], model.num_head_channels: 16}}\n  grid:\n    input.spatial: {{lat4x: [40, 64, 64], lat8x: [24, 32, 32]}}\n"
    );
    let s = plan(&text, &[]).unwrap();
    let names: Vec<&str> = s.configs.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        ["tiny_lat4x", "tiny_lat8x", "small_lat4x", "small_lat8x", "wide_heads_lat4x", "wide_heads_lat8x"]
    );
    assert!(s.collapsed.is_empty());

    let s = plan(&text, &["model.num_res_blocks=3", "model.channels=[64, 128, 256, 512]"]).unwrap();
    let names: Vec<&str> = s.configs.iter().map(|c| c.name.as_str()).collect();
    // `tiny` and `small` are neither any more: the labels that still hold remain.
    assert_eq!(names, ["lat4x", "lat8x", "num_head_channels16_lat4x", "num_head_channels16_lat8x"]);
    assert_eq!(s.collapsed, [("small_lat4x".to_string(), "lat4x".to_string()), ("small_lat8x".into(), "lat8x".into())]);
    let warning = collapse_summary(6, &s.collapsed, &["model.num_res_blocks=3".parse().unwrap()]);
    assert_eq!(
        warning,
        "with model.num_res_blocks=3 the sweep produces 2 identical configs: kept 4 of 6 (small_lat4x → lat4x, small_lat8x → lat8x)"
    );
}

#[test]
fn config_hashes_are_the_canonical_json_of_what_a_config_computes() {
    use sha2::{Digest, Sha256};
    // The hash as first defined: serde_json's sorted map as compact text, of
    // what was written. State directories are keyed by it.
    let as_written = |c: &facts::RunConfig| {
        let mut content = serde_json::json!({
            "model": c.model, "input": c.input, "out_channels": c.out_channels, "batch": c.batch,
            "precision": c.precision, "grad_ckpt": c.grad_ckpt, "mode": c.mode, "steps": c.steps,
        });
        // Training facts are part of what a config computes where it has them.
        if let Some(t) = &c.training {
            content["training"] = serde_json::to_value(t).expect("plain data");
        }
        hex::encode(&Sha256::digest(content.to_string().as_bytes())[..6])
    };
    // Now of the model's one notation (and a profile run's one step): a
    // config written in it keeps the hash it had (`state::rehash` moves the others).
    let reference = |c: &facts::RunConfig| {
        let mut canonical = c.clone();
        canonical.model = c.model.canonical();
        if c.mode == facts::Mode::Profile {
            canonical.steps = 1;
        }
        as_written(&canonical)
    };
    let mut moved = std::collections::BTreeSet::new();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments");
    let mut n = 0;
    for f in std::fs::read_dir(&dir).expect("experiments/").filter_map(|e| e.ok()).map(|e| e.path()) {
        if f.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        for c in crate::sweep::load(&f, &["mode=train".into()])
            .expect("loads")
            .configs
            .iter()
            .chain(crate::sweep::load(&f, &[]).expect("loads").configs.iter())
        {
            assert_eq!(c.hash.0, reference(&c.config), "{}: {}", f.display(), c.name);
            if c.hash.0 != as_written(&c.config) {
                moved.insert(c.name.clone());
            }
            n += 1;
        }
    }
    assert!(n > 100, "{n} configs");
    // The experiment files write the one notation.
    assert!(moved.is_empty(), "{moved:?}");
}

#[test]
fn two_different_configs_under_one_name_are_refused_not_renamed() {
    let text = format!(
        "{BASE}sweep:\n  configs:\n    - {{name: a, model.num_head_channels: 32}}\n    - {{name: a, model.num_head_channels: 64}}\n"
    );
    let e = plan(&text, &[]).unwrap_err();
    assert!(e.contains("sweep: two different configs are both named `a`; name them apart"), "{e}");
    // The same computation twice is one config, as before.
    let twins = text.replace("num_head_channels: 64", "num_head_channels: 32");
    assert_eq!(plan(&twins, &[]).unwrap().configs.len(), 1);
}

#[test]
fn a_worker_memory_limit_below_the_prediction_is_not_a_fit() {
    use crate::precheck::{Predictor, VerdictKind};
    let s = plan(BASE, &[]).unwrap();
    let p = Predictor::pytorch();
    assert_eq!(s.verdict(&p, &s.configs[0]).kind(), VerdictKind::Fits);
    let limited = plan(&format!("{BASE}worker: {{memory_limit: 64MiB}}\n"), &[]).unwrap();
    let v = limited.verdict(&p, &limited.configs[0]);
    assert_eq!(v.kind(), VerdictKind::Oom, "{v}");
    assert!(v.to_string().contains("0.062 GiB available"), "judged against the 64 MiB limit: {v}");
}

/// One computation of what a run has: this machine's memory replaces the
/// GPU's (even above it), and a worker limit below it wins; the active loop's
/// limit (`memory_limit_gib`) is the same figure.
#[test]
fn the_capacity_is_this_machine_s_or_the_worker_limit_below_it() {
    use super::CapacityOf;
    let mut s = plan(BASE, &[]).unwrap();
    let gpu = s.experiment.gpu;
    assert_eq!(s.capacity(gpu), super::Capacity::of_gpu(gpu));
    assert_eq!(s.memory_limit_gib(), None);
    s.host_memory_gib = Some(gpu.capacity_gib() + 20.0);
    assert_eq!(s.capacity(gpu).of, CapacityOf::ThisMachine);
    assert_eq!(s.memory_limit_gib(), Some(gpu.capacity_gib() + 20.0));
    s.experiment.worker.memory_limit = Some(1 << 30);
    assert_eq!((s.capacity(gpu).of, s.capacity(gpu).gib), (CapacityOf::WorkerLimit, 1.0));
    assert_eq!(s.memory_limit_gib(), Some(1.0));
    s.host_memory_gib = None;
    assert_eq!(s.capacity(gpu).of, CapacityOf::WorkerLimit);
}

/// An override renames only the configs whose labelled values it changed: a
/// config that already had the value keeps its name (issue 43; before, every
/// config setting the key lost its label, `4L_medium` with 64 head channels
/// renamed by `model.num_head_channels=64`).
#[test]
fn an_override_renames_only_the_configs_whose_values_it_changed() {
    let text = format!(
        "{BASE}sweep:\n  configs:\n    - {{name: narrow, model.num_head_channels: 32}}\n    - {{name: wide, model.channels: [64, 128, 256, 512], model.num_head_channels: 64}}\n    - {{name: plain, model.channels: [16, 32, 64, 128], model.num_res_blocks: 3}}\n  grid:\n    input.spatial: {{lat4x: [40, 64, 64], lat8x: [24, 32, 32]}}\n"
    );
    let names = |o: &[&str]| -> Vec<String> { plan(&text, o).unwrap().configs.into_iter().map(|c| c.name).collect() };
    assert_eq!(names(&[]), ["narrow_lat4x", "narrow_lat8x", "wide_lat4x", "wide_lat8x", "plain_lat4x", "plain_lat8x"]);
    // 64 is `wide`'s own value: only `narrow` is renamed, after what it still sets (nothing).
    assert_eq!(
        names(&["model.num_head_channels=64"]),
        ["lat4x", "lat8x", "wide_lat4x", "wide_lat8x", "plain_lat4x", "plain_lat8x"]
    );
    // The grid's own value keeps its label; the other one says what it is now.
    assert_eq!(
        names(&["input.spatial=[40, 64, 64]"]),
        ["narrow_lat4x", "wide_lat4x", "plain_lat4x"],
        "lat8x became lat4x: folded into its twin"
    );
    // A value written the same way as the choice's keeps the name, whatever the key's depth.
    assert_eq!(names(&["model.num_res_blocks=3"])[4], "plain_lat4x");
    assert_eq!(names(&["model.num_res_blocks=2"])[4], "channels-16-32-64-128_lat4x");
}

/// `exclude:` names a config or a grid label, as well as values (issue 43).
#[test]
fn exclude_names_configs_and_grid_labels() {
    let sweep = "sweep:\n  configs:\n    - {name: tiny, model.num_res_blocks: 1}\n    - {name: small, model.channels: [64, 128, 256, 512]}\n  grid:\n    input.spatial: {lat4x: [40, 64, 64], lat8x: [24, 32, 32]}\n    model.num_head_channels: [32, 64]\n  exclude:\n";
    let names = |rules: &str, o: &[&str]| -> Result<Vec<String>, String> {
        plan(&format!("{BASE}{sweep}{rules}"), o).map(|s| s.configs.into_iter().map(|c| c.name).collect())
    };
    // A bare label: every config made with it; a config's name: all of that config.
    assert_eq!(
        names("    - lat8x\n", &[]).unwrap(),
        [
            "tiny_lat4x_num_head_channels32",
            "tiny_lat4x_num_head_channels64",
            "small_lat4x_num_head_channels32",
            "small_lat4x_num_head_channels64"
        ]
    );
    assert_eq!(
        names("    - tiny\n    - num_head_channels64\n", &[]).unwrap(),
        ["small_lat4x_num_head_channels32", "small_lat8x_num_head_channels32"]
    );
    // A label as a key's value, `name:` for a named config, beside plain values.
    assert_eq!(
        names("    - {name: tiny, input.spatial: lat8x}\n    - {name: small, model.num_head_channels: 64}\n", &[])
            .unwrap(),
        [
            "tiny_lat4x_num_head_channels32",
            "tiny_lat4x_num_head_channels64",
            "small_lat4x_num_head_channels32",
            "small_lat8x_num_head_channels32"
        ]
    );
    // What names nothing is an error at the rule, listing what there is.
    let e = names("    - lat16x\n", &[]).unwrap_err();
    assert!(
        e.starts_with("exp.yaml:20:7: sweep.exclude[0]: `lat16x` is neither the name of a config nor a label of a grid or zip value (there are: tiny, small, lat4x, lat8x, num_head_channels32, num_head_channels64)"),
        "{e}"
    );
    let e = names("    - {name: huge, input.spatial: lat8x}\n", &[]).unwrap_err();
    assert!(e.starts_with("exp.yaml:20:8: sweep.exclude[0].name: huge is not the name of a config under `configs:` (there are: tiny, small)"), "{e}");
    let e = names("    - {input.spatial: lat16x}\n", &[]).unwrap_err();
    assert!(
        e.contains("this exclude rule matches no config of the sweep"),
        "not a label, so a value no config has: {e}"
    );
    let e = names("    - [tiny]\n", &[]).unwrap_err();
    assert!(
        e.contains("sweep.exclude[0]: expected a mapping of dotted keys to values, or a config's name or a grid label"),
        "{e}"
    );
    // A label whose value the command line replaced describes no config: it drops nothing (said, not refused).
    let all = names("    - lat8x\n", &["input.spatial=[40, 64, 64]"]).unwrap();
    assert_eq!(all.len(), 4, "lat8x's configs are lat4x's now, folded: {all:?}");
    let kept = names("    - tiny\n", &["model.num_res_blocks=3"]).unwrap();
    assert_eq!(kept.len(), 8, "tiny is tiny no more: not dropped by its name: {kept:?}");
    assert!(kept.iter().all(|n| !n.starts_with("tiny")), "{kept:?}");
}
