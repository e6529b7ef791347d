//! Backend selection at run time.
//!
//! - `flex` (default feature): Burn's pure-Rust CPU backend, for tests and the
//!   local demo. Memory is measured exactly by the tracking allocator.
//! - `wgpu` / `vulkan` (cargo features): the GPU backends. burn 0.22.1's `cuda`
//!   feature cannot be built offline (a build script of cubecl's LLVM
//!   dependency downloads a bundle), and the cluster's build nodes have no
//!   network, so the GPU build uses wgpu (Vulkan on NVIDIA). Memory is the
//!   CubeCL pool's bytes in use, sampled on a background thread (no peak
//!   counter exists), plus NVML with the `nvml` feature.

use burn::prelude::*;
use burn::tensor::FloatDType;
use spec::Precision;

/// A backend this build can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    #[cfg(feature = "flex")]
    Flex,
    #[cfg(feature = "wgpu")]
    Wgpu,
    #[cfg(feature = "vulkan")]
    Vulkan,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("unknown backend `{0}` (this build has: {1})")]
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
        }
    }
}

/// The float dtype a precision runs at in Burn, which has no autocast: AMP
/// configs run entirely in the half type (weights included), the closest Burn
/// gets to the group's runs; the record's dtype field says what really ran.
pub fn float_dtype(p: Precision) -> FloatDType {
    match p {
        Precision::Fp32 => FloatDType::F32,
        Precision::Bf16 | Precision::Bf16Amp => FloatDType::BF16,
        Precision::Fp16Amp => FloatDType::F16,
    }
}

pub fn dtype_name(d: FloatDType) -> &'static str {
    match d {
        FloatDType::F64 => "f64",
        FloatDType::F32 | FloatDType::Flex32 => "f32",
        FloatDType::F16 => "f16",
        FloatDType::BF16 => "bf16",
    }
}

/// A device ready for a run: dtype configured (falling back to f32 where the
/// backend cannot compute in the requested type), autodiff on, gradient
/// checkpointing when asked. Must run before the first tensor on the device.
pub fn prepare(backend: Backend, precision: Precision, grad_ckpt: bool) -> Result<(Device, FloatDType), BackendError> {
    let mut device = backend.device();
    let wanted = float_dtype(precision);
    let dtype = if device.supports_dtype(wanted) { wanted } else { FloatDType::F32 };
    device.configure(dtype).map_err(|e| BackendError::Configure(format!("{e:?}")))?;
    let device = device.autodiff();
    let device = if grad_ckpt { device.gradient_checkpointing() } else { device };
    Ok((device, dtype))
}

/// The device's name and driver version for the run header.
pub fn describe(backend: Backend, device: &Device) -> (String, Option<String>) {
    #[cfg(feature = "nvml")]
    if backend.is_gpu() {
        if let Some(found) = crate::meter::nvml_describe() {
            return found;
        }
    }
    if !backend.is_gpu() {
        return ("cpu".to_string(), None);
    }
    #[cfg(any(feature = "wgpu", feature = "vulkan"))]
    if let Some(id) = device.identity() {
        return (id.name, None);
    }
    let _ = device;
    (backend.name().to_string(), None)
}
