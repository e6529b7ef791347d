"""summary.md of a GPU check: each config's peak by the group, by PyTorch on
this device and by the worker, the decomposed attention's OOM, the timed
runs (cold, warm, one task of four), and the time each part took against its
budget."""

import json
import os

import against_group

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
    if plan.get("group"):
        lines += ["", "The group's configs, with the group's models, each as its script measured it:", ""]
        lines += against_group.table(out).rstrip("\n").split("\n")
    details = [d for d in _read(os.path.join(out, "phases.jsonl")) if d["half"] == "worker"]
    lines += _materialised(details, plan) + _timing(details, plan)
    return "\n".join(lines) + "\n"


def _row(details, part, id_):
    return next((d for d in details if d["part"] == part and d["id"] == id_), None)


def _materialised(details, plan):
    lines = []
    for it in plan.get("materialised", []):
        d = _row(details, "m", it["id"])
        if d:
            got = d["status"] + (f" in {d['message']}" if d.get("message") else "")
            lines += ["", f"Decomposed attention (`--attention materialised`), {it['id']}: expected `{it['expect']}`, "
                          f"got {got} ({d['wall_s']} s)."]
    return lines


def _phases(d):
    if not d or not d.get("phase_s"):
        return "-"
    return " / ".join(f"{d['phase_s'].get(p, 0):.2f}" for p in ("model", "fwd", "bwd", "step"))


def _timing(details, plan):
    items = plan.get("timing", [])
    if not any(d["part"].startswith("t-") for d in details):
        return []
    lines = ["", "Four configs, one per family, each in its own process (wall seconds; phases model / fwd / bwd / step):", "",
             "| config | cold wall | cold phases | warm wall | warm phases | peak alone | peak in the task of 4 | task vs alone |",
             "|---|---|---|---|---|---|---|---|"]
    for it in items:
        cold, warm, task = (_row(details, p, it["id"]) for p in ("t-cold", "t-warm", "t-task"))
        wall = lambda d: f"{d['wall_s']:.1f}" if d and d.get("wall_s") is not None else "-"  # noqa: E731
        peak = lambda d: d["peak_bytes"] if d and d.get("status") == "ok" and d.get("peak_bytes") else None  # noqa: E731
        alone, inside = peak(warm) or peak(cold), peak(task)
        diff = f"{100 * (inside / alone - 1):+.2f}%" if alone and inside else "-"
        fmt = lambda b: f"{b / GIB:.3f} GiB" if b else "-"  # noqa: E731
        lines.append(f"| {it['id']} | {wall(cold)} | {_phases(cold)} | {wall(warm)} | {_phases(warm)} | {fmt(alone)} | {fmt(inside)} | {diff} |")
    w, t = _row(details, "t-worker-warm", "worker warm"), _row(details, "t-task", f"task of {len(items)}")
    if w:
        lines += ["", f"`worker warm` (filling the cache the warm runs read): {w['wall_s']:.1f} s, exit {w['exit']}."]
    if t:
        alone = sum(d["wall_s"] for d in details if d["part"] == "t-warm" and d.get("wall_s"))
        lines += [f"The task of {len(items)} (one `worker run --manifest`, warm cache): {t['wall_s']:.1f} s, exit {t['exit']}; "
                  f"the same configs alone, warm: {alone:.1f} s in all."]
    return lines


def _pct(a, b):
    return 100.0 * (a / b - 1.0)


def _stats(errs):
    """(median, p90) of the absolute errors, in percent."""
    xs = sorted(abs(e) for e in errs)
    if not xs:
        return None
    med = xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2
    return med, xs[min(len(xs) - 1, int(0.9 * len(xs)))]


def comparison(out, pytorch=None):
    """The tables docs/gpu.md shows of a GPU check's directory: each config the
    PyTorch half or the worker measured, beside the group's record, and the
    errors per family. `pytorch`: the PyTorch records of another check on
    the same card, for a check that ran the worker alone."""
    with open(os.path.join(out, "plan.json")) as f:
        plan = json.load(f)
    torch_rows = {r["config_name"]: r for r in _read(pytorch or os.path.join(out, "pytorch.jsonl"))}
    worker_rows = {r["config_name"]: r for r in _read(os.path.join(out, "worker.jsonl"))}
    lines = ["| config | family | group GiB | PyTorch GiB | PyTorch vs group | worker GiB | worker vs PyTorch |",
             "|---|---|---|---|---|---|---|"]
    by_family = {}
    for part in ("fidelity", "dit_l", "oom"):
        for it in plan.get(part, []):
            name, fam, group = it["config"]["name"], it["config"]["model"]["family"], it.get("group_peak_gb")
            t, w = torch_rows.get(name), worker_rows.get(name)
            if t is None and w is None:
                continue
            tg = t["peak_bytes"] / GIB if t and t.get("peak_bytes") else None
            wg = w["peak_bytes"] / GIB if w and w.get("peak_bytes") else None
            vs_group = _pct(tg, group) if tg and group else None
            vs_torch = _pct(wg, tg) if tg and wg else None
            fam_errs = by_family.setdefault(fam, ([], []))
            if vs_group is not None:
                fam_errs[0].append(vs_group)
            if vs_torch is not None:
                fam_errs[1].append(vs_torch)
            cell = lambda v, f: "-" if v is None else f.format(v)  # noqa: E731
            lines.append(f"| {name} | {fam} | {cell(group, '{:.1f}')} | {cell(tg, '{:.3f}')} | {cell(vs_group, '{:+.1f}%')} "
                         f"| {cell(wg, '{:.3f}')} | {cell(vs_torch, '{:+.1f}%')} |")
    lines += ["", "| family | PyTorch runs | PyTorch vs group: median, p90 abs. | worker runs | worker vs PyTorch: median, p90 abs. |",
              "|---|---|---|---|---|"]
    for fam, (g, w) in sorted(by_family.items()):
        fmt = lambda s: "-" if s is None else f"{s[0]:.1f}%, {s[1]:.1f}%"  # noqa: E731
        lines.append(f"| {fam} | {len(g)} | {fmt(_stats(g))} | {len(w)} | {fmt(_stats(w))} |")
    return "\n".join(lines) + "\n"


def runs_table(out):
    """Every worker run of a GPU check's directory (phases.jsonl, and the
    events of runs made after it, followup-events.jsonl): its end, the kernel
    cache it found, and seconds per phase."""
    rows = []
    for d in _read(os.path.join(out, "phases.jsonl")):
        if d["half"] == "worker" and d.get("phase_s") is not None:
            rows.append((d["id"], d["part"], d.get("kernel_cache") or "-", d["phase_s"], d.get("worker_wall_s"), d["status"]))
    start = None
    for e in _read(os.path.join(out, "followup-events.jsonl")):
        if e["event"] == "start":
            start, phases = e, {}
        elif e["event"] == "phase_end":
            phases[e["phase"]] = e["seconds"]
        elif e["event"] == "result" and start is not None:
            rows.append((start["config"], "after", start["env"].get("kernel_cache", "-"), phases, e.get("wall_s"), e["status"]))
    lines = ["| config | run | kernel cache | model s | fwd s | bwd s | step s | worker wall s | end |", "|---|---|---|---|---|---|---|---|---|"]
    for name, part, cache, ph, wall, status in rows:
        cell = lambda p: f"{ph[p]:.2f}" if p in ph else "-"  # noqa: E731
        w = f"{wall:.1f}" if wall is not None else "-"
        lines.append(f"| {name} | {part} | {cache} | {cell('model')} | {cell('fwd')} | {cell('bwd')} | {cell('step')} | {w} | {status} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    args = sys.argv[1:]
    if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--pytorch"):
        sys.exit(
            "usage: summary.py DIR [--pytorch FILE]  (a GPU check's records: the tables docs/gpu.md shows;\n"
            "       FILE: PyTorch records of another check on the same card, for a check that ran the worker alone)"
        )
    print(comparison(args[0], args[2] if len(args) == 3 else None))
    print(runs_table(args[0]), end="")
