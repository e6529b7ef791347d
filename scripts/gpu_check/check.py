"""The GPU check, one command (scripts/gpu-check.sh calls this; docs/gpu.md).

Parts, each with a time budget (seconds; unused time passes to the next):

  e  PyTorch on the same device: every config the group measured, with the
     group's models, each as the script behind its record measured it
     (torch_half.py, protocols.py), then the config of b
  a  fidelity: the group's configs from small to near the card through
     `worker run --config`, one process each, as `worker fidelity` runs them,
     sharing one kernel cache
  c  DiT-L patch 2 at 80x64x64 (the group measured 62.1 GB)
  m  the same with Burn's decomposed attention (`--attention materialised`):
     it must end `oom`
  b  a config that must not fit: it must end `oom`
  t  four group-sized configs, one per family, each in its own process: cold
     (each on an empty kernel cache), then `worker warm` filling a cache, then
     warm from it, then the four as one task (`configs_per_task: 4`)

Records land in OUT as the project reads them (facts/src/record.rs):
worker.jsonl (`orchestrator calibrate --records`), pytorch.jsonl (also what
`worker fidelity --records` reads: framework pytorch), phases.jsonl (every
run's per-phase bytes, wall time, kernel cache state) and summary.md.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plan as planner  # noqa: E402
import summary  # noqa: E402
from worker_half import WorkerHalf  # noqa: E402

BUDGETS = {"setup": 20, "e": 80, "a": 140, "c": 60, "m": 30, "b": 30, "t": 130}
ORDER = ["e", "a", "c", "m", "b", "t"]


def args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--records", required=True, help="data/vram-measurements.jsonl")
    p.add_argument("--backend", default=None, help="worker backend (default: vulkan; flex with --cpu)")
    p.add_argument("--cpu", action="store_true", help="rehearse on the CPU: tiny configs, flex, no GPU figure")
    p.add_argument("--card-gib", type=float, default=None, help="the device's memory (default: from nvidia-smi, else 79.2)")
    p.add_argument("--budget", action="append", default=[], metavar="PART=SECONDS")
    p.add_argument("--scratch", default=None, help="kernel caches (default: a temp dir; not part of OUT)")
    p.add_argument("--per-config", type=float, default=None, help="seconds a config may take (default: 120; 30 with --cpu)")
    p.add_argument("--parts", default="".join(ORDER), help="which parts to run (default: all, as eacmbt)")
    p.add_argument(
        "--fidelity-ids",
        default=None,
        help="comma-separated record ids: part a runs these of the plan's fidelity configs, in this order",
    )
    return p.parse_args()


def card_gib(given):
    if given:
        return given
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
        return float(out.split()[0]) / 1024.0
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return 79.2


class Clock:
    """Per-part deadlines; what a part leaves unused passes to the next."""

    def __init__(self, budgets):
        self.budgets, self.carry, self.spent = budgets, 0.0, {}
        self.start = time.time()

    def part(self, name):
        self.current, self.t0 = name, time.time()
        self.deadline = self.t0 + self.budgets[name] + self.carry
        return self.deadline

    def left(self):
        return self.deadline - time.time()

    def end(self):
        used = time.time() - self.t0
        self.spent[self.current] = round(used, 1)
        self.carry = max(0.0, self.budgets[self.current] + self.carry - used)


def run_items(half, clock, part, items, per_config, **kw):
    rows, skipped = [], []
    for it in items:
        if clock.left() < 5:
            skipped.append(it["id"])
            continue
        d = half.run(part, it, min(per_config, clock.left()), **kw)
        print(f"worker {part}: {it['id']}: {d['status']} ({d['wall_s']} s)", flush=True)
        if it.get("expect") and d["status"] != it["expect"]:
            print(f"worker {part}: {it['id']}: expected `{it['expect']}`, got `{d['status']}`", flush=True)
        rows.append(d)
    if skipped:
        print(f"worker {part}: budget spent, not run: {', '.join(skipped)}", flush=True)
    return rows, skipped


def timing(half, clock, items, scratch, per_config):
    """Part t: cold, `worker warm`, warm, then the four as one task."""
    skipped = []
    for i, it in enumerate(items):  # each cold: a kernel cache of its own, empty
        _, s = run_items(half, clock, "t-cold", [it], per_config, cache_dir=os.path.join(scratch, f"cold-{i}"))
        skipped += s
    cache = os.path.join(scratch, "warmed")
    if clock.left() > 10:
        w = half.warm("t-worker-warm", cache, min(3 * per_config, clock.left()))
        print(f"worker warm: exit {w['exit']} ({w['wall_s']} s)", flush=True)
    _, s = run_items(half, clock, "t-warm", items, per_config, cache_dir=cache, record=False)
    skipped += s
    if clock.left() > 10:
        task, rows = half.task("t-task", items, clock.left(), cache_dir=cache)
        statuses = ", ".join(f"{r['id']} {r['status']}" for r in rows)
        print(f"worker task of {len(items)}: exit {task['exit']} ({task['wall_s']} s): {statuses}", flush=True)
    else:
        skipped.append("task")
    return skipped


def torch_half(plan_path, a, clock):
    """Part e: the configs without the expandable-segments allocator, then
    those with it (40% of the time left to the first, all that is left then to the second)."""
    script = os.path.join(os.path.dirname(__file__), "torch_half.py")
    for expandable in (False, True):
        share = clock.left() * (1.0 if expandable else 0.4)
        cmd = [sys.executable, script, plan_path, a.out, str(time.time() + share)]
        cmd += (["--cpu"] if a.cpu else []) + (["--expandable"] if expandable else [])
        env = dict(os.environ)
        env.pop("PYTORCH_ALLOC_CONF", None)
        if expandable:
            env["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"
        try:
            subprocess.run(cmd, timeout=max(share + 20, 1), env=env)
        except subprocess.TimeoutExpired:
            print("pytorch: killed at its budget", flush=True)


def main():
    a = args()
    budgets = dict(BUDGETS)
    for b in a.budget:
        k, v = b.split("=", 1)
        budgets[k] = float(v)
    os.makedirs(a.out, exist_ok=True)
    work = os.path.join(a.out, "runs")
    scratch = a.scratch or tempfile.mkdtemp(prefix="gpu-check-")
    backend = a.backend or ("flex" if a.cpu else "vulkan")
    card = card_gib(a.card_gib)
    plan = planner.cpu_plan() if a.cpu else planner.gpu_plan(a.records, card)
    plan["group"] = planner.cpu_group_plan() if a.cpu else planner.group_plan(a.records)
    if a.fidelity_ids:
        by_id = {item["id"]: item for item in plan["fidelity"]}
        wanted = a.fidelity_ids.split(",")
        unknown = [i for i in wanted if i not in by_id]
        if unknown:
            sys.exit(f"gpu-check: --fidelity-ids not in the plan: {', '.join(unknown)}")
        plan["fidelity"] = [by_id[i] for i in wanted]
    plan_path = os.path.join(a.out, "plan.json")
    with open(plan_path, "w") as f:
        json.dump(plan, f, indent=1)
    parts = [p for p in ORDER if p in a.parts]
    estimate = budgets["setup"] + sum(budgets[p] for p in parts)
    print(
        f"gpu-check: {'CPU rehearsal (no GPU figure)' if a.cpu else f'{card:.1f} GiB device'}, backend {backend}; "
        f"{len(plan['fidelity'])} fidelity configs; GPU time at most {estimate:.0f} s "
        f"({', '.join(f'{p} {budgets[p]:.0f}' for p in ['setup'] + parts)})",
        flush=True,
    )
    table = "gpu-check-cpu" if a.cpu else "gpu-check"
    half = WorkerHalf(a.worker, backend, a.out, work, table)
    clock, skipped = Clock(budgets), {}
    per_config = a.per_config or (30 if a.cpu else 120)
    cache = os.path.join(scratch, "cache")  # parts a, c, m, b: one node's cache
    for p in parts:
        deadline = clock.part(p)
        if p == "e":
            torch_half(plan_path, a, clock)
        elif p == "a":
            _, skipped["a"] = run_items(half, clock, "a", plan["fidelity"], per_config, cache_dir=cache)
        elif p == "c":
            _, skipped["c"] = run_items(half, clock, "c", plan["dit_l"], clock.left(), cache_dir=cache)
        elif p == "m":
            _, skipped["m"] = run_items(
                half, clock, "m", plan["materialised"], clock.left(), cache_dir=cache, attention="materialised", record=False
            )
        elif p == "b":
            _, skipped["b"] = run_items(half, clock, "b", plan["oom"], clock.left(), cache_dir=cache)
        elif p == "t":
            skipped["t"] = timing(half, clock, plan["timing"], scratch, per_config)
        clock.end()
    total = round(time.time() - clock.start, 1)
    text = summary.markdown(a.out, plan, clock.spent, skipped, total, estimate, a.cpu)
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
