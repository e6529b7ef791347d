//! The orchestrator's data flow, one module per stage:
//! experiment → sweep → precheck → render → transport → state → collect → report.

pub mod advisor;
pub mod collect;
pub mod experiment;
pub mod plan;
pub mod precheck;
pub mod sweep;
// Cluster side: templates, transports, SLURM, state directory, commands.
pub mod cluster;
pub mod install;
pub mod render;
pub mod slurm;
pub mod state;
pub mod submit;
pub mod target;
pub mod transport;
// Reports, plots and progress (issue 6).
pub mod plot;
pub mod progress;
pub mod report;
