//! NVML, the driver's own view of GPU memory: the device's name, driver and
//! total memory for the run header, and the memory this process uses as a
//! second meter beside CubeCL's pool (it also counts the pool's reserved but
//! unused pages and the driver's context, so it reads higher; both are kept).
//!
//! libnvidia-ml is loaded at run time: a node without the driver simply has
//! no NVML figures, never a failed run.

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::{Device, Nvml};

/// An open NVML handle on the GPU this process sees first.
pub struct NvmlProbe {
    nvml: Nvml,
    /// `CUDA_VISIBLE_DEVICES`'s first entry (index or UUID), else GPU 0.
    selector: Option<String>,
    pid: u32,
    /// Device memory in use before the run started: the fallback when the
    /// driver lists no process of ours (a PID namespace hides it in containers).
    baseline_used: u64,
}

impl NvmlProbe {
    pub fn open() -> Option<NvmlProbe> {
        let nvml = Nvml::init().ok()?;
        // NVML ignores CUDA_VISIBLE_DEVICES: the process's first visible GPU is
        // the first entry there, else physical GPU 0.
        let selector = std::env::var("CUDA_VISIBLE_DEVICES")
            .ok()
            .and_then(|v| v.split(',').next().map(|s| s.trim().to_string()))
            .filter(|s| !s.is_empty());
        let mut probe = NvmlProbe { nvml, selector, pid: std::process::id(), baseline_used: 0 };
        probe.baseline_used = probe.device()?.memory_info().ok()?.used;
        Some(probe)
    }

    fn device(&self) -> Option<Device<'_>> {
        match &self.selector {
            Some(s) => match s.parse::<u32>() {
                Ok(i) => self.nvml.device_by_index(i).ok(),
                Err(_) => self.nvml.device_by_uuid(s.as_str()).ok(),
            },
            None => self.nvml.device_by_index(0).ok(),
        }
    }

    /// The GPU's name, the driver version and the device's total memory.
    pub fn describe(&self) -> Option<(String, Option<String>, Option<u64>)> {
        let d = self.device()?;
        Some((d.name().ok()?, self.nvml.sys_driver_version().ok(), d.memory_info().ok().map(|m| m.total)))
    }

    /// Bytes this process uses on the device: its entry among the compute and
    /// graphics processes (Vulkan contexts are graphics), else the device's
    /// used memory less what was used before the run.
    pub fn used_by_this_process(&self) -> Option<u64> {
        self.used_by(&[self.pid])
    }

    /// Bytes the processes `pids` use on the device (`worker watch`: the
    /// watched command's process tree), summed over their entries among the
    /// compute and graphics processes; where the driver lists none of them
    /// (none has touched the GPU yet, or a PID namespace hides them), the
    /// device's used memory less what was used when this probe opened.
    pub fn used_by(&self, pids: &[u32]) -> Option<u64> {
        let d = self.device()?;
        let sum = |list: Vec<nvml_wrapper::struct_wrappers::device::ProcessInfo>| {
            let bytes: Vec<u64> = list
                .into_iter()
                .filter(|p| pids.contains(&p.pid))
                .filter_map(|p| match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                })
                .collect();
            (!bytes.is_empty()).then(|| bytes.iter().sum::<u64>())
        };
        if let Some(b) = d.running_compute_processes().ok().and_then(sum) {
            return Some(b);
        }
        if let Some(b) = d.running_graphics_processes().ok().and_then(sum) {
            return Some(b);
        }
        d.memory_info().ok().map(|m| m.used.saturating_sub(self.baseline_used))
    }
}
