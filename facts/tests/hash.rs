//! One model, one hash: a config's content hash is that of its one notation
//! (`facts::canonical`), so the same model written two ways keys one run
//! directory, one replay answer and one row of a sweep; a different model
//! keys another; and a config already written in the one notation keeps the
//! hash it had before (state directories written then read as they were).

use facts::RunConfig;

fn config(model: serde_json::Value) -> RunConfig {
    serde_json::from_value(serde_json::json!({
        "experiment": "exp9", "name": "4L_small_lat4x",
        "model": model,
        "input": {"channels": 8, "spatial": [40, 64, 64]},
        "out_channels": 4, "batch": 1, "precision": "bf16-amp", "grad_ckpt": false,
        "gpu": "A100-SXM4-80GB"
    }))
    .expect("a config")
}

fn unet(res: serde_json::Value, heads: serde_json::Value) -> RunConfig {
    config(serde_json::json!({
        "family": "unet", "channels": [64, 128, 256, 512], "attention_levels": [false, false, true, true],
        "num_res_blocks": res, "num_head_channels": heads
    }))
}

#[test]
fn scalar_and_list_notation_of_one_unet_give_one_hash() {
    use serde_json::json;
    let scalar = unet(json!(2), json!(64));
    for same in [
        unet(json!([2, 2, 2, 2]), json!(64)),
        unet(json!(2), json!([64, 64, 64, 64])),
        unet(json!([2, 2, 2, 2]), json!([64, 64, 64, 64])),
        // Head channels where no attention runs are never read.
        unet(json!(2), json!([0, 0, 64, 64])),
        // The default written out.
        config(
            json!({"family": "unet", "channels": [64, 128, 256, 512], "attention_levels": [false, false, true, true],
            "num_head_channels": 64, "norm_num_groups": 32}),
        ),
    ] {
        assert_eq!(same.hash(), scalar.hash(), "{:?}", same.model);
    }
    // A different model: another hash.
    for other in [
        unet(json!([2, 2, 3, 3]), json!(64)),
        unet(json!(3), json!(64)),
        unet(json!(2), json!(32)),
        unet(json!(2), json!([64, 64, 32, 64])),
    ] {
        assert_ne!(other.hash(), scalar.hash(), "{:?}", other.model);
    }
    let mut groups = scalar.clone();
    let facts::ModelSpec::Unet(u) = &mut groups.model else { unreachable!("a unet") };
    u.norm_num_groups = 16;
    assert_ne!(groups.hash(), scalar.hash(), "GroupNorm groups change the model");
}

#[test]
fn a_transformer_by_variant_or_by_its_sizes_gives_one_hash() {
    use serde_json::json;
    let named = config(json!({"family": "dit", "variant": "XL", "patch": 2}));
    let sized = config(json!({"family": "dit", "variant": "XL", "hidden": 1152, "heads": 16, "depth": 28, "patch": 2}));
    let bare = config(json!({"family": "dit", "hidden": 1152, "heads": 16, "depth": 28, "patch": 2}));
    assert_eq!(sized.hash(), named.hash());
    assert_eq!(bare.hash(), named.hash());
    let deeper = config(json!({"family": "dit", "variant": "XL", "depth": 30, "patch": 2}));
    assert_ne!(deeper.hash(), named.hash());
    assert_ne!(config(json!({"family": "dit", "variant": "L", "patch": 2})).hash(), named.hash());
}

#[test]
fn a_profile_run_is_one_step_however_many_it_names() {
    let one = unet(2.into(), 64.into());
    let mut five = one.clone();
    five.steps = 5;
    assert_eq!(five.hash(), one.hash(), "a profile runs one step");
    five.mode = facts::Mode::Train;
    let mut train_one = one.clone();
    train_one.mode = facts::Mode::Train;
    assert_ne!(five.hash(), train_one.hash(), "a training run's steps are what it runs");
}

#[test]
fn the_canonical_notation_keeps_the_hash_it_had_before() {
    // Computed by the orchestrator before hashes were of the one notation
    // (commit f2dd9db, `plan experiments/exp9.yaml --json`): exp9's
    // 4L_small_lat4x and exp13's DiT-XL at patch 2, written as the experiment
    // files write them.
    assert_eq!(unet(2.into(), 64.into()).hash().0, GOLDEN_UNET);
    let dit = config(serde_json::json!({"family": "dit", "variant": "XL", "patch": 2}));
    let mut dit = dit;
    dit.input = facts::Input { channels: 1, spatial: facts::Spatial::new(40, 64, 64) };
    dit.out_channels = 1;
    assert_eq!(dit.hash().0, GOLDEN_DIT);
}

const GOLDEN_UNET: &str = "79333cfdc71e";
const GOLDEN_DIT: &str = "16f78896e8a6";
