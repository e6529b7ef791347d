#!/usr/bin/env bash
# Every test of the project, on a fresh Debian machine:
#   1. build prerequisites (OpenSSL headers for ssh2, pkg-config),
#   2. a real single-node SLURM cluster with accounting, reachable over SSH on
#      loopback (scripts/test-cluster.sh up), torn down again at the end,
#   3. `cargo test --workspace`: unit tests, the published-parameter and
#      precheck-accuracy tests, the Burn worker tests and the cluster tests.
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh -p orchestrator`).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

if ! command -v cargo >/dev/null; then
    echo "error: cargo not found; install Rust (rustup) first" >&2
    exit 1
fi

need=()
for pkg in pkg-config libssl-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "installing build prerequisites: ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

started=0
cleanup() { [ "$started" = 1 ] && scripts/test-cluster.sh down || true; }
trap cleanup EXIT
scripts/test-cluster.sh up
started=1

# Build first (its own step, so a compile error is not mistaken for a test failure).
cargo build --workspace --all-targets --locked
cargo test --workspace --locked "$@"
