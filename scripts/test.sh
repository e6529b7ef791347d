#!/usr/bin/env bash
# Every test of the project, on a fresh Debian machine:
#   1. build prerequisites (scripts/prereqs.sh),
#   2. a real single-node SLURM cluster with accounting, reachable over SSH on
#      loopback (scripts/test-cluster.sh up), torn down again at the end,
#   3. `cargo fmt --check` and `cargo clippy -D warnings` (spec, orchestrator, worker),
#   4. `cargo test --workspace`: unit tests, the published-parameter and
#      precheck-accuracy tests, the Burn worker tests and the cluster tests,
#   5. the orchestrator's benches (dev profile: they still run),
#   6. the worker's GPU code path on a CPU Vulkan device (scripts/lavapipe.sh)
#      and the kernel cache's bench there.
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh -p orchestrator`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/prereqs.sh

started=0
cleanup() { [ "$started" = 1 ] && scripts/test-cluster.sh down || true; }
trap cleanup EXIT
scripts/test-cluster.sh up
started=1

# Build first (its own step, so a compile error is not mistaken for a test failure).
cargo build --workspace --all-targets --locked
# Layout and lints of the whole workspace (the worker with its default, CPU,
# features: Burn is already compiled by the build above). rustfmt.toml holds the
# team's layout.
cargo fmt --all --check
cargo clippy -p spec -p orchestrator -p worker --all-targets --locked -- -D warnings
cargo test --workspace --locked "$@"
# The orchestrator's benches, in the dev profile so nothing more is compiled:
# they keep working (each checks what it measures: every config submitted,
# every event file read once); their figures are a release build's
# (`cargo bench -p orchestrator --bench plan`, README).
cargo bench --workspace --locked --profile dev --bench plan --bench poll --bench predict --bench overlay

# The GPU code path (CubeCL's Vulkan runtime) on a CPU Vulkan device: lavapipe
# on LLVM 19 from a Debian trixie root of its own (scripts/lavapipe.sh), which
# runs CubeCL's kernels: every family ok and read back, a tensor beyond the
# device never ok, a task of several configs measuring what single processes
# do (docs/gpu.md); then the kernel cache's bench, cold against warm, in the
# same (dev) profile so nothing more is compiled. Built with every GPU
# feature, so wgpu and nvml keep compiling too; then the workspace's worker
# binary (CPU) is restored for whoever runs it next, from the build above
# (the same targets, so the same features: nothing is compiled again).
SWEEP_VULKAN_ROOT=$(scripts/lavapipe.sh)
export SWEEP_VULKAN_ROOT
cargo test -p worker --features wgpu,vulkan,nvml --locked --test vulkan_cpu
cargo bench -p worker --features wgpu,vulkan,nvml --locked --profile dev --bench kernel_cache
cargo build --workspace --all-targets --locked
