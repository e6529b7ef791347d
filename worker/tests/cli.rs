//! End-to-end runs of the `worker` binary on the CPU backend: each outcome
//! (ok, oom under a memory limit, failed, cancelled by SIGTERM) lands in
//! `events.jsonl` as the orchestrator reads it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use facts::event::{Event, Phase, RunStatus};
use facts::run::Manifest;
use facts::{Input, Mode, ModelSpec, RunConfig, Spatial};

mod common;
use common::tiny_unet;

fn write_config(dir: &Path, cfg: &RunConfig) -> PathBuf {
    let path = dir.join(format!("{}.json", cfg.name));
    std::fs::write(&path, serde_json::to_string(cfg).unwrap()).unwrap();
    path
}

fn worker() -> Command {
    Command::new(env!("CARGO_BIN_EXE_worker"))
}

fn events(state: &Path, cfg: &RunConfig) -> Vec<Event> {
    let path = state.join(&cfg.experiment).join(cfg.events_rel());
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn result(events: &[Event]) -> (RunStatus, Option<Phase>, u64, Option<String>, facts::event::PhasePeaks) {
    match events.last() {
        Some(Event::Result { status, phase, peak_bytes, message, peaks, .. }) => {
            (*status, *phase, *peak_bytes, message.clone(), peaks.clone())
        }
        other => panic!("last event is not a result: {other:?}"),
    }
}

#[test]
fn ok_run_records_every_phase() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_unet("ok");
    let (status, ev) = common::run_worker(dir.path(), &cfg);
    assert_eq!(status.code(), Some(0));
    match &ev[0] {
        Event::Start { config, config_hash, env, .. } => {
            assert_eq!(config, "ok");
            assert_eq!(config_hash, &cfg.hash());
            assert_eq!(env.backend, "flex");
            assert_eq!(env.device, "cpu");
            assert_eq!(env.dtype, "f32");
            // The memory the run could use: its record's `device_memory_gb`.
            assert!(env.device_memory_bytes.is_some_and(|b| b > 0), "{env:?}");
        }
        other => panic!("first event is not start: {other:?}"),
    }
    let ended: Vec<Phase> = ev
        .iter()
        .filter_map(|e| match e {
            Event::PhaseEnd { phase, .. } => Some(*phase),
            _ => None,
        })
        .collect();
    assert_eq!(ended, Phase::ALL.to_vec());
    let steps: Vec<Option<u32>> = ev
        .iter()
        .filter_map(|e| match e {
            Event::PhaseEnd { step, .. } => Some(*step),
            _ => None,
        })
        .collect();
    assert_eq!(steps, [None, Some(0), Some(0), Some(0)], "model has no step; the profiled step is step 0");
    let (status, phase, peak, message, peaks) = result(&ev);
    assert_eq!(status, RunStatus::Ok);
    assert_eq!(phase, None);
    assert_eq!(message, None);
    // Every phase holds at least the fp32 weights; the step adds gradients and two moments.
    let weights = 4 * facts::params::count(&cfg.model, &cfg.input, cfg.out_channels).unwrap();
    assert!(peaks.model.unwrap() >= weights, "{peaks:?} vs {weights}");
    assert!(peaks.step.unwrap() >= 3 * weights, "{peaks:?} vs {weights}");
    assert_eq!(peak, [peaks.model, peaks.fwd, peaks.bwd, peaks.step].iter().flatten().copied().max().unwrap());
    // The same allocations as PyTorch's CUDA allocator counts them: every
    // tensor's block is at least the tensor (rounded up to 512 bytes), and
    // blocks, not the 2 MiB segments they come from (`memory_reserved`), are
    // counted: a few hundred bytes a tensor here (0.4% of the step, 3% of
    // the model's 2 MB), well under 10%.
    let Some(Event::Result { as_pytorch_counts: Some(counted), .. }) = ev.last() else {
        panic!("a CPU run counts its peaks as PyTorch would: {:?}", ev.last());
    };
    for (phase, exact, counted) in [
        ("model", peaks.model, counted.model),
        ("fwd", peaks.fwd, counted.fwd),
        ("bwd", peaks.bwd, counted.bwd),
        ("step", peaks.step, counted.step),
    ] {
        let (exact, counted) = (exact.unwrap(), counted.unwrap());
        assert!(counted > exact && counted < exact + exact / 10, "{phase}: {counted} counted, {exact} exact");
    }
}

/// `--protocol NAME` measures as that script of the group's did, and the
/// result carries the figures the script printed beside the phases' peaks:
/// the latent script's Model (held once built), Fwd, Bwd and Total as running
/// maxima; the transformer scripts' one peak from after the build. A run of
/// the project's protocol carries none.
#[test]
fn a_run_under_a_scripts_protocol_carries_the_figures_it_printed() {
    use facts::protocol::{GroupColumns, Protocol};
    let dir = tempfile::tempdir().unwrap();
    let group = |protocol: Protocol| {
        let cfg = RunConfig { name: format!("proto_{protocol}"), ..tiny_unet("proto") };
        let (out, ev) = common::run_worker_with(dir.path(), &cfg, &["--protocol", protocol.name()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let Some(Event::Result { status: RunStatus::Ok, group, peaks, .. }) = ev.last() else {
            panic!("{:?}", ev.last())
        };
        (*group, peaks.clone(), 4 * facts::params::count(&cfg.model, &cfg.input, cfg.out_channels).unwrap())
    };
    let (latent, p, weights) = group(Protocol::LatentUnet);
    let Some(GroupColumns { protocol: Protocol::LatentUnet, model: Some(model), fwd, bwd, total }) = latent else {
        panic!("{latent:?}")
    };
    assert!(model >= weights && model <= p.model.unwrap(), "held once built: {model} ({weights} of weights, {p:?})");
    assert_eq!(fwd, Some(p.model.unwrap().max(p.fwd.unwrap())));
    assert_eq!(bwd, Some(fwd.unwrap().max(p.bwd.unwrap())));
    assert_eq!(total, bwd.unwrap().max(p.step.unwrap()));
    let (transformer, p, _) = group(Protocol::Transformer);
    let t = transformer.expect("one figure");
    assert_eq!((t.model, t.fwd, t.bwd), (None, None, None));
    assert_eq!(t.total, p.fwd.unwrap().max(p.bwd.unwrap()).max(p.step.unwrap()));
    assert_eq!(group(Protocol::Project).0, None);
}

#[test]
fn memory_limit_is_recorded_as_oom() {
    let dir = tempfile::tempdir().unwrap();
    // Measure the run unlimited, then allow half of what it needs beyond the model phase.
    let free = tiny_unet("unlimited");
    let ok = worker()
        .args(["run", "--backend", "flex", "--config"])
        .arg(write_config(dir.path(), &free))
        .arg("--state-dir")
        .arg(dir.path())
        .status()
        .unwrap();
    assert_eq!(ok.code(), Some(0));
    let (_, _, full_peak, _, peaks) = result(&events(dir.path(), &free));
    let model = peaks.model.unwrap();
    assert!(full_peak > model + (1 << 16), "model {model} peak {full_peak}");
    let limit = model + (full_peak - model) / 2;

    let cfg = tiny_unet("oom");
    let out = worker()
        .args(["run", "--backend", "flex", "--config"])
        .arg(write_config(dir.path(), &cfg))
        .arg("--state-dir")
        .arg(dir.path())
        .args(["--memory-limit", &limit.to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let ev = events(dir.path(), &cfg);
    let (status, phase, peak, message, peaks) = result(&ev);
    assert_eq!(status, RunStatus::Oom);
    assert!(phase.is_some_and(|p| p != Phase::Model), "{phase:?}");
    assert!(peaks.model.is_some());
    assert!(peak >= model && peak <= limit, "peak {peak} limit {limit}");
    assert!(message.unwrap().contains("refused"));

    // The same limit from the manifest alone (`worker: {memory_limit}`, as
    // `submit` writes it), no flag: the job's own limit, also by hand.
    let cfg = tiny_unet("oom_from_manifest");
    let manifest = Manifest {
        experiment: cfg.experiment.clone(),
        task_offset: 0,
        configs_per_task: 1,
        memory_limit: Some(limit),
        configs: vec![cfg.clone()],
    };
    let mpath = dir.path().join("limited.json");
    std::fs::write(&mpath, serde_json::to_string(&manifest).unwrap()).unwrap();
    let fresh = tempfile::tempdir().unwrap();
    let out = worker()
        .args(["run", "--backend", "flex", "--task-id", "0", "--manifest"])
        .arg(&mpath)
        .arg("--state-dir")
        .arg(fresh.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let (status, _, peak, message, _) = result(&events(fresh.path(), &cfg));
    assert_eq!(status, RunStatus::Oom, "{message:?}");
    assert!(peak <= limit, "peak {peak} limit {limit}");
}

/// A node out of RAM with no `--memory-limit`: the system allocator returns
/// null (here because RLIMIT_AS caps the address space, as a cgroup or a full
/// node does), and the run is recorded `oom`, not aborted with nothing written.
#[test]
fn host_allocation_failure_without_a_limit_is_recorded_as_oom() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    // 32^3 tokens at patch 1 with the decomposed attention: one materialised
    // score tensor is 4 heads x 32768^2 x 4 bytes = 16 GiB, far above the 4 GiB
    // address space allowed.
    let cfg = RunConfig {
        name: "host_oom".into(),
        model: ModelSpec::Dit(facts::DitSpec {
            variant: None,
            hidden: Some(32),
            heads: Some(4),
            depth: Some(1),
            patch: 1,
        }),
        input: Input { channels: 1, spatial: Spatial::new(32, 32, 32) },
        ..tiny_unet("host_oom")
    };
    let mut cmd = worker();
    cmd.args(["run", "--backend", "flex", "--attention", "materialised", "--config"])
        .arg(write_config(dir.path(), &cfg))
        .arg("--state-dir")
        .arg(dir.path());
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: 4 << 30, rlim_max: 4 << 30 };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let (status, phase, peak, message, peaks) = result(&events(dir.path(), &cfg));
    assert_eq!(status, RunStatus::Oom);
    assert_eq!(phase, Some(Phase::Fwd));
    assert!(peaks.model.is_some() && peak > 0);
    let message = message.unwrap();
    assert!(message.contains("no limit set: the node ran out of memory"), "{message}");
}

#[test]
fn bad_shape_is_recorded_as_failed() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny_unet("bad");
    cfg.model =
        ModelSpec::Dit(facts::DitSpec { variant: None, hidden: Some(32), heads: Some(2), depth: Some(1), patch: 3 });
    let status = worker()
        .args(["run", "--backend", "flex", "--config"])
        .arg(write_config(dir.path(), &cfg))
        .arg("--state-dir")
        .arg(dir.path())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1));
    let (status, phase, _, message, _) = result(&events(dir.path(), &cfg));
    assert_eq!(status, RunStatus::Failed);
    assert_eq!(phase, Some(Phase::Model));
    assert!(message.unwrap().contains("does not divide"));
}

/// Train mode numbers each step's phases, so a later step's seconds can be
/// set against the first's (which include compiling the kernels on a GPU).
#[test]
fn train_steps_number_their_phases() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny_unet("two-steps");
    cfg.mode = Mode::Train;
    cfg.steps = 2;
    let (status, events) = common::run_worker(dir.path(), &cfg);
    assert_eq!(status.code(), Some(0));
    let ended: Vec<(Phase, Option<u32>)> = events
        .iter()
        .filter_map(|e| match e {
            Event::PhaseEnd { phase, step, seconds, .. } => {
                assert!(*seconds >= 0.0);
                Some((*phase, *step))
            }
            _ => None,
        })
        .collect();
    let (f, b, s) = (Phase::Fwd, Phase::Bwd, Phase::Step);
    assert_eq!(
        ended,
        [(Phase::Model, None), (f, Some(0)), (b, Some(0)), (s, Some(0)), (f, Some(1)), (b, Some(1)), (s, Some(1))]
    );
}

#[test]
fn sigterm_is_recorded_as_cancelled_after_heartbeats() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny_unet("killed");
    cfg.mode = Mode::Train;
    cfg.steps = 1_000_000; // runs until killed
    let manifest = Manifest {
        experiment: "demo".into(),
        task_offset: 5,
        configs_per_task: 1,
        memory_limit: None,
        configs: vec![tiny_unet("other"), cfg.clone()],
    };
    let mpath = dir.path().join("manifest.json");
    std::fs::write(&mpath, serde_json::to_string(&manifest).unwrap()).unwrap();
    let mut child = worker()
        .args(["run", "--backend", "flex", "--manifest"])
        .arg(&mpath)
        .arg("--state-dir")
        .arg(dir.path())
        .env("SLURM_ARRAY_TASK_ID", "6")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let beats = events(dir.path(), &cfg).iter().filter(|e| matches!(e, Event::Heartbeat { .. })).count();
        if beats >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no heartbeat within 120 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: signalling our own child process by its id.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    let ev = events(dir.path(), &cfg);
    match &ev[0] {
        Event::Start { env, .. } => assert_eq!(env.slurm_array_task_id.as_deref(), Some("6")),
        other => panic!("{other:?}"),
    }
    let (status, phase, _, message, _) = result(&ev);
    assert_eq!(status, RunStatus::Cancelled);
    assert!(phase.is_some());
    assert!(message.unwrap().contains("signal 15"));
    // The manifest's other config was not run.
    assert!(events(dir.path(), &tiny_unet("other")).is_empty());
}

/// A crash inside native code (a GPU driver's shader compiler segfaulting, a
/// C++ abort) still leaves a `failed` result naming the signal and the phase,
/// and the process still dies of that signal so SLURM sees the crash. The
/// signal is real, sent from outside while the run is inside a phase.
#[test]
fn crash_signals_are_recorded_as_failed_with_the_signal() {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    for (sig, name) in [(libc::SIGSEGV, "SIGSEGV"), (libc::SIGABRT, "SIGABRT"), (libc::SIGBUS, "SIGBUS")] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = tiny_unet(&format!("crash-{name}"));
        cfg.mode = Mode::Train;
        cfg.steps = 1_000_000; // runs until the signal
        let path = write_config(dir.path(), &cfg);
        let mut cmd = worker();
        cmd.args(["run", "--backend", "flex", "--config"])
            .arg(&path)
            .arg("--state-dir")
            .arg(dir.path())
            .stderr(Stdio::null());
        // SAFETY: setrlimit is async-signal-safe; no core file for this deliberate crash.
        unsafe {
            cmd.pre_exec(|| {
                let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                libc::setrlimit(libc::RLIMIT_CORE, &none);
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        while !events(dir.path(), &cfg).iter().any(|e| matches!(e, Event::PhaseEnd { phase: Phase::Fwd, .. })) {
            assert!(Instant::now() < deadline, "no forward phase within 120 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: signalling our own child process by its id.
        unsafe { libc::kill(child.id() as i32, sig) };
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(sig), "{name}: the process dies of the signal ({status:?})");
        let (status, phase, _, message, peaks) = result(&events(dir.path(), &cfg));
        assert_eq!(status, RunStatus::Failed, "{name}");
        assert!(phase.is_some(), "{name}");
        let message = message.unwrap();
        assert!(message.contains(name) && message.contains(" phase"), "{name}: {message}");
        assert!(peaks.model.is_some() && peaks.fwd.is_some(), "{name}: closed phases keep their peaks: {peaks:?}");
    }
}

/// Every phase reads a value back from the device and says so in its
/// `phase_end`: a run is `ok` only when every phase's value came back.
#[test]
fn every_phase_reads_a_value_back() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_unet("readback");
    let path = write_config(dir.path(), &cfg);
    let status = worker()
        .args(["run", "--backend", "flex", "--config"])
        .arg(&path)
        .arg("--state-dir")
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let ev = events(dir.path(), &cfg);
    let readbacks: Vec<(Phase, f64)> = ev
        .iter()
        .filter_map(|e| match e {
            Event::PhaseEnd { phase, readback, .. } => Some((*phase, readback.expect("every phase reads back"))),
            _ => None,
        })
        .collect();
    assert_eq!(readbacks.iter().map(|(p, _)| *p).collect::<Vec<_>>(), Phase::ALL);
    assert!(readbacks.iter().all(|(_, v)| v.is_finite()), "{readbacks:?}");
    // The step changed the parameters: their checksums before and after differ.
    assert_ne!(readbacks[0].1, readbacks[3].1);
    // A gradient norm is positive.
    assert!(readbacks[2].1 > 0.0);
}

/// `worker fidelity --json` writes each row with the figure it is scored on,
/// `on_card_gib`: the counted peak of each phase plus the cuBLAS workspaces
/// the record's card (an A100: 8.125 MiB each) holds in it, the largest.
#[test]
fn fidelity_json_rows_carry_the_peak_on_the_record_s_card() {
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("records.jsonl");
    std::fs::write(
        &records,
        r#"{"id":"u","family":"unet","framework":"pytorch","gpu":"A100-SXM4-80GB","precision":"bf16-amp","grad_ckpt":false,"batch":1,"in_channels":1,"out_channels":1,"spatial":[8,8,8],"channels":[8,16],"attention_levels":[false,false],"num_res_blocks":[1,1],"num_head_channels":8,"peak_gb":0.5,"status":"ok"}"#,
    )
    .unwrap();
    let rows = dir.path().join("rows.jsonl");
    let out = worker()
        .args(["fidelity", "--backend", "flex", "--records"])
        .arg(&records)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--json")
        .arg(&rows)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&rows).unwrap();
    let row: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(row["status"], "ok", "{row}");
    let counted: Vec<f64> = row["counted_phases_gib"].as_array().unwrap().iter().map(|g| g.as_f64().unwrap()).collect();
    let workspace = 8.125 / 1024.0;
    let expected = [counted[0], counted[1] + workspace, counted[2] + 2.0 * workspace, counted[3] + 2.0 * workspace]
        .into_iter()
        .fold(f64::MIN, f64::max);
    let on_card = row["on_card_gib"].as_f64().unwrap_or_else(|| panic!("no on_card_gib in {row}"));
    assert!((on_card - expected).abs() < 1e-12, "{on_card} against {expected}: {row}");
}

/// docs/gpu.md's fidelity table is what `worker fidelity --from-json` makes
/// of the rows, predictions and earlier rows kept in docs/fidelity/, and of
/// PyTorch's own run of the same configs on the H200 (data/gpu-check/).
#[test]
fn the_fidelity_table_in_the_docs_comes_from_its_rows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = worker()
        .current_dir(&root)
        .args(["fidelity", "--backend", "flex", "--records", "data/vram-measurements.jsonl"])
        .args(["--from-json", "docs/fidelity/cpu-rows.jsonl", "--predictions", "docs/fidelity/predictions.jsonl"])
        .args(["--before", "docs/fidelity/before.jsonl", "--pytorch", "data/gpu-check/2026-11-26-h200/pytorch.jsonl"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(out.stdout).unwrap();
    let doc = std::fs::read_to_string(root.join("docs/gpu.md")).unwrap();
    assert!(table.lines().count() > 20 && table.contains("Against PyTorch's own run"), "{table}");
    assert!(doc.contains(table.trim()), "docs/gpu.md lacks the table the rows make:\n{table}");
}
