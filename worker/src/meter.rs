//! Memory measurement, one interface over two sources.
//!
//! - CPU backends: the tracking global allocator ([`crate::alloc`]): exact live
//!   bytes and an exact peak.
//! - GPU backends: the CubeCL memory pool's bytes in use (allocations plus their
//!   padding, the analogue of `torch.cuda.memory_allocated`), sampled every few
//!   milliseconds on a background thread because Burn keeps no peak counter. A
//!   sample is also taken at every phase boundary after a device sync, so a
//!   phase's end state is never missed; a short spike between samples can be.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use burn::prelude::*;

use crate::alloc;

/// Interval of the GPU pool sampler.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);

pub enum Meter {
    Host,
    Pool(PoolSampler),
}

pub struct PoolSampler {
    device: Device,
    current: Arc<AtomicU64>,
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn pool_bytes(device: &Device) -> u64 {
    device.memory_pool_usage().map(|u| u.bytes_in_use + u.bytes_padding).unwrap_or(0)
}

impl Meter {
    /// The host allocator for CPU backends; a pool sampler for GPU ones.
    /// `over_limit` runs on the sampler thread when pool usage exceeds `limit`.
    pub fn new(gpu: bool, device: &Device, limit: Option<u64>, over_limit: alloc::OomHook) -> Meter {
        if !gpu {
            return Meter::Host;
        }
        let current = Arc::new(AtomicU64::new(0));
        let peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (device, current, peak, stop) = (device.clone(), current.clone(), peak.clone(), stop.clone());
            std::thread::Builder::new()
                .name("pool-sampler".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let now = pool_bytes(&device);
                        current.store(now, Ordering::Relaxed);
                        peak.fetch_max(now, Ordering::Relaxed);
                        if let Some(l) = limit {
                            if now > l {
                                over_limit(0, now);
                            }
                        }
                        std::thread::sleep(SAMPLE_EVERY);
                    }
                })
                .ok()
        };
        Meter::Pool(PoolSampler { device: device.clone(), current, peak, stop, thread })
    }

    pub fn current(&self) -> u64 {
        match self {
            Meter::Host => alloc::current(),
            Meter::Pool(p) => p.current.load(Ordering::Relaxed),
        }
    }

    pub fn peak(&self) -> u64 {
        match self {
            Meter::Host => alloc::peak(),
            Meter::Pool(p) => p.peak.load(Ordering::Relaxed),
        }
    }

    /// Start a new peak window at the current usage.
    pub fn reset_peak(&self) {
        match self {
            Meter::Host => alloc::reset_peak(),
            Meter::Pool(p) => {
                let now = pool_bytes(&p.device);
                p.current.store(now, Ordering::Relaxed);
                p.peak.store(now, Ordering::Relaxed);
            }
        }
    }

    /// Take a sample now (after the caller synced the device).
    pub fn sample(&self) {
        if let Meter::Pool(p) = self {
            let now = pool_bytes(&p.device);
            p.current.store(now, Ordering::Relaxed);
            p.peak.fetch_max(now, Ordering::Relaxed);
        }
    }
}

impl Drop for PoolSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// NVML's name of GPU 0 and the driver version (loads libnvidia-ml at run time).
#[cfg(feature = "nvml")]
pub fn nvml_describe() -> Option<(String, Option<String>)> {
    let nvml = nvml_wrapper::Nvml::init().ok()?;
    // NVML ignores CUDA_VISIBLE_DEVICES: the process's first visible GPU is the
    // first entry there (an index or a UUID), else physical GPU 0.
    let first = std::env::var("CUDA_VISIBLE_DEVICES")
        .ok()
        .and_then(|v| v.split(',').next().map(|s| s.trim().to_string()))
        .filter(|s| !s.is_empty());
    let device = match first {
        Some(s) => match s.parse::<u32>() {
            Ok(i) => nvml.device_by_index(i).ok()?,
            Err(_) => nvml.device_by_uuid(s.as_str()).ok()?,
        },
        None => nvml.device_by_index(0).ok()?,
    };
    let name = device.name().ok()?;
    Some((name, nvml.sys_driver_version().ok()))
}
