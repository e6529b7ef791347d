#!/usr/bin/env bash
# Every test of the project, on a fresh Debian machine:
#   1. build prerequisites (scripts/prereqs.sh),
#   2. a real single-node SLURM cluster with accounting, reachable over SSH on
#      loopback (scripts/test-cluster.sh up), torn down again at the end,
#   3. `cargo fmt --check` and `cargo clippy -D warnings` (the whole workspace,
#      the worker's GPU code included),
#   4. `cargo test --workspace`: unit tests, the published-parameter and
#      precheck-accuracy tests, the Burn worker tests and the cluster tests,
#   5. the orchestrator's benches (dev profile: they still run),
#   6. the worker's GPU code path on a CPU Vulkan device (scripts/lavapipe.sh)
#      and the kernel cache's bench there.
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh -p orchestrator`).
#
# Clippy and the GPU build (the worker with wgpu, vulkan and nvml: Burn
# compiled a second time, with other features) go to their own target
# directory, target/gpu, in the background at the lowest CPU priority: they use
# what the workspace build and the tests leave idle (the cluster tests mostly
# wait on SLURM) and never slow them. The Debian root with lavapipe is made in
# the background too. The steps' times are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/prereqs.sh

steps=()
last=$SECONDS
step_done() {
    steps+=("$(printf '%6d s  %s' $((SECONDS - last)) "$1")")
    last=$SECONDS
}
started=0
gpu_build=
cleanup() {
    # A background build still running (a step failed): its whole process group.
    [ -n "$gpu_build" ] && kill -- -"$gpu_build" 2>/dev/null || true
    if [ ${#steps[@]} -gt 0 ]; then
        printf 'scripts/test.sh, time per step:\n' >&2
        printf '  %s\n' "${steps[@]}" >&2
    fi
    [ "$started" = 1 ] && scripts/test-cluster.sh down || true
}
trap cleanup EXIT
scripts/test-cluster.sh up
started=1
step_done "prerequisites and the test cluster up"

# Layout first: it takes a second. rustfmt.toml holds the team's layout.
cargo fmt --all --check

gpu_features=(--features worker/wgpu,worker/vulkan,worker/nvml)
gpu_target=$PWD/target/gpu
mkdir -p "$gpu_target"
lavapipe_out=$gpu_target/lavapipe-root
scripts/lavapipe.sh >"$lavapipe_out" &
lavapipe=$!

# In the background from here on (see above), from the start (it takes a core
# whenever the workspace build leaves one idle), in target/gpu, with every GPU
# feature: clippy over the whole workspace (the GPU code included; the CPU
# code is all there too, `flex` stays on), then the GPU test and bench. Its
# output goes to target/gpu/build.log.
gpu_log=$gpu_target/build.log
set -m # its own process group, which cleanup can stop whole
CARGO_TARGET_DIR=$gpu_target nice -n 19 bash -c '
    cargo clippy --workspace --all-targets --locked "$@" -- -D warnings &&
        cargo test --workspace --locked "$@" --test vulkan_cpu --no-run &&
        cargo bench --workspace --locked "$@" --profile dev --bench kernel_cache --no-run' \
    gpu-build "${gpu_features[@]}" >"$gpu_log" 2>&1 &
gpu_build=$!
set +m

# The workspace (its own step, so a compile error is not mistaken for a test failure).
cargo build --workspace --all-targets --locked
step_done "cargo build --workspace --all-targets"

cargo test --workspace --locked "$@"
step_done "cargo test --workspace"
# The orchestrator's benches, in the dev profile so nothing more is compiled:
# they keep working (each checks what it measures: every config submitted,
# every event file read once); their figures are a release build's
# (`cargo bench -p orchestrator --bench plan`, README).
cargo bench --workspace --locked --profile dev --bench plan --bench poll --bench predict --bench overlay
step_done "the orchestrator's benches"

# The GPU code path (CubeCL's Vulkan runtime) on a CPU Vulkan device: lavapipe
# on LLVM 19 from a Debian trixie root of its own (scripts/lavapipe.sh), which
# runs CubeCL's kernels: every family ok and read back and measuring in a task
# of four what four processes do, a tensor beyond the device never ok, two
# processes sharing one kernel cache (docs/gpu.md); then the kernel cache's
# bench, cold against warm, for the DiT alone (a cold config on lavapipe takes
# minutes; docs/gpu.md has all four families).
wait "$lavapipe"
SWEEP_VULKAN_ROOT=$(cat "$lavapipe_out")
export SWEEP_VULKAN_ROOT
wait "$gpu_build" || {
    tail -40 "$gpu_log" >&2
    echo "clippy or the GPU build failed; the whole output: $gpu_log" >&2
    exit 1
}
gpu_build= # ended: its process group id may be anyone's now
step_done "waiting for clippy and the GPU build (background) and lavapipe"
export CARGO_TARGET_DIR=$gpu_target
cargo test --workspace --locked "${gpu_features[@]}" --test vulkan_cpu
step_done "the GPU code path on lavapipe"
BENCH_FAMILIES=dit cargo bench --workspace --locked "${gpu_features[@]}" --profile dev --bench kernel_cache
step_done "the kernel cache's bench on lavapipe"
