//! The `start` event's environment: the host, the device as set up, and
//! what the run was asked for.

use std::panic::{catch_unwind, AssertUnwindSafe};

use facts::event::{DtypePolicy, MemoryMeter, RunEnvironment};
use facts::RunConfig;

use super::{attention_of, checkpointing_of, RunOptions};
use crate::backend;

pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or truncates.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "unknown".into()
    }
}

/// The `start` event's environment: the device as set up, or what was asked
/// for when setup failed (`prepared` holds the failure's message then).
pub(super) fn run_environment(
    cfg: &RunConfig,
    opts: &RunOptions,
    prepared: &Result<backend::Prepared, String>,
) -> RunEnvironment {
    let requested = backend::compute_dtype(cfg.precision);
    let (device_name, driver, device_memory) = match prepared {
        Ok(p) => catch_unwind(AssertUnwindSafe(|| backend::describe(opts.backend, &p.device)))
            .unwrap_or_else(|_| (opts.backend.name().to_string(), None, None)),
        Err(_) => (opts.backend.name().to_string(), None, None),
    };
    RunEnvironment {
        host: hostname(),
        device: device_name,
        driver,
        backend: opts.backend.name().to_string(),
        dtype: backend::dtype_name(prepared.as_ref().map(|p| p.dtype).unwrap_or(requested)).to_string(),
        grad_ckpt: cfg.grad_ckpt,
        requested_dtype: prepared
            .as_ref()
            .ok()
            .and_then(|p| p.fell_back_from)
            .map(|d| backend::dtype_name(d).to_string()),
        checkpointing: prepared.as_ref().ok().map(|_| checkpointing_of(cfg)),
        dtype_policy: prepared.as_ref().ok().map(|p| {
            if p.autocast.is_some() {
                DtypePolicy::Autocast
            } else {
                DtypePolicy::Uniform
            }
        }),
        attention: Some(attention_of(cfg, opts)),
        meter: Some(if opts.backend.is_gpu() { MemoryMeter::CubeclPool } else { MemoryMeter::HostAllocator }),
        device_memory_bytes: device_memory,
        memory_limit_bytes: opts.memory_limit,
        kernel_cache: opts.kernel_cache,
        slurm_job_id: std::env::var("SLURM_JOB_ID").ok(),
        slurm_array_task_id: std::env::var("SLURM_ARRAY_TASK_ID").ok(),
        chain: None,
    }
}
