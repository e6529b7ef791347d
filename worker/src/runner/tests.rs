use super::failure::is_oom_message;
use super::*;
use std::sync::Mutex;

use facts::{Input, ModelSpec, PerLevel, Precision, Spatial, UnetSpec};

/// Runs in this process share [`PROGRESS`]: one at a time.
static ONE_RUN: Mutex<()> = Mutex::new(());

fn tiny_config() -> RunConfig {
    let unet = UnetSpec {
        channels: vec![8, 16],
        attention_levels: vec![false, false],
        num_res_blocks: PerLevel::All(1),
        num_head_channels: PerLevel::All(8),
        norm_num_groups: 4,
    };
    let input = Input { channels: 1, spatial: Spatial::new(4, 4, 4) };
    RunConfig { precision: Precision::Bf16, ..RunConfig::profile("unit", "setup", ModelSpec::Unet(unet), input) }
}

fn read_events(path: &Path) -> Vec<Event> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// A node without a GPU or driver: the backend panics while creating the
/// device (wgpu: no adapter). The run is recorded `failed` with the cause.
#[test]
fn device_setup_panic_is_recorded_as_failed() {
    let _one = ONE_RUN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_config();
    let opts = RunOptions::new(dir.path(), Backend::available()[0]);
    let out = run_with_setup(&cfg, &opts, || {
        panic!("No possible adapter available for backend. Falling back to first available.")
    })
    .unwrap();
    assert_eq!(out.result.status, RunStatus::Failed);
    assert_eq!(out.exit_code(), EXIT_FAILED);
    let msg = out.result.message.clone().unwrap();
    assert!(msg.starts_with("device setup panicked: No possible adapter"), "{msg}");
    let ev = read_events(&out.events);
    assert!(matches!(&ev[0], Event::Start { env, .. } if env.dtype == "bf16" && env.checkpointing.is_none()));
    match ev.last().unwrap() {
        Event::Result { status, message, peak_bytes, .. } => {
            assert_eq!(*status, RunStatus::Failed);
            assert!(message.as_deref().unwrap().contains("No possible adapter"));
            assert_eq!(*peak_bytes, 0);
        }
        other => panic!("{other:?}"),
    }
    // The outcome is the result line itself, read back through the spec's type
    // (its floats to within JSON's decimal round trip).
    let written = RunResult::try_from(ev.last().unwrap().clone()).expect("a result line");
    let r = out.result;
    assert!((written.t - r.t).abs() < 1e-6 && (written.wall_s - r.wall_s).abs() < 1e-9, "{written:?} vs {r:?}");
    let (t, wall_s) = (r.t, r.wall_s);
    assert_eq!(RunResult { t, wall_s, ..written }, r);
}

/// The backend panics on a thread of its own (CubeCL's device runner, as on
/// the H100 check of 2026-11-27) and the thread that asked sees only its
/// channel close: the result names the first panic, its thread and place,
/// never a bare `RecvError`.
#[test]
fn a_panic_on_the_backend_s_own_thread_is_the_recorded_cause() {
    let _one = ONE_RUN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let opts = RunOptions::new(dir.path(), Backend::available()[0]);
    let out = run_with_setup(&tiny_config(), &opts, || {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let runner = std::thread::Builder::new()
            .name("DSD-4-8192".into())
            .spawn(move || {
                let _tx = tx;
                panic!("Unable to acquire wgpu device: AdapterUnavailable {{ message: \"no adapter found\" }}")
            })
            .unwrap();
        let _ = runner.join();
        rx.recv().unwrap();
        unreachable!("the channel closed")
    })
    .unwrap();
    assert_eq!(out.result.status, RunStatus::Failed);
    let msg = out.result.message.unwrap();
    assert!(
        msg.starts_with("device setup panicked: Unable to acquire wgpu device: AdapterUnavailable"),
        "the backend thread's panic comes first: {msg}"
    );
    assert!(msg.contains("panicked on thread 'DSD-4-8192' at worker/src/runner/tests.rs:"), "{msg}");
    assert!(msg.ends_with("then on this thread: called `Result::unwrap()` on an `Err` value: RecvError)"), "{msg}");
}

/// A panic before the run, or on another thread before its watch began, is
/// no run's cause: a setup that fails on its own thread keeps its own message.
#[test]
fn a_panic_before_the_run_is_not_its_cause() {
    let _one = ONE_RUN.lock().unwrap_or_else(|p| p.into_inner());
    let _ = std::thread::spawn(|| panic!("an earlier panic elsewhere")).join();
    let dir = tempfile::tempdir().unwrap();
    let opts = RunOptions::new(dir.path(), Backend::available()[0]);
    let out = run_with_setup(&tiny_config(), &opts, || panic!("no device here")).unwrap();
    assert_eq!(out.result.message.as_deref(), Some("device setup panicked: no device here"));
}

/// A driver that answers but refuses the configuration: `failed`, with the error.
#[test]
fn device_setup_error_is_recorded_as_failed() {
    let _one = ONE_RUN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_config();
    let opts = RunOptions::new(dir.path(), Backend::available()[0]);
    let out =
        run_with_setup(&cfg, &opts, || Err(backend::BackendError::Configure("driver 470 too old".into()))).unwrap();
    assert_eq!(out.result.status, RunStatus::Failed);
    assert_eq!(
        out.result.message.as_deref(),
        Some("device setup failed: cannot configure the device's float dtype: driver 470 too old")
    );
    assert_eq!(read_events(&out.events).len(), 2);
}

/// A driver that crashes while the device is created (SIGSEGV inside
/// `vkCreateDevice`): the crash handlers are in place before setup, so the
/// run still ends with a `failed` result that names the signal and device
/// setup (no phase had begun), and the process still dies of the signal. The
/// crash happens in a child: this test binary run again on this test alone.
#[test]
fn a_crash_during_device_setup_is_recorded_as_failed() {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    const CHILD: &str = "SWEEP_WORKER_TEST_SETUP_CRASH_DIR";
    if let Ok(dir) = std::env::var(CHILD) {
        let opts = RunOptions::new(Path::new(&dir), Backend::available()[0]);
        let _ = run_with_setup(&tiny_config(), &opts, || {
            // SAFETY: raising a signal in this child process, as a faulting driver would.
            unsafe { libc::raise(libc::SIGSEGV) };
            unreachable!("the crash handler re-raises SIGSEGV with its default action")
        });
        unreachable!("the child dies of SIGSEGV");
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child
        .args(["--exact", "runner::tests::a_crash_during_device_setup_is_recorded_as_failed", "--nocapture"])
        .env(CHILD, dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: setrlimit is async-signal-safe; no core file for this deliberate crash.
    unsafe {
        child.pre_exec(|| {
            let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            Ok(())
        });
    }
    let status = child.status().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGSEGV), "the child dies of the signal: {status:?}");
    let events = read_events(&events_path(dir.path(), &tiny_config()));
    match events.as_slice() {
        [Event::Result { status, phase, message, .. }] => {
            assert_eq!(*status, RunStatus::Failed);
            assert_eq!(*phase, None, "no phase had begun");
            let message = message.as_deref().unwrap();
            assert!(message.contains("SIGSEGV") && message.contains("in device setup"), "{message}");
        }
        other => panic!("one result line, the start not yet written: {other:?}"),
    }
}

/// CubeCL's out-of-memory errors and panics, as its error types print them
/// (cubecl-runtime 0.11 `IoError`/`LaunchError`), are `oom`; the backtrace
/// CubeCL appends stays out of the result.
#[test]
fn cubecl_out_of_memory_is_oom_without_its_backtrace() {
    for text in [
        "out of device memory allocating 85899345920 bytes\nBacktrace\n   0: cubecl_runtime::server",
        "An out-of-memory error happened during launch\nCaused by:\n  pool exhausted\nBacktrace\nframes",
        "can't allocate buffer of size: 137438953472\n",
    ] {
        let (status, msg) = classify(text);
        assert_eq!(status, RunStatus::Oom, "{text}");
        assert!(!msg.contains("Backtrace") && !msg.contains('\n'), "{msg}");
    }
    assert_eq!(classify("shape mismatch in matmul").0, RunStatus::Failed);
}

/// The read-back's error when a buffer could not be allocated, as lavapipe's
/// run of a 1 GiB score tensor printed it (recorded; the Vulkan test makes it
/// for real): `oom`, with the root cause and the kernels skipped for it.
#[test]
fn a_failed_buffer_found_by_the_read_back_is_oom_with_its_root_cause() {
    let text = "fwd phase: reading back the output mean: An error happened during execution
Caused by:
  Several failures at once
Caused by:
  The bytes were never written (failure #121, still claiming 22 buffer(s))
  skipped `ReduceKernel`: it needed memory ManagedMemoryId { value: 492 }, which carried the failure
  skipped `KernelBinop`: it needed memory ManagedMemoryId { value: 452 }, which carried the failure
  skipped `MatmulEntry`: it needed memory ManagedMemoryId { value: 449 }, which carried the failure
  (63 older skip record(s) were dropped; the walk may stop before the root)
Caused by:
  An IO error happened
Caused by:
  can't allocate buffer of size: 1073741824
No backtrace available
Asked at:
No backtrace available";
    let (status, msg) = classify(text);
    assert_eq!(status, RunStatus::Oom);
    assert_eq!(
        msg,
        "fwd phase: reading back the output mean: An error happened during execution: can't allocate buffer of \
         size: 1073741824 (kernels skipped for it: ReduceKernel, KernelBinop, MatmulEntry)"
    );
}

/// An OOM in the middle of a phase keeps the phase and the peak it reached
/// (the open window of the pool sampler), besides the phases already closed.
#[test]
fn gpu_oom_result_carries_phase_and_peak_reached() {
    let _one = ONE_RUN.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let log = EventLog::open(&dir.path().join("events.jsonl")).unwrap();
    PROGRESS.finished.store(false, Ordering::SeqCst);
    for p in &PROGRESS.peaks {
        p.store(NONE, Ordering::Relaxed);
    }
    PROGRESS.peaks[0].store(10 << 30, Ordering::Relaxed);
    PROGRESS.phase.store(phase_index(Phase::Fwd) as u8, Ordering::Relaxed);
    let out = finish(
        &log,
        log.path(),
        7,
        now(),
        Measured { live_peak: 79 << 30, ..Measured::default() },
        Err(classify("out of device memory allocating 4294967296 bytes")),
    )
    .unwrap();
    let r = &out.result;
    assert_eq!(r.status, RunStatus::Oom);
    assert_eq!(r.phase, Some(Phase::Fwd));
    assert_eq!(r.peaks.model, Some(10 << 30));
    assert_eq!(r.peaks.fwd, Some(79 << 30));
    assert_eq!(r.peak_bytes, 79 << 30);
}

#[test]
fn oom_messages_are_recognised() {
    assert!(is_oom_message("CUDA error: out of memory"));
    assert!(is_oom_message("Memory allocation failed: OutOfMemory"));
    assert!(!is_oom_message("dimension mismatch in reshape"));
}
