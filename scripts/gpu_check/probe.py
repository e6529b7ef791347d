"""Run some of the group's configs again under named cuDNN settings (the
probes of data/gpu-check/2026-11-27-h100/RUN.md), each under the protocol of
the script behind its record, and append their marks to OUT/probe.jsonl.

Usage (on the GPU machine, from the repository root; the allocator setting is
the caller's, as the group's launchers set it):
    OUT=DIR python3 scripts/gpu_check/probe.py IDS [MODES]

IDS: comma-separated config ids of the group plan (plan.group_plan), or
`unet` for every UNet config with a figure whose launcher matches this
process's allocator setting. MODES: comma-separated, of
`default` (cuDNN as PyTorch sets it), `no-cudnn` (torch.backends.cudnn off:
PyTorch's native convolutions), `benchmark` (cudnn.benchmark on); default all
three. `against_group.py DIR --mode MODE` reads the lines back.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plan  # noqa: E402
import protocols  # noqa: E402
import torch  # noqa: E402
from torch_half import CudaMeter  # noqa: E402

MODES = ("default", "no-cudnn", "benchmark")
RECORDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "vram-measurements.jsonl")


def chosen(items, ids):
    if ids != ["unet"]:
        unknown = [i for i in ids if i not in items]
        if unknown:
            sys.exit(f"probe: not in the group plan: {', '.join(unknown)}")
        return ids
    expandable = "expandable_segments:True" in os.environ.get("PYTORCH_ALLOC_CONF", "")
    return [
        i for i, it in items.items()
        if it["config"]["model"]["family"] == "unet" and it["expandable"] == expandable
        and all(g["figure"] is not None for g in it["group"])
    ]


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    modes = sys.argv[2].split(",") if len(sys.argv) == 3 else list(MODES)
    if any(m not in MODES for m in modes):
        sys.exit(f"probe: modes are {', '.join(MODES)}")
    items = {it["id"]: it for it in plan.group_plan(RECORDS)}
    ids = chosen(items, sys.argv[1].split(","))
    device = torch.device("cuda")
    with open(os.path.join(os.environ["OUT"], "probe.jsonl"), "a") as out:
        for mode in modes:
            torch.backends.cudnn.enabled = mode != "no-cudnn"
            torch.backends.cudnn.benchmark = mode == "benchmark"
            for i in ids:
                it, start = items[i], time.time()
                marks, _, failure = protocols.run(it["protocol"], it["config"], device, CudaMeter())
                torch.cuda.empty_cache()
                row = {"id": i, "mode": mode, "marks": marks, "failure": failure and failure[1],
                       "group": it["group"], "wall_s": round(time.time() - start, 1)}
                out.write(json.dumps(row) + "\n")
                out.flush()
                gib = {k: round(v / 2**30, 3) for k, v in marks.items() if k != "phase"}
                print(i, mode, gib, [g["figure"] for g in it["group"]], failure and failure[1][:80], flush=True)


if __name__ == "__main__":
    main()
