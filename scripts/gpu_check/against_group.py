"""The PyTorch reference against the group's records, column by column.

The group printed GiB to 0.1, so a figure `f` stands for [f - 0.05, f + 0.05):
the reference *matches* a column when its own figure rounds to the same
tenth (|ours - f| <= 0.05 GiB, with 1e-9 of slack for the float). An OOM
matches an OOM; where the group printed the running maximum at its OOM (the
S2D report's starred values), that figure is compared too.

Usage: python3 against_group.py DIR [--mode MODE]
  DIR: a GPU check's directory (plan.json, pytorch.jsonl); prints the
  markdown table and the counts. With --mode, a config that a probe of DIR
  (probe-*.jsonl: the marks of configs run again under a named setting, such
  as `no-cudnn`) ran under MODE is taken from the probe instead.
"""

import json
import os
import sys

GIB = float(1 << 30)
HALF_TENTH = 0.05 + 1e-9
COLUMNS = (("model_gb", "model_gb"), ("fwd_gb", "fwd_gb"), ("bwd_gb", "bwd_gb"))


def _read(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def compare(group, ours):
    """(matched, what ours says, the gap in GiB or None) for one group record."""
    if group["status"] == "oom":
        if ours["status"] != "oom":
            return False, f"{ours['peak_gb']:.3f} (ran)", None
        g, o = group.get("figure"), ours.get("oom_reported_gb")
        if g is None or o is None:
            return True, "oom", None
        return abs(o - g) <= HALF_TENTH, f"oom at {o:.3f}", o - g
    if ours["status"] == "oom":
        return False, "oom", None
    o = ours["peak_gb"]
    gaps = [o - group["figure"]]
    for gk, ok in COLUMNS:
        if group.get(gk) is not None and ours.get(ok) is not None:
            gaps.append(ours[ok] - group[gk])
    return all(abs(x) <= HALF_TENTH for x in gaps), f"{o:.3f}", gaps[0]


def probe_records(out, mode):
    """The probes' runs under `mode`, as the fields `compare` reads."""
    recs = {}
    for name in sorted(os.listdir(out)):
        if not (name.startswith("probe-") and name.endswith(".jsonl")):
            continue
        for row in _read(os.path.join(out, name)):
            if row["mode"] != mode:
                continue
            m = row["marks"]
            r = {f"{k}_gb": m[k] / GIB for k in ("model", "fwd", "bwd") if k in m}
            if row.get("failure"):
                r.update(status="oom", oom_reported_gb=m["at_failure"] / GIB)
            else:
                r.update(status="ok", peak_gb=m["step"] / GIB)
            recs[row["id"]] = r
    return recs


def rows(out, mode=None):
    with open(os.path.join(out, "plan.json")) as f:
        plan = json.load(f)
    ours = {r["config_name"]: r for r in _read(os.path.join(out, "pytorch.jsonl"))}
    if mode:
        ours.update(probe_records(out, mode))
    for it in plan.get("group", []):
        r = ours.get(it["config"]["name"])
        if r is None:
            continue
        for g in it["group"]:
            matched, said, gap = compare(g, r)
            yield it, g, r, matched, said, gap


def table(out, mode=None):
    lines = [
        "| record | family | protocol | group GiB | reference GiB | gap GiB | group's columns (model / fwd / bwd) | ours | within 0.1 GiB rounding |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    counts = {}
    for it, g, r, matched, said, gap in rows(out, mode):
        fam = it["config"]["model"]["family"]
        c = counts.setdefault(fam, [0, 0])
        c[0] += matched
        c[1] += 1
        cols = " / ".join("-" if g.get(k) is None else f"{g[k]:.1f}" for k, _ in COLUMNS)
        mine = " / ".join("-" if r.get(k) is None else f"{r[k]:.2f}" for _, k in COLUMNS)
        fig = "OOM" if g["status"] == "oom" and g.get("figure") is None else (
            f"{g['figure']:.1f}" + (" (OOM)" if g["status"] == "oom" else ""))
        lines.append(
            f"| {g['id']} | {fam} | {it['protocol']} | {fig} | {said} | {'-' if gap is None else f'{gap:+.3f}'} "
            f"| {cols if it['protocol'] == 'latent-unet' else '-'} | {mine if it['protocol'] == 'latent-unet' else '-'} "
            f"| {'yes' if matched else 'no'} |"
        )
    total = [sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())]
    lines += ["", "| family | records | within the rounding |", "|---|---|---|"]
    for fam, (m, n) in sorted(counts.items()):
        lines.append(f"| {fam} | {n} | {m} ({100 * m / n:.0f}%) |")
    if total[1]:
        lines.append(f"| all | {total[1]} | {total[0]} ({100 * total[0] / total[1]:.0f}%) |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--mode"):
        sys.exit(__doc__)
    print(table(args[0], args[2] if len(args) == 3 else None), end="")
