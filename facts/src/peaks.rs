//! The peak of each phase of one measured run: what the worker's events, the
//! records and the group's column protocols all read.

use serde::{Deserialize, Serialize};

/// Peak bytes seen per phase (absent where the phase was not reached).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhasePeaks {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwd: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
}
