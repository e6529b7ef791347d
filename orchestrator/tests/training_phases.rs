//! One test per training fact of the phases (docs/training.md): each sets
//! one fact on a config and checks the phase it belongs to moves by what
//! the fact holds, and nothing else does. Without the fact's term the test
//! fails.

use facts::training::{Compile, Compression, CompressionKind, Extractor, Training};
use facts::{Input, ModelSpec, Precision, RunConfig, Spatial};
use orchestrator::precheck::training::{TrainCoefficients, TrainPhase, TrainPrediction};
use orchestrator::precheck::{Predictor, GIB};

/// A training run of `model` on `channels` x `spatial`.
fn config(model: serde_json::Value, channels: u32, spatial: Spatial, grad_ckpt: bool, training: Training) -> RunConfig {
    let model: ModelSpec = serde_json::from_value(model).unwrap();
    RunConfig {
        mode: facts::Mode::Train,
        precision: Precision::Bf16Amp,
        grad_ckpt,
        training: Some(training),
        ..RunConfig::profile("t", "t", model, Input { channels, spatial })
    }
}

/// The group's 270M pixel UNet at 160x128x128, checkpointed.
fn unet(training: Training) -> RunConfig {
    let model = serde_json::json!({
        "family": "unet", "channels": [16, 32, 64, 256, 512, 512],
        "attention_levels": [false, false, false, false, true, true],
        "num_res_blocks": [1, 1, 1, 2, 2, 2], "num_head_channels": 16, "norm_num_groups": 16,
    });
    config(model, 2, Spatial::new(160, 128, 128), true, training)
}

/// SiT-L at patch 8 on 160x256x256: its step sets the peak.
fn dit(training: Training) -> RunConfig {
    let model = serde_json::json!({"family": "dit", "variant": "L", "patch": 8});
    config(model, 2, Spatial::new(160, 256, 256), false, training)
}

fn train(cfg: &RunConfig) -> (TrainPrediction, u64) {
    let p = Predictor::pytorch().predict(cfg).unwrap();
    (p.train, p.params)
}

fn phase(t: &TrainPrediction, phase: TrainPhase) -> f64 {
    t.phase(phase).unwrap().bytes
}

fn term(t: &TrainPrediction, phase: TrainPhase, name: &str) -> f64 {
    t.phase(phase).unwrap().terms.iter().filter(|x| x.name == name).map(|x| x.bytes).sum()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn each_ema_copy_holds_an_fp32_copy_of_the_weights_in_every_phase() {
    let (none, params) = train(&unet(Training::default()));
    let (two, _) = train(&unet(Training { ema_copies: 2, ..Training::default() }));
    for ph in [TrainPhase::Startup, TrainPhase::Step, TrainPhase::Validation, TrainPhase::Generation] {
        assert!(close(phase(&two, ph) - phase(&none, ph), 8.0 * params as f64), "{ph:?}");
    }
}

#[test]
fn a_compiled_model_keeps_compile_keep_of_the_steps_activations() {
    let c = TrainCoefficients::builtin();
    let name = "forward/backward activations and buffers";
    let cfg = |compile| dit(Training { compile, ..Training::default() });
    let (eager, _) = train(&cfg(Compile::Off));
    let (compiled, _) = train(&cfg(Compile::Default));
    assert_eq!(compiled.peak_phase, TrainPhase::Step);
    assert!(c.compile_keep < 1.0);
    assert!(close(term(&compiled, TrainPhase::Step, name), c.compile_keep * term(&eager, TrainPhase::Step, name)));
    assert!(phase(&compiled, TrainPhase::Step) < phase(&eager, TrainPhase::Step));
}

#[test]
fn cuda_graphs_hold_a_private_pool_beside_the_eager_step() {
    let c = TrainCoefficients::builtin();
    let cfg = |compile| dit(Training { compile, ..Training::default() });
    let (eager, _) = train(&cfg(Compile::Off));
    let (graphs, _) = train(&cfg(Compile::ReduceOverhead));
    let pool = term(&graphs, TrainPhase::Step, "CUDA-graph private pool");
    let dynamic = term(&eager, TrainPhase::Step, "forward/backward activations and buffers");
    assert!(pool > 0.0);
    assert!(close(pool, c.graph_pool * dynamic));
    assert!(close(phase(&graphs, TrainPhase::Step), phase(&eager, TrainPhase::Step) + pool));
}

fn vqvae() -> Compression {
    Compression { kind: CompressionKind::Vqvae, channels: vec![64, 128], num_res_layers: 2, latent_channels: 4 }
}

/// DiT-S on the 4x latent of 160x256x256 volumes: its validation is set by the decode.
fn latent(compression: Compression) -> RunConfig {
    let training = Training {
        compression: Some(compression),
        pixel_spatial: Some(Spatial::new(160, 256, 256)),
        ..Training::default()
    };
    let model = serde_json::json!({"family": "dit", "variant": "S", "patch": 2});
    RunConfig { out_channels: 4, ..config(model, 8, Spatial::new(40, 64, 64), false, training) }
}

#[test]
fn a_latent_run_decodes_at_full_resolution_in_fp32() {
    let c = TrainCoefficients::builtin();
    let pixel = (160 * 256 * 256) as f64;
    // The VQ-VAE's largest level: 64 channels at an eighth of the volume,
    // or the one-channel output at full resolution, whichever is larger.
    let vq = (64.0 * pixel / 8.0).max(pixel);
    let (t, _) = train(&latent(vqvae()));
    let dec = term(&t, TrainPhase::Validation, "decoding the prediction");
    assert!(close(dec, c.decode_tensors * 4.0 * vq), "{} GiB", dec / GIB);
    // A KL autoencoder's first level is at full resolution: 8x the bytes.
    let kl = Compression { kind: CompressionKind::Kl, ..vqvae() };
    let (t, _) = train(&latent(kl));
    let dec = term(&t, TrainPhase::Validation, "decoding the prediction");
    assert!(close(dec, c.decode_tensors * 4.0 * 64.0 * pixel), "{} GiB", dec / GIB);
    assert!(t.uncovered.as_deref().is_some_and(|w| w.contains("KL")), "{:?}", t.uncovered);
    // The compression model's weights stay resident in every phase.
    assert!(term(&t, TrainPhase::Step, "compression model (fp32)") > 0.0);
}

#[test]
fn generation_holds_the_extractors_published_weights() {
    let all = Training::default();
    let without = Training {
        generation: facts::training::Generation {
            extractors: vec![Extractor::Resnet50, Extractor::RadimagenetResnet50],
            ..all.generation.clone()
        },
        ..all.clone()
    };
    let (a, _) = train(&unet(all));
    let (b, _) = train(&unet(without));
    let name = "feature extractors' weights";
    let weights = 4.0 * (25_557_032.0 + 23_508_032.0 + 195_900_000.0);
    assert!(close(term(&a, TrainPhase::Generation, name), weights));
    assert!(close(phase(&a, TrainPhase::Generation) - phase(&b, TrainPhase::Generation), 4.0 * 195_900_000.0));
}

#[test]
fn controlnet_trains_a_copy_of_half_the_unet_beside_the_frozen_one() {
    let (plain, params) = train(&unet(Training::default()));
    let (cn, _) = train(&unet(Training { controlnet: true, ..Training::default() }));
    let p = params as f64;
    // The copy's weights (4 B), its moments (8 B) instead of the UNet's (8 B
    // each over all parameters): 2 B a UNet parameter less in the optimizer,
    // 2 B more for the copy's weights.
    assert!(close(term(&cn, TrainPhase::Step, "ControlNet's trainable copy"), 4.0 * 0.5 * p));
    assert!(close(term(&cn, TrainPhase::Step, "AdamW moments"), 8.0 * 0.5 * p));
    assert!(close(term(&plain, TrainPhase::Step, "AdamW moments"), 8.0 * p));
    assert!(cn.uncovered.is_some());
}

#[test]
fn offloading_code_samples_without_the_optimizer_or_a_cached_workspace() {
    let g = |offload| Training {
        generation: facts::training::Generation { offload, ..Training::default().generation },
        ..Training::default()
    };
    let (kept, _) = train(&unet(g(false)));
    let (off, _) = train(&unet(g(true)));
    let ws = "cuDNN benchmark workspace at the sampling batch";
    assert!(term(&kept, TrainPhase::Generation, ws) > 0.0);
    assert_eq!(term(&off, TrainPhase::Generation, ws), 0.0);
    assert_eq!(term(&off, TrainPhase::Generation, "AdamW moments"), 0.0);
    assert!(phase(&off, TrainPhase::Generation) < phase(&kept, TrainPhase::Generation));
}

#[test]
fn gradient_accumulation_keeps_the_gradients_through_the_next_step() {
    let (one, params) = train(&unet(Training::default()));
    let (four, _) = train(&unet(Training { grad_accum: 4, ..Training::default() }));
    let name = "gradients kept across micro-batches";
    assert_eq!(term(&one, TrainPhase::Step, name), 0.0);
    assert!(close(term(&four, TrainPhase::Step, name), 4.0 * params as f64));
}

#[test]
fn a_resumed_run_loads_its_checkpoint_beside_the_model() {
    let (fresh, params) = train(&unet(Training { ema_copies: 1, ..Training::default() }));
    let (resumed, _) = train(&unet(Training { ema_copies: 1, resume: true, ..Training::default() }));
    let loaded = term(&resumed, TrainPhase::Startup, "checkpoint loaded onto the GPU");
    // Weights, two moments and the EMA copy, fp32.
    assert!(close(loaded, 16.0 * params as f64), "{} GiB", loaded / GIB);
    assert!(close(phase(&resumed, TrainPhase::Startup) - phase(&fresh, TrainPhase::Startup), loaded));
}

#[test]
fn the_peak_is_the_largest_phase_and_a_train_config_is_judged_by_it() {
    let cfg = unet(Training::default());
    let pred = Predictor::pytorch();
    let p = pred.predict(&cfg).unwrap();
    let largest = p.train.phases.iter().map(|x| x.bytes).fold(0.0, f64::max);
    assert_eq!(p.train.peak_bytes, largest);
    assert_eq!(p.train_peak_bytes, largest);
    let v = pred.verdict_of(&cfg, &p, None);
    assert_eq!(v.predicted_gib(), Some(largest / GIB));
}
