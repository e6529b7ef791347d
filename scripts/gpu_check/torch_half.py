"""The PyTorch half of the GPU check: each of the group's configs run as the
script behind its record measured it (protocols.py: where the peak window
opens, when AdamW is created, the loss, the columns), with the group's models
(models.py), on the same GPU as the worker.

Usage: python3 torch_half.py PLAN.json OUT_DIR DEADLINE_EPOCH [--cpu] [--expandable]

The group's S2D and HDiT/U-ViT launchers export
`PYTORCH_ALLOC_CONF=expandable_segments:True`, its other launchers nothing:
an allocator setting holds for a whole process, so the caller runs this
twice, once with the variable set and `--expandable` (those configs alone),
once without (the rest).

Every config becomes a measurement record (facts/src/record.rs) appended to
OUT_DIR/pytorch.jsonl as it ends, with the group's columns (`model_gb`, and
the running maxima `fwd_gb`, `bwd_gb`, `peak_gb`), and its marks beside the
group's figures for it to OUT_DIR/phases.jsonl. With --cpu (no GPU) the same
code runs on the CPU and the bytes come from an allocation tracker: every
tensor storage alive, rounded up to 512 bytes as CUDA's caching allocator
rounds (the CPU rehearsal; never a GPU figure).
"""

import gc
import json
import os
import sys
import time

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocols  # noqa: E402
import records  # noqa: E402

GIB = float(1 << 30)


class TrackerOom(RuntimeError):
    """The tracked bytes passed the rehearsal's limit (the CPU's stand-in for a CUDA OOM)."""


class AllocTracker(TorchDispatchMode):
    """Live tensor storages on the CPU, counted as CUDA's allocator would (512-byte blocks)."""

    def __init__(self, limit=None):
        super().__init__()
        self.live = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self.limit = limit

    def _prune(self):
        for k in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self.live_bytes -= self.live.pop(k)[1]

    def _track(self, t):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            return
        st = t.untyped_storage()
        key = st.data_ptr()
        if key == 0 or key in self.live:
            return
        size = -(-st.nbytes() // 512) * 512
        self.live[key] = (StorageWeakRef(st), size)
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        if self.limit is not None and self.live_bytes > self.limit:
            raise TrackerOom(f"out of memory: tracked {self.live_bytes} bytes over the limit of {self.limit}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._prune()
        for t in out if isinstance(out, (tuple, list)) else [out]:
            self._track(t)
        return out

    def reset_peak(self):
        self._prune()
        self.peak_bytes = self.live_bytes

    def peak(self):
        return self.peak_bytes

    def current(self):
        self._prune()
        return self.live_bytes

    def empty_cache(self):
        pass


class CudaMeter:
    def reset_peak(self):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    def peak(self):
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()

    def current(self):
        return torch.cuda.memory_allocated()

    def empty_cache(self):
        torch.cuda.empty_cache()


def record(item, marks, params, failure, dev):
    """A measurement record (facts/src/record.rs) with the group's columns."""
    cfg = item["config"]
    r = {
        "id": f"gpu-check/pytorch/{cfg['name']}",
        "table": "gpu-check-pytorch" + ("-cpu" if dev["cpu"] else ""),
        "framework": "pytorch",
        "gpu": dev["name"],
    }
    r.update(records.config_fields(cfg, cfg["precision"]))
    r["params_m"] = round(params / 1e6, 1) if params else None
    oom = failure is not None
    peak = marks.get("step", 0)
    r["peak_gb"] = None if oom else peak / GIB
    r["peak_bytes"] = None if oom else peak
    # The group's columns: memory held after the build, then running maxima.
    for mark, field in (("model", "model_gb"), ("fwd", "fwd_gb"), ("bwd", "bwd_gb")):
        if mark in marks:
            r[field] = marks[mark] / GIB
    if oom:
        r["oom_reported_gb"] = marks["at_failure"] / GIB
    r["status"] = "oom" if oom else ("over_budget" if peak / GIB > 60 else "ok")
    if dev["memory"]:
        r["device_memory_gb"] = dev["memory"] / GIB
    if item.get("memory_limit"):
        r["memory_limit_gb"] = item["memory_limit"] / GIB
    r["config_name"] = cfg["name"]
    note = f"torch {torch.__version__}, the group's models and its `{item['protocol']}` protocol"
    r["note"] = note + (f", oom in {failure[2]}" if oom else "")
    return {k: v for k, v in r.items() if v is not None}


def main():
    plan_path, out, deadline = sys.argv[1], sys.argv[2], float(sys.argv[3])
    cpu = "--cpu" in sys.argv
    if not cpu and not torch.cuda.is_available():
        print("pytorch: no CUDA device; nothing measured (run with --cpu to rehearse)", file=sys.stderr)
        return 2
    device = torch.device("cpu" if cpu else "cuda")
    if cpu:
        dev = {"cpu": True, "name": "cpu", "memory": None}
    else:
        props = torch.cuda.get_device_properties(0)
        dev = {"cpu": False, "name": torch.cuda.get_device_name(0), "memory": props.total_memory}
    with open(plan_path) as f:
        plan = json.load(f)
    expandable = "--expandable" in sys.argv
    if expandable and "expandable_segments:True" not in os.environ.get("PYTORCH_ALLOC_CONF", ""):
        print("pytorch: --expandable without PYTORCH_ALLOC_CONF=expandable_segments:True", file=sys.stderr)
        return 2
    items = [(p, it) for p in ("group", "oom") for it in plan.get(p, []) if bool(it.get("expandable")) == expandable]
    for i, (part, it) in enumerate(items):
        if time.time() > deadline:
            print(f"pytorch: budget spent; {len(items) - i} configs not run", file=sys.stderr)
            break
        start = time.time()
        meter = AllocTracker(it.get("memory_limit")) if cpu else CudaMeter()
        if cpu:
            with meter:
                marks, params, failure = protocols.run(it["protocol"], it["config"], device, meter)
        else:
            marks, params, failure = protocols.run(it["protocol"], it["config"], device, meter)
        if failure is not None and not failure[0]:
            print(f"pytorch: {it['id']}: failed in {failure[2]}: {failure[1]}", file=sys.stderr)
            gc.collect()
            continue
        rec = record(it, marks, params, failure, dev)
        wall = time.time() - start
        with open(os.path.join(out, "pytorch.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")
        detail = {"half": "pytorch", "part": part, "id": it["id"], "protocol": it["protocol"], "marks": marks}
        detail.update(status=rec["status"], wall_s=round(wall, 2), params=params)
        detail["group"] = it.get("group", [])
        with open(os.path.join(out, "phases.jsonl"), "a") as f:
            f.write(json.dumps(detail) + "\n")
        figure = rec.get("peak_gb", rec.get("oom_reported_gb", 0))
        group = ", ".join(f"{g['id']} {g['figure']}" for g in it.get("group", []))
        print(f"pytorch [{i + 1}/{len(items)}] {it['id']}: {rec['status']} {figure:.3f} GiB ({group}), {wall:.1f} s", flush=True)
        gc.collect()
        if not cpu:
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
