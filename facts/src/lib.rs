//! Types shared by the orchestrator (which plans, predicts and submits) and the
//! worker (which builds the model in Burn and measures it).
//!
//! Everything here is plain data plus arithmetic, so the orchestrator can depend
//! on it without pulling in Burn.

pub mod blocks;
pub mod canonical;
pub mod chain;
pub mod event;
pub mod family;
pub mod gpu;
pub mod invalid;
pub mod jsonl;
pub mod mamba;
pub mod model;
pub mod params;
pub mod peaks;
pub mod protocol;
pub mod record;
pub mod run;
pub mod shape;
pub mod training;
pub mod training_record;
pub mod validate;

pub use gpu::Gpu;
pub use mamba::{MambaSpec, Ratio};
pub use model::{DitSpec, HditSpec, ModelSpec, PerLevel, TransformerDims, UnetSpec, UvitSpec, Variant};
pub use run::{Mode, Precision, RunConfig};
pub use shape::{Input, Spatial};
pub use training::Training;
pub use validate::Invalid;
