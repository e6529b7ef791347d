"""The PyTorch half of the GPU check: each config as the group ran it, on the
same GPU as the worker, with the peak of `torch.cuda.max_memory_allocated`
per phase (its window reset at each phase's start, as the worker's are):

- model: build the model in fp32 on the device;
- fwd: one forward at the batch size on random input under
  `torch.autocast(dtype=torch.bfloat16)` (SDPA attention in the transformers);
- bwd: MSE against a random target (in fp32, as autocast runs it), backward;
- step: one `torch.optim.AdamW` step, `foreach=True` (CUDA's default).

Usage: python3 torch_half.py PLAN.json OUT_DIR DEADLINE_EPOCH [--cpu]

Every config becomes a measurement record (spec/src/record.rs) appended to
OUT_DIR/pytorch.jsonl as it ends, and its per-phase bytes to
OUT_DIR/phases.jsonl. With --cpu (no GPU) the same code runs on the CPU and
the bytes come from an allocation tracker: every tensor storage alive,
rounded up to 512 bytes as CUDA's caching allocator rounds (the CPU
rehearsal; never a GPU figure).
"""

import gc
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import records  # noqa: E402

GIB = float(1 << 30)


class TrackerOom(RuntimeError):
    """The tracked bytes passed the rehearsal's limit (the CPU's stand-in for a CUDA OOM)."""


class AllocTracker(TorchDispatchMode):
    """Live tensor storages on the CPU, counted as CUDA's allocator would (512-byte blocks)."""

    def __init__(self, limit=None):
        super().__init__()
        self.live = {}
        self.current = 0
        self.peak_bytes = 0
        self.limit = limit

    def _prune(self):
        for k in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self.current -= self.live.pop(k)[1]

    def _track(self, t):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            return
        st = t.untyped_storage()
        key = st.data_ptr()
        if key == 0 or key in self.live:
            return
        size = -(-st.nbytes() // 512) * 512
        self.live[key] = (StorageWeakRef(st), size)
        self.current += size
        self.peak_bytes = max(self.peak_bytes, self.current)
        if self.limit is not None and self.current > self.limit:
            raise TrackerOom(f"tracked {self.current} bytes over the limit of {self.limit}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._prune()
        for t in out if isinstance(out, (tuple, list)) else [out]:
            self._track(t)
        return out

    def reset_peak(self):
        self._prune()
        self.peak_bytes = self.current

    def peak(self):
        return self.peak_bytes


class CudaMeter:
    def reset_peak(self):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    def peak(self):
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()


def is_oom(e):
    return isinstance(e, (torch.cuda.OutOfMemoryError, TrackerOom)) or "out of memory" in str(e).lower()


def phases(cfg, device, meter):
    """Run the four phases; returns ({phase: peak bytes}, params, phase reached, error)."""
    peaks, params, phase = {}, None, "model"
    try:
        meter.reset_peak()
        model = models.build(cfg).to(device)
        params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=True)
        peaks["model"] = meter.peak()
        b, cin = cfg["batch"], cfg["input"]["channels"]
        x = torch.randn(b, cin, *cfg["input"]["spatial"], device=device)
        t = torch.randint(0, 1000, (b,), device=device).float()
        phase = "fwd"
        meter.reset_peak()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            out = model(x, t)
        peaks["fwd"] = meter.peak()
        phase = "bwd"
        meter.reset_peak()
        target = torch.randn(out.shape, device=device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = F.mse_loss(out.float(), target)
        loss.backward()
        del out, loss
        peaks["bwd"] = meter.peak()
        phase = "step"
        meter.reset_peak()
        opt.step()
        peaks["step"] = meter.peak()
        return peaks, params, None, None
    except Exception as e:  # noqa: BLE001 - every failure is recorded, the next config goes on
        # Only the words: the exception's frames hold this config's tensors.
        return peaks, params, phase, (is_oom(e), f"{type(e).__name__}: {e}")


def record(item, peaks, params, phase, err, dev):
    cfg = item["config"]
    r = {
        "id": f"gpu-check/pytorch/{cfg['name']}",
        "table": "gpu-check-pytorch" + ("-cpu" if dev["cpu"] else ""),
        "framework": "pytorch",
        "gpu": dev["name"],
    }
    r.update(records.config_fields(cfg, cfg["precision"]))
    r["params_m"] = round(params / 1e6, 1) if params else None
    oom = err is not None
    peak = max(peaks.values()) if peaks else 0
    r["peak_gb"] = None if oom else peak / GIB
    r["peak_bytes"] = None if oom else peak
    for ph in ("model", "fwd", "bwd"):
        if ph in peaks:
            r[ph + "_gb"] = peaks[ph] / GIB
    if oom:
        r["oom_reported_gb"] = peak / GIB
    r["status"] = "oom" if oom else ("over_budget" if peak / GIB > 60 else "ok")
    if dev["memory"]:
        r["device_memory_gb"] = dev["memory"] / GIB
    if item.get("memory_limit"):
        r["memory_limit_gb"] = item["memory_limit"] / GIB
    r["config_name"] = cfg["name"]
    note = f"torch {torch.__version__}, bf16 autocast, SDPA, AdamW foreach"
    if cfg["model"]["family"] == "unet" and cfg["grad_ckpt"]:
        note += ", no checkpointing (MONAI's DiffusionModelUNet has no hooks)"
    r["note"] = note + (f", oom in {phase}" if oom else "")
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
    items = [(part, it) for part in ("fidelity", "dit_l", "oom") for it in plan.get(part, [])]
    for i, (part, it) in enumerate(items):
        if time.time() > deadline:
            print(f"pytorch: budget spent; {len(items) - i} configs not run", file=sys.stderr)
            break
        start = time.time()
        tracker = AllocTracker(it.get("memory_limit")) if cpu else None
        if tracker:
            with tracker:
                peaks, params, phase, err = phases(it["config"], device, tracker)
        else:
            peaks, params, phase, err = phases(it["config"], device, CudaMeter())
        if err is not None and not err[0]:
            print(f"pytorch: {it['id']}: failed in {phase}: {err}", file=sys.stderr)
            gc.collect()
            continue
        rec = record(it, peaks, params, phase, err, dev)
        wall = time.time() - start
        with open(os.path.join(out, "pytorch.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")
        detail = {"half": "pytorch", "part": part, "id": it["id"], "phases": peaks, "status": rec["status"]}
        detail.update(wall_s=round(wall, 2), params=params, oom_phase=phase if err else None)
        with open(os.path.join(out, "phases.jsonl"), "a") as f:
            f.write(json.dumps(detail) + "\n")
        print(f"pytorch [{i + 1}/{len(items)}] {it['id']}: {rec['status']} {max(peaks.values(), default=0) / GIB:.3f} GiB, {wall:.1f} s")
        gc.collect()
        if not cpu:
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
