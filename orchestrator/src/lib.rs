//! The orchestrator's data flow, one module per stage:
//! spec → sweep → precheck → render → transport → state → collect → report.

pub mod precheck;
