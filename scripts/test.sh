#!/usr/bin/env bash
# Every test of the project, on a fresh Debian machine:
#   1. build prerequisites (scripts/prereqs.sh),
#   2. a real single-node SLURM cluster with accounting, reachable over SSH on
#      loopback (scripts/test-cluster.sh up), torn down again at the end,
#   3. `cargo fmt --check`, then ONE build of the whole workspace, every
#      target, with every feature the tests use (the CPU backend `flex` and
#      the GPU ones, `wgpu`, `vulkan`, `nvml`): Burn is compiled once. Clippy
#      lints the workspace's own crates during that build (`-D warnings`):
#      clippy-driver is the workspace's rustc wrapper, as `cargo clippy` sets
#      it, so the dependencies are compiled once for both,
#   4. `cargo test --workspace`: unit tests, the published-parameter and
#      precheck-accuracy tests, the Burn worker tests (they name the CPU
#      backend: this build's default is a GPU one) and the cluster tests,
#   5. at the same time, at the lowest CPU priority (the cluster tests mostly
#      wait on SLURM), the worker's GPU code path on a CPU Vulkan device
#      (scripts/lavapipe.sh makes it in the background from the start). The
#      kernel cache's bench is built, not run: its cold pass compiles for
#      minutes what the lavapipe tests' cold runs already compiled (run it with
#      `cargo bench -p worker --features vulkan --bench kernel_cache`),
#   6. the orchestrator's benches (dev profile: they still run).
# The steps' times are printed at the end.
#
#   scripts/test.sh [ARGS]        everything (CI); ARGS go to `cargo test`
#   scripts/test.sh --quick [ARGS]  the inner loop: fmt, the build and lints,
#                                 `cargo test` without the cluster tests and
#                                 without lavapipe (same build: nothing is
#                                 compiled again for the full run)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = --quick ]; then
    quick=1
    shift
fi
source scripts/prereqs.sh

steps=()
last=$SECONDS
step_done() {
    steps+=("$(printf '%6d s  %s' $((SECONDS - last)) "$1")")
    last=$SECONDS
}
started=0
background=()
cleanup() {
    # Background work still running (a step failed): each whole process group.
    local pgid
    for pgid in "${background[@]}"; do kill -- -"$pgid" 2>/dev/null || true; done
    if [ ${#steps[@]} -gt 0 ]; then
        printf 'scripts/test.sh, time per step (total %d s):\n' "$SECONDS" >&2
        printf '  %s\n' "${steps[@]}" >&2
    fi
    [ "$started" = 1 ] && scripts/test-cluster.sh down || true
}
trap cleanup EXIT

# Layout first: it takes a second. rustfmt.toml holds the team's layout.
cargo fmt --all --check

logs=$PWD/target/test-logs
mkdir -p "$logs"
if [ "$quick" = 0 ]; then
    # The Debian root with lavapipe, in the background (debootstrap: network, little CPU).
    scripts/lavapipe.sh >"$logs/lavapipe-root" 2>"$logs/lavapipe-root.err" &
    lavapipe_root=$!
    scripts/test-cluster.sh up
    started=1
else
    export SWEEP_SKIP_CLUSTER_TESTS=1
fi
step_done "prerequisites, the test cluster up"

# Clippy during the build (see above): what `cargo clippy -- -D warnings` sets.
RUSTC_WORKSPACE_WRAPPER=$(command -v clippy-driver) || {
    echo "error: clippy-driver not found; install it: rustup component add clippy" >&2
    exit 1
}
export RUSTC_WORKSPACE_WRAPPER
export CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
features=(--features worker/wgpu,worker/vulkan,worker/nvml)
cargo build --workspace --all-targets --locked "${features[@]}"
step_done "cargo build --workspace --all-targets, every feature, clippy -D warnings"

if [ "$quick" = 0 ]; then
    # The GPU code path on lavapipe: its test binary, run directly (cargo's
    # build lock stays free for the workspace tests), in a process group of
    # its own at the lowest priority.
    exe() { # the executable of one test target, built above
        cargo "$@" --locked "${features[@]}" --no-run --message-format=json 2>/dev/null |
            jq -r 'select(.executable != null and .target.kind == ["test"]) | .executable'
    }
    vulkan_test=$(exe test --workspace --test vulkan_cpu)
    wait "$lavapipe_root" || {
        cat "$logs/lavapipe-root.err" >&2
        exit 1
    }
    SWEEP_VULKAN_ROOT=$(cat "$logs/lavapipe-root")
    gpu_log=$logs/lavapipe.log
    set -m
    (cd worker && exec nice -n 19 env SWEEP_VULKAN_ROOT="$SWEEP_VULKAN_ROOT" "$vulkan_test" --test-threads=2) \
        >"$gpu_log" 2>&1 &
    background+=($!)
    set +m
    gpu_started=$SECONDS
fi

# The lavapipe tests are skipped here (`lavapipe::`): they run above.
cargo test --workspace --locked "${features[@]}" "$@" -- --skip lavapipe::
step_done "cargo test --workspace"
# The orchestrator's benches, in the dev profile so nothing more is compiled:
# they keep working (each checks what it measures: every config submitted,
# every event file read once); their figures are a release build's
# (`cargo bench -p orchestrator --bench plan`, README).
cargo bench --workspace --locked "${features[@]}" --profile dev --bench plan --bench poll --bench predict --bench overlay
step_done "the orchestrator's benches"

if [ "$quick" = 0 ]; then
    gpu_ok=0
    wait "${background[0]}" && gpu_ok=1
    background=()
    cat "$gpu_log"
    [ "$gpu_ok" = 1 ] || {
        echo "the GPU code path on lavapipe failed; its output: $gpu_log" >&2
        exit 1
    }
    step_done "waiting for the GPU code path on lavapipe ($((SECONDS - gpu_started)) s in all)"
fi
