//! Memory measurement, one interface over two sources.
//!
//! - CPU backends: the tracking global allocator ([`crate::alloc`]): exact live
//!   bytes and an exact peak.
//! - GPU backends: the CubeCL memory pool's bytes in use (allocations plus their
//!   padding, the analogue of `torch.cuda.memory_allocated`), sampled every few
//!   milliseconds on a background thread because Burn keeps no peak counter. A
//!   sample is also taken at every phase boundary after a device sync, so a
//!   phase's end state is never missed; a short spike between samples can be.
//!   With the `nvml` feature the same thread samples NVML's used memory of
//!   this process as a second meter (the driver's view, see [`crate::nvml`]).
//!   CubeCL 0.11 keeps no pool high-water mark, so sampling is the only way.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use burn::prelude::*;
use facts::event::MemoryMeter;

use crate::alloc;

/// NVML sampled every this many pool samples (an NVML query costs ~0.1 ms).
#[cfg(feature = "nvml")]
const NVML_EVERY: u32 = 4;

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
    /// NVML's used bytes of this process, peak of the window (0 = never read).
    nvml_peak: Arc<AtomicU64>,
    #[cfg(feature = "nvml")]
    nvml: Option<Arc<crate::nvml::NvmlProbe>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PoolSampler {
    fn sample_nvml(&self) {
        #[cfg(feature = "nvml")]
        if let Some(b) = self.nvml.as_ref().and_then(|n| n.used_by_this_process()) {
            self.nvml_peak.fetch_max(b, Ordering::Relaxed);
        }
    }
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
        let nvml_peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        #[cfg(feature = "nvml")]
        let nvml = crate::nvml::NvmlProbe::open().map(Arc::new);
        let thread = {
            let (device, current, peak, stop) = (device.clone(), current.clone(), peak.clone(), stop.clone());
            #[cfg(feature = "nvml")]
            let (nvml, nvml_peak) = (nvml.clone(), nvml_peak.clone());
            std::thread::Builder::new()
                .name("pool-sampler".into())
                .spawn(move || {
                    #[cfg(feature = "nvml")]
                    let mut tick = 0u32;
                    while !stop.load(Ordering::Relaxed) {
                        let now = pool_bytes(&device);
                        current.store(now, Ordering::Relaxed);
                        peak.fetch_max(now, Ordering::Relaxed);
                        if let Some(l) = limit {
                            if now > l {
                                over_limit(0, now);
                            }
                        }
                        #[cfg(feature = "nvml")]
                        {
                            tick = tick.wrapping_add(1);
                            if tick.is_multiple_of(NVML_EVERY) {
                                if let Some(b) = nvml.as_ref().and_then(|n| n.used_by_this_process()) {
                                    nvml_peak.fetch_max(b, Ordering::Relaxed);
                                }
                            }
                        }
                        std::thread::sleep(SAMPLE_EVERY);
                    }
                })
                .ok()
        };
        Meter::Pool(PoolSampler {
            device: device.clone(),
            current,
            peak,
            nvml_peak,
            #[cfg(feature = "nvml")]
            nvml,
            stop,
            thread,
        })
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

    /// What `peak` measures.
    pub fn kind(&self) -> MemoryMeter {
        match self {
            Meter::Host => MemoryMeter::HostAllocator,
            Meter::Pool(_) => MemoryMeter::CubeclPool,
        }
    }

    /// NVML's peak of this window, where NVML is compiled in and answers.
    pub fn nvml_peak(&self) -> Option<u64> {
        match self {
            Meter::Pool(p) => Some(p.nvml_peak.load(Ordering::Relaxed)).filter(|&b| b > 0),
            Meter::Host => None,
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
                p.nvml_peak.store(0, Ordering::Relaxed);
                p.sample_nvml();
            }
        }
    }

    /// Take a sample now (after the caller synced the device).
    pub fn sample(&self) {
        if let Meter::Pool(p) = self {
            let now = pool_bytes(&p.device);
            p.current.store(now, Ordering::Relaxed);
            p.peak.fetch_max(now, Ordering::Relaxed);
            p.sample_nvml();
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
