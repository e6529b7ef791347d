#!/usr/bin/env bash
# The GPU check (docs/gpu.md, "The GPU check"): one command on a GPU machine,
# at most about 8 minutes by its own estimate, records into $OUT.
#
#   scripts/gpu-check.sh --fetch-wheels          # here, with PyPI: MONAI and einops wheels to carry
#   scripts/gpu-check.sh [--cpu] [--parts eacbd] [--budget PART=SECONDS]...
#
# WORKER: the worker binary (default target/release/worker: `cargo build -p
# worker --release --features vulkan,nvml` and `strip`); PYTHON: a Python with
# PyTorch (default python3); OUT: where records go (default target/gpu-check/out).
# --cpu rehearses everything on the CPU (flex backend, tiny configs, CPU
# PyTorch with an allocation tracker): the same code path, no GPU figure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
wheels=${GPU_CHECK_WHEELS:-$root/target/gpu-check/wheels}
python=${PYTHON:-python3}
if [[ ${1:-} == --fetch-wheels ]]; then
    exec "$python" -m pip download --no-deps -d "$wheels" monai einops
fi
start=$(date +%s)
out=${OUT:-$root/target/gpu-check/out}
worker=${WORKER:-$root/target/release/worker}
[[ -x $worker ]] || { echo "gpu-check: no worker binary at $worker (set WORKER)" >&2; exit 2; }
mkdir -p "$out"
# MONAI and einops are pure Python: their wheels, unpacked, are installed.
if ! "$python" -c 'import monai, einops' 2>/dev/null; then
    lib=$(mktemp -d)/pylib
    "$python" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
        "$lib" "$wheels"/*.whl
    export PYTHONPATH=$lib${PYTHONPATH:+:$PYTHONPATH}
fi
"$python" "$root/scripts/gpu_check/check.py" --out "$out" --worker "$worker" \
    --records "$root/data/vram-measurements.jsonl" "$@"
echo "gpu-check: $(($(date +%s) - start)) s in all; records in $out"
