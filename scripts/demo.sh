#!/usr/bin/env bash
# The main job, no cluster needed: plan, precheck, run and report a sweep on the
# built-in `local` cluster, which runs the Burn worker (CPU) as local processes.
#
#   scripts/demo.sh [EXPERIMENT.yaml]      default: experiments/demo.yaml
#
# Safe to run again: configs already measured are not submitted twice; the
# report is rewritten. `rm -rf state/demo` starts over.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/prereqs.sh

exp=${1:-experiments/demo.yaml}
echo "== building the orchestrator and the worker (release; the first build compiles Burn: about 12 minutes on 2 cores)"
cargo build --release -p orchestrator -p worker
# The local cluster runs the `worker` next to the orchestrator binary.
orch=target/release/orchestrator

echo "== plan"
"$orch" plan "$exp"
echo "== submit"
"$orch" submit "$exp"
echo "== status (until every config has ended)"
"$orch" status "$exp" --watch
echo "== report"
"$orch" report "$exp"
echo "== done: open the report.md named above (its plots are beside it)"
