//! The worker: runs one sweep config as a SLURM job. It builds the model in
//! Burn, runs the phases the group's profiler runs (model, fwd, bwd, AdamW
//! step), measures each phase's peak memory and streams events to the state
//! directory (see `worker/README.md`). `worker watch` ([`watch`]) runs a
//! command of the user's (a training script) instead and writes the same events.
//!
//! Backends are chosen at run time among those compiled in: `flex` (CPU,
//! default feature) and the GPU features `vulkan`, `wgpu` and `cuda` (see
//! [`backend`]). This crate installs a tracking global allocator ([`alloc`])
//! in every binary that links it.

pub mod alloc;
pub mod backend;
pub mod cache;
pub mod caching;
pub mod demo_trainer;
pub mod events;
pub mod fidelity;
pub mod meter;
pub mod models;
#[cfg(feature = "nvml")]
pub mod nvml;
pub mod optim;
pub mod runner;
pub mod task;
pub mod vulkan_driver;
pub mod warm;
pub mod watch;

pub use backend::Backend;
pub use runner::{run, Outcome, RunOptions};
