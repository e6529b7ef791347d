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
#   4. at once, three streams of tests:
#      - `cargo test --workspace` on everything but the cluster and lavapipe
#        test targets: unit tests, the published-parameter and
#        precheck-accuracy tests, the Burn worker tests (they name the CPU
#        backend: this build's default is a GPU one), the docs, then the
#        orchestrator's benches (dev profile: they still run);
#      - the cluster test executables, two at a time (they mostly wait on
#        SLURM; a test that stops or restarts a daemon holds the cluster
#        alone, see orchestrator/tests/common);
#      - at the lowest CPU priority, the worker's GPU code path on a CPU
#        Vulkan device (scripts/lavapipe.sh makes it in the background from
#        the start). The kernel cache's bench is built, not run: its cold
#        pass compiles for minutes what the lavapipe tests' cold runs already
#        compiled (run it with
#        `cargo bench -p worker --features vulkan --bench kernel_cache`).
# The steps' times and the count of tests passed are printed at the end.
#
#   scripts/test.sh [ARGS]        everything (CI); ARGS go to `cargo test`
#                                 (not to the cluster and lavapipe tests)
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
# The build's size and the disk left: a fresh CI machine once ran out of it.
disk_use() {
    printf 'target/ %s, %s free' "$(du -sh target/ 2>/dev/null | cut -f1)" \
        "$(df -h --output=avail target | tail -1 | tr -d ' ')"
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
rm -f "$logs"/*.log
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

# CI builds once from cold: incremental compilation only costs it time and
# disk (gigabytes of query caches for the test binaries); the inner loop keeps it.
if [ -n "${CI:-}" ]; then
    export CARGO_INCREMENTAL=0
fi

# Clippy during the build (see above): what `cargo clippy -- -D warnings` sets.
RUSTC_WORKSPACE_WRAPPER=$(command -v clippy-driver) || {
    echo "error: clippy-driver not found; install it: rustup component add clippy" >&2
    exit 1
}
export RUSTC_WORKSPACE_WRAPPER
export CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
features=(--features worker/wgpu,worker/vulkan,worker/nvml)
cargo build --workspace --all-targets --locked "${features[@]}"
step_done "cargo build --workspace --all-targets, every feature, clippy -D warnings ($(disk_use))"

# The test executables built above, a line each: target name, package
# directory, executable.
mapfile -t test_targets < <(
    cargo test --workspace --locked "${features[@]}" --no-run --message-format=json 2>/dev/null |
        jq -r 'select(.executable != null and .target.kind == ["test"])
               | [.target.name, (.manifest_path | rtrimstr("/Cargo.toml")), .executable] | @tsv'
)
cluster_tests=() vulkan_test=() cargo_tests=()
for t in "${test_targets[@]}"; do
    case ${t%%$'\t'*} in
    cluster_*) cluster_tests+=("$t") ;;
    vulkan_cpu) vulkan_test=("$t") ;;
    *) cargo_tests+=(--test "${t%%$'\t'*}") ;;
    esac
done
# The longest first (seconds on a 2-core machine: chain about 560, ssh 173,
# tasks 62, rest 60, worker 58, active 51, jump 41, warm 35), so two at a
# time end together.
mapfile -t cluster_tests < <(
    printf '%s\n' "${cluster_tests[@]}" |
        awk -F'\t' 'BEGIN { n = split("cluster_chain cluster_ssh cluster_tasks cluster_rest cluster_worker cluster_active", o, " ")
                             for (i = 1; i <= n; i++) rank[o[i]] = i }
                     { print ($1 in rank ? rank[$1] : 99) "\t" $0 }' | sort -n -s -k1,1 | cut -f2-
)
[ ${#cluster_tests[@]} -gt 0 ] && [ ${#vulkan_test[@]} = 1 ] || {
    echo "error: no cluster or lavapipe test executables among: ${test_targets[*]}" >&2
    exit 1
}

# One test executable as `cargo test` runs it (from its package's directory),
# its output in $logs/NAME.log.
run_test() { # NAME DIR COMMAND...
    local name=$1 dir=$2
    shift 2
    (cd "$dir" && CARGO_MANIFEST_DIR=$dir exec "$@") >"$logs/$name.log" 2>&1
}
# The cluster test executables, two at a time: they mostly wait on SLURM,
# and each test holds the cluster shared, or alone when it stops or restarts
# a daemon (orchestrator/tests/common: `cluster(Use::...)`).
run_cluster_tests() {
    set +m # the tests stay in this process group (killed with it)
    local t name dir exe running=0 failed=0
    for t in "${cluster_tests[@]}"; do
        if [ "$running" = 2 ]; then
            wait -n || failed=1
            running=$((running - 1))
        fi
        IFS=$'\t' read -r name dir exe <<<"$t"
        run_test "$name" "$dir" "$exe" &
        running=$((running + 1))
    done
    while [ "$running" -gt 0 ]; do
        wait -n || failed=1
        running=$((running - 1))
    done
    return "$failed"
}

if [ "$quick" = 0 ]; then
    # Each in a process group of its own (killed whole if a step fails):
    # the cluster tests, and the GPU code path on lavapipe at the lowest
    # priority once its Debian root is made.
    wait "$lavapipe_root" || {
        cat "$logs/lavapipe-root.err" >&2
        exit 1
    }
    set -m
    run_cluster_tests &
    background+=($!)
    IFS=$'\t' read -r name dir exe <<<"${vulkan_test[0]}"
    (
        export SWEEP_VULKAN_ROOT
        SWEEP_VULKAN_ROOT=$(cat "$logs/lavapipe-root")
        run_test lavapipe "$dir" nice -n 19 "$exe" --test-threads=2
    ) &
    background+=($!)
    set +m
    background_started=$SECONDS
fi

# Meanwhile every other test: libraries, binaries, the test targets above
# but the cluster's and lavapipe's, the doc tests.
cargo test --workspace --locked "${features[@]}" --lib --bins "${cargo_tests[@]}" "$@" 2>&1 | tee "$logs/cargo-test.log"
cargo test --workspace --locked "${features[@]}" --doc "$@" 2>&1 | tee -a "$logs/cargo-test.log"
step_done "cargo test --workspace, all but the cluster and lavapipe tests"
# The orchestrator's benches, in the dev profile so nothing more is compiled:
# they keep working (each checks what it measures: every config submitted,
# every event file read once); their figures are a release build's
# (`cargo bench -p orchestrator --bench plan`, docs/precheck.md).
cargo bench --workspace --locked "${features[@]}" --profile dev --bench plan --bench poll --bench predict --bench overlay 2>&1 |
    tee "$logs/benches.log"
step_done "the orchestrator's benches"

if [ "$quick" = 0 ]; then
    failed=()
    wait "${background[0]}" || failed+=("the cluster tests")
    wait "${background[1]}" || failed+=("the GPU code path on lavapipe")
    background=()
    for t in "${cluster_tests[@]}"; do
        cat "$logs/${t%%$'\t'*}.log"
    done
    cat "$logs/lavapipe.log"
    step_done "waiting for the cluster tests and lavapipe ($((SECONDS - background_started)) s in all)"
    [ ${#failed[@]} = 0 ] || {
        echo "failed: ${failed[*]}; their output: $logs/" >&2
        exit 1
    }
fi
# Every test that ran, counted from the outputs above.
cat "$logs"/*.log 2>/dev/null | grep -o 'test result: ok\. [0-9]* passed' | awk '{n += $4} END {print "tests passed: " n}'
