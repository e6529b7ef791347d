"""summary.md of a GPU check: each config's peak by the group, by PyTorch on
this device and by the worker, the cold and warm runs, and the time each part
took against its budget."""

import json
import os

GIB = float(1 << 30)


def _read(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _gib(r):
    if r is None:
        return "-"
    if r["status"] == "oom":
        return "oom"
    return f"{r['peak_bytes'] / GIB:.3f}"


def _err(a, b):
    if a is None or b is None or a["status"] == "oom" or b["status"] == "oom":
        return "-"
    return f"{100 * (a['peak_bytes'] / b['peak_bytes'] - 1):+.1f}%"


def markdown(out, plan, spent, skipped, total, estimate, cpu):
    by_name = lambda rows: {r["config_name"]: r for r in rows}  # noqa: E731
    torch_rows, worker_rows = by_name(_read(os.path.join(out, "pytorch.jsonl"))), by_name(_read(os.path.join(out, "worker.jsonl")))
    what = "CPU rehearsal: tiny configs, no GPU figure" if cpu else "GPU"
    lines = [f"# GPU check ({what})", "", f"Time: {total:.0f} s of at most {estimate:.0f} s estimated.", ""]
    lines += ["| part | seconds | not run (budget) |", "|---|---|---|"]
    for p, s in spent.items():
        lines.append(f"| {p} | {s} | {', '.join(skipped.get(p, [])) or '-'} |")
    lines += ["", "| part | config | family | group GiB | PyTorch GiB | worker GiB | worker vs PyTorch |", "|---|---|---|---|---|---|---|"]
    for part in ("fidelity", "dit_l", "oom"):
        for it in plan.get(part, []):
            name = it["config"]["name"]
            t, w = torch_rows.get(name), worker_rows.get(name)
            group = it.get("group_peak_gb")
            lines.append(
                f"| {part} | {it['id']} | {it['config']['model']['family']} | {group if group is not None else it.get('expect', '-')} "
                f"| {_gib(t)} | {_gib(w)} | {_err(w, t)} |"
            )
    runs = [d for d in _read(os.path.join(out, "phases.jsonl")) if d["half"] == "worker" and d["part"].startswith("d-")]
    if runs:
        lines += ["", "| config | cold s | warm s | kernel cache cold / warm |", "|---|---|---|---|"]
        for it in plan.get("cache", []):
            cold = next((d for d in runs if d["id"] == it["id"] and d["part"] == "d-cold"), None)
            warm = next((d for d in runs if d["id"] == it["id"] and d["part"] == "d-warm"), None)
            wall = lambda d: f"{d['wall_s']:.1f}" if d else "-"  # noqa: E731
            cache = f"{(cold or {}).get('kernel_cache')} / {(warm or {}).get('kernel_cache')}"
            lines.append(f"| {it['id']} | {wall(cold)} | {wall(warm)} | {cache} |")
    return "\n".join(lines) + "\n"
