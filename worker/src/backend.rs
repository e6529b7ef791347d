//! Backend selection at run time.
//!
//! - `flex` (default feature): Burn's pure-Rust CPU backend, for tests and the
//!   local demo. Memory is measured exactly by the tracking allocator.
//! - `vulkan` / `wgpu` (cargo features): the GPU backends that build offline.
//!   On NVIDIA both run through the Vulkan driver; `vulkan` compiles CubeCL's
//!   kernels to SPIR-V, `wgpu` to WGSL. Neither reported bf16 on an H100
//!   (driver 580): a bf16 run falls back to f32 and says so.
//! - `cuda` (cargo feature): CubeCL's CUDA runtime. Same code path; it builds
//!   only where cargo may download CubeCL's LLVM bundle at build time (a login
//!   node with network), never in this project's CI. See worker/README.md.
//!
//! Memory on GPU is the CubeCL pool's bytes in use, sampled on a background
//! thread (no peak counter exists), plus NVML with the `nvml` feature.

use burn::prelude::*;
use burn::tensor::FloatDType;
use facts::Precision;

/// A backend this build can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    #[cfg(feature = "flex")]
    Flex,
    #[cfg(feature = "wgpu")]
    Wgpu,
    #[cfg(feature = "vulkan")]
    Vulkan,
    #[cfg(feature = "cuda")]
    Cuda,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(
        "this worker was built without the `{0}` backend (it has: {1}); build one with it: \
         cargo build -p worker --release --features {0} (worker/README.md lists the backends)"
    )]
    Unknown(String, String),
    #[error("cannot configure the device's float dtype: {0}")]
    Configure(String),
}

impl Backend {
    /// Every backend compiled into this binary, default first.
    pub fn available() -> Vec<Backend> {
        vec![
            #[cfg(feature = "flex")]
            Backend::Flex,
            #[cfg(feature = "wgpu")]
            Backend::Wgpu,
            #[cfg(feature = "vulkan")]
            Backend::Vulkan,
            #[cfg(feature = "cuda")]
            Backend::Cuda,
        ]
    }

    pub fn name(self) -> &'static str {
        match self {
            #[cfg(feature = "flex")]
            Backend::Flex => "flex",
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => "wgpu",
            #[cfg(feature = "vulkan")]
            Backend::Vulkan => "vulkan",
            #[cfg(feature = "cuda")]
            Backend::Cuda => "cuda",
        }
    }

    pub fn parse(name: &str) -> Result<Backend, BackendError> {
        Backend::available().into_iter().find(|b| b.name() == name).ok_or_else(|| {
            let names: Vec<&str> = Backend::available().iter().map(|b| b.name()).collect();
            BackendError::Unknown(name.to_string(), names.join(", "))
        })
    }

    /// The default: the first GPU backend compiled in, else the CPU.
    pub fn default_for_build() -> Option<Backend> {
        let all = Backend::available();
        all.iter().copied().find(|b| b.is_gpu()).or_else(|| all.first().copied())
    }

    pub fn is_gpu(self) -> bool {
        match self {
            #[cfg(feature = "flex")]
            Backend::Flex => false,
            #[allow(unreachable_patterns)]
            _ => true,
        }
    }

    /// The raw (non-autodiff) device.
    pub fn device(self) -> Device {
        match self {
            #[cfg(feature = "flex")]
            Backend::Flex => Device::flex(),
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
            #[cfg(feature = "vulkan")]
            Backend::Vulkan => Device::vulkan(burn::tensor::DeviceKind::DefaultDevice),
            #[cfg(feature = "cuda")]
            Backend::Cuda => Device::cuda(0),
        }
    }
}

/// The float dtype the device runs at and, for the AMP precisions, the half
/// type autocast computes in (see [`crate::models::amp`]). `bf16` and `fp16`
/// run uniformly in that type, weights included; `bf16-amp` and `fp16-amp`
/// keep f32 parameters and optimizer state as PyTorch's autocast does.
pub fn dtypes(p: Precision) -> (FloatDType, Option<FloatDType>) {
    match p {
        Precision::Fp32 => (FloatDType::F32, None),
        Precision::Bf16 => (FloatDType::BF16, None),
        Precision::Bf16Amp => (FloatDType::F32, Some(FloatDType::BF16)),
        Precision::Fp16Amp => (FloatDType::F32, Some(FloatDType::F16)),
    }
}

/// The dtype a precision computes in: the half type under AMP, else the device's.
pub fn compute_dtype(p: Precision) -> FloatDType {
    let (device, half) = dtypes(p);
    half.unwrap_or(device)
}

pub fn dtype_name(d: FloatDType) -> &'static str {
    match d {
        FloatDType::F64 => "f64",
        FloatDType::F32 | FloatDType::Flex32 => "f32",
        FloatDType::F16 => "f16",
        FloatDType::BF16 => "bf16",
    }
}

/// A device ready for a run, and what it really runs.
pub struct Prepared {
    pub device: Device,
    /// The type the run computes in: the device's, or autocast's half type.
    pub dtype: FloatDType,
    /// Set when the device cannot compute in the requested dtype and runs another.
    pub fell_back_from: Option<FloatDType>,
    /// Autocast's half type (AMP precisions); the device then holds f32.
    pub autocast: Option<FloatDType>,
}

/// Configure the device: float dtype, autodiff on (checkpointing is the
/// models' own, per block, see `models::checkpoint`). A half type the backend cannot compute in falls
/// back: under autocast bf16 → f16 (the same bytes), else f32; the start event
/// says so. Must run before the first tensor on the device. Device creation
/// may panic (no adapter, no driver): the runner calls this inside its panic guard.
pub fn prepare(backend: Backend, precision: Precision) -> Result<Prepared, BackendError> {
    let mut device = backend.device();
    let (storage, half) = dtypes(precision);
    let wanted = half.unwrap_or(storage);
    let (storage, autocast) = match half {
        None => (if device.supports_dtype(storage) { storage } else { FloatDType::F32 }, None),
        Some(h) if device.supports_dtype(h) => (storage, Some(h)),
        Some(FloatDType::BF16) if device.supports_dtype(FloatDType::F16) => (storage, Some(FloatDType::F16)),
        Some(_) => (storage, None),
    };
    let dtype = autocast.unwrap_or(storage);
    let requested = dtypes(precision).0;
    match CONFIGURED.get() {
        Some(done) if *done == requested => {} // an earlier config of this task set the same
        Some(done) => {
            return Err(BackendError::Configure(format!(
                "this process's device stores {done:?}; a config storing {requested:?} needs a process of its own"
            )))
        }
        None => {
            device.configure(storage).map_err(|e| BackendError::Configure(format!("{e:?}")))?;
            let _ = CONFIGURED.set(requested);
        }
    }
    let device = device.autodiff();
    Ok(Prepared { device, dtype, fell_back_from: (dtype != wanted).then_some(wanted), autocast })
}

/// The storage type (as a precision asks for it) this process configured its
/// device with. Burn sets a device's float type once per process
/// (`AlreadyInitialized` after), so a task's later config of another storage
/// type runs in a fresh process ([`crate::task`]).
static CONFIGURED: std::sync::OnceLock<FloatDType> = std::sync::OnceLock::new();

/// Whether a config of `precision` can run in this process after what ran before.
pub fn fits_this_process(precision: Precision) -> bool {
    CONFIGURED.get().is_none_or(|done| *done == dtypes(precision).0)
}

/// The device for the run header: name, driver version, total memory.
pub fn describe(backend: Backend, device: &Device) -> (String, Option<String>, Option<u64>) {
    #[cfg(feature = "nvml")]
    if backend.is_gpu() {
        if let Some(found) = crate::nvml::NvmlProbe::open().and_then(|n| n.describe()) {
            return found;
        }
    }
    if !backend.is_gpu() {
        return ("cpu".to_string(), None, host_memory_bytes());
    }
    #[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda"))]
    if let Some(id) = device.identity() {
        return (id.name, None, None);
    }
    let _ = device;
    (backend.name().to_string(), None, None)
}

/// The memory a run on the CPU can use: this machine's `MemTotal`, or less
/// where a cgroup holds this process to less (a SLURM job's `--mem`, a
/// container): the lowest `memory.max` (cgroup v2) or `memory.limit_in_bytes`
/// (v1) from this process's cgroup up to the hierarchy's root.
pub fn host_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim().trim_end_matches("kB").trim();
    let total = kib.parse::<u64>().ok()?.checked_mul(1024)?;
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    Some(cgroup_limits(&own, std::path::Path::new("/sys/fs/cgroup")).into_iter().fold(total, u64::min))
}

/// The memory limits on the way from each cgroup of `own` (`/proc/self/cgroup`)
/// up to its hierarchy's root under `root` (`/sys/fs/cgroup`); `max` is none.
fn cgroup_limits(own: &str, root: &std::path::Path) -> Vec<u64> {
    let mut out = Vec::new();
    for line in own.lines() {
        // `0::/path` (v2); `N:memory:/path` or `N:cpu,memory:/path` (v1).
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let (top, file) = match controllers {
            "" => (root.to_path_buf(), "memory.max"),
            c if c.split(',').any(|c| c == "memory") => (root.join("memory"), "memory.limit_in_bytes"),
            _ => continue,
        };
        let mut dir = top.join(path.trim_start_matches('/'));
        loop {
            let limit = std::fs::read_to_string(dir.join(file)).ok().and_then(|s| s.trim().parse::<u64>().ok());
            out.extend(limit);
            if !dir.starts_with(&top) || dir == top || !dir.pop() {
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SLURM job's cgroup (v2) under a container's: the lowest limit on the
    /// way up counts; `max` is no limit; v1's memory hierarchy is read too.
    #[test]
    fn the_lowest_cgroup_limit_on_the_way_up_counts() {
        let root = tempfile::tempdir().unwrap();
        let job = root.path().join("system.slice/slurmstepd.scope/job_7");
        std::fs::create_dir_all(&job).unwrap();
        std::fs::write(root.path().join("memory.max"), "max\n").unwrap();
        std::fs::write(root.path().join("system.slice/memory.max"), "68719476736\n").unwrap();
        std::fs::write(job.join("memory.max"), "34359738368\n").unwrap();
        let own = "0::/system.slice/slurmstepd.scope/job_7\n";
        let mut found = cgroup_limits(own, root.path());
        found.sort();
        assert_eq!(found, [34359738368, 68719476736]);
        let v1 = root.path().join("memory/slurm/uid_1/job_8");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "1073741824\n").unwrap();
        assert_eq!(cgroup_limits("4:memory:/slurm/uid_1/job_8\n3:cpu:/x\n", root.path()), [1073741824]);
        assert!(cgroup_limits("0::/elsewhere\n", root.path()).is_empty());
    }

    /// A CPU run reports the memory it can use (README: every record carries
    /// its device's memory): at most this machine's.
    #[test]
    fn a_cpu_run_reports_the_memory_it_can_use() {
        let (name, _, memory) = describe(Backend::Flex, &Backend::Flex.device());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let kib: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .unwrap()
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap();
        assert_eq!(name, "cpu");
        assert!(memory.is_some_and(|m| m > 0 && m <= kib * 1024), "{memory:?} of {kib} KiB");
    }
}
