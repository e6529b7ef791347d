//! The orchestrator, one module per stage. In the order data flows, each
//! importing only modules of the lines above it (no circles, no arrow back up;
//! `tests/module_graph.rs` checks it):
//!
//! 1. leaves: `fsio` (file I/O, the clock), `util` (tables, quoting, sizes), `plot`;
//! 2. planning: `experiment` → `precheck` → `sweep` → `plan`, `advisor`, `active`;
//! 3. what a worker writes: `collect` (its event stream, read), `walltime` (SLURM's time limit from its wall times);
//! 4. the cluster: `cluster` → `render`, `slurm` → `transport` → `target`;
//! 5. the state directory: `state`;
//! 6. commands and what they show: `progress` → `submit` → `report` → `evidence`;
//! 7. the command line: `cli` (clap, a file per command; nothing below it knows clap).

pub mod active;
pub mod advisor;
pub mod cli;
pub mod cluster;
pub mod collect;
pub mod evidence;
pub mod experiment;
pub mod fsio;
pub mod plan;
pub mod plot;
pub mod precheck;
pub mod progress;
pub mod render;
pub mod report;
pub mod slurm;
pub mod state;
pub mod submit;
pub mod sweep;
pub mod target;
pub mod transport;
pub mod util;
pub mod walltime;
