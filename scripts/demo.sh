#!/usr/bin/env bash
# The main job, no cluster needed: plan, precheck, run and report a sweep on the
# built-in `local` cluster, which runs the Burn worker (CPU) as local processes.
#
#   scripts/demo.sh [EXPERIMENT.yaml]      default: experiments/demo.yaml
#   scripts/demo.sh --where                where the build puts the binaries (nothing is built)
#
# Safe to run again: configs already measured are not submitted twice; the
# report is rewritten. `rm -rf state/demo` starts over.
set -euo pipefail
cd "$(dirname "$0")/.."

# Where cargo puts this workspace's release binaries: `target/release/`, or
# under CARGO_TARGET_DIR (or a cargo config's `build.target-dir`) where set,
# in a target triple's directory where CARGO_BUILD_TARGET names one.
release_dir() {
    local dir
    dir=$(cargo metadata --format-version 1 --no-deps | jq -r .target_directory)
    echo "$dir${CARGO_BUILD_TARGET:+/$CARGO_BUILD_TARGET}/release"
}

if [ "${1:-}" = --where ]; then
    release_dir
    exit 0
fi
source scripts/prereqs.sh

exp=${1:-experiments/demo.yaml}
echo "== building the orchestrator and the worker (release; the first build compiles Burn: about 12 minutes on 2 cores)"
cargo build --release -p orchestrator -p worker
# The local cluster runs the `worker` next to the orchestrator binary.
orch=$(release_dir)/orchestrator
echo "== built: $orch (and the worker beside it)"

echo "== plan"
"$orch" plan "$exp"
echo "== submit"
"$orch" submit "$exp"
echo "== status (until every config has ended)"
"$orch" status "$exp" --watch
echo "== report"
"$orch" report "$exp"
echo "== done: open the report.md named above (its plots are beside it)"
