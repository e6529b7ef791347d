//! The orchestrator's data flow, one module per stage:
//! experiment → sweep → precheck → render → transport → state → collect → report.

pub mod collect;
pub mod experiment;
pub mod plan;
pub mod precheck;
pub mod sweep;
