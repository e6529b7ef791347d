"""What the GPU check runs: every config of the group's records under the
protocol of the script behind it (`group_plan`, part e); the group's configs
chosen from small to near the card for the worker, the config that must not fit, DiT-L patch 2 at 80x64x64 (with the
memory-efficient attention, then with the decomposed one, which must end
`oom`), and four group-sized configs, one per family, timed cold, warm and as
one task of four; in `--cpu` mode tiny stand-ins of each, so the same code
path runs on a CPU in a minute or two.

A config is a worker `facts::RunConfig` as JSON (what `worker run --config`
reads), built from a measurement record as `MeasurementRecord::run_config`
does (facts/src/record.rs): the record's UNet fields, and where a record
lacks one the defaults that reader assumes (2 ResBlocks, 64 channels per
head, the largest GroupNorm count up to 32 that divides every width).
"""

import json
import math

from records import protocol_of

FIDELITY_COUNT = 34  # (a): at least 30, every family
DIT_L_P2 = "dit_pixel_L_64x64x80_p2"  # (c): the group measured 62.1 GB
# (t): one per family, group-sized: DiT-B patch 4 on the latent, a latent
# UNet, HDiT-S, U-ViT-S (issue 31).
TIMING = ("dit_latent_B_64x64x80_p4", "unet_lat4x_4L_small", "hdit_S_p4__1_2_6_2_1", "uvit_S_p8")


def norm_groups(widths):
    return next((g for g in range(32, 0, -1) if all(w % g == 0 for w in widths)), 1)


def model_of(r):
    fam = r["family"]
    if fam == "unet":
        return {
            "family": "unet",
            "channels": r["channels"],
            "attention_levels": r["attention_levels"],
            "num_res_blocks": r.get("num_res_blocks", 2),
            "num_head_channels": r.get("num_head_channels", 64),
            "norm_num_groups": r.get("norm_num_groups") or norm_groups(r["channels"]),
        }
    m = {"family": fam, "patch": r["patch"]}
    for k in ("variant", "hidden", "heads"):
        if r.get(k) is not None:
            m[k] = r[k]
    if fam == "hdit":
        m["level_depths"] = r["level_depths"]
    elif r.get("depth") is not None:
        m["depth"] = r["depth"]
    return m


def config_of(r, name, precision="bf16-amp"):
    """The worker config of record `r` (the group's run: bf16 autocast, batch as recorded)."""
    return {
        "experiment": "gpu-check",
        "name": name,
        "model": model_of(r),
        "input": {"channels": r["in_channels"], "spatial": r["spatial"]},
        "out_channels": r["out_channels"],
        "batch": r["batch"],
        "precision": precision,
        "grad_ckpt": r["grad_ckpt"],
        "mode": "profile",
        "steps": 1,
        "gpu": "A100-SXM4-80GB",
    }


def read_records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _key(cfg):
    c = dict(cfg, name="", experiment="")
    return json.dumps(c, sort_keys=True)


def spread(records, n):
    """`n` records evenly spaced in log(peak) from the smallest to the largest,
    every family present (its smallest record replaces the nearest pick)."""
    records = sorted(records, key=lambda r: (r["peak_gb"], r["id"]))
    if len(records) <= n:
        return records
    lo, hi = math.log(records[0]["peak_gb"]), math.log(records[-1]["peak_gb"])
    chosen = []
    for i in range(n):
        target = lo + (hi - lo) * i / (n - 1)
        best = min(
            (r for r in records if r not in chosen),
            key=lambda r: (abs(math.log(r["peak_gb"]) - target), r["id"]),
        )
        chosen.append(best)
    for fam in sorted({r["family"] for r in records}):
        if not any(r["family"] == fam for r in chosen):
            first = next(r for r in records if r["family"] == fam)
            counts = {}
            for r in chosen:
                counts[r["family"]] = counts.get(r["family"], 0) + 1
            victim = max(
                (r for r in chosen if counts[r["family"]] > 1),
                key=lambda r: (counts[r["family"]], -abs(math.log(r["peak_gb"] / first["peak_gb"]))),
            )
            chosen[chosen.index(victim)] = first
    return sorted(chosen, key=lambda r: (r["peak_gb"], r["id"]))


def run_order(items):
    """Smallest four first (they compile the kernels), then alternately the
    largest and the smallest left: a part cut short by its budget keeps both
    ends of the range."""
    head, rest = items[:4], items[4:]
    out = list(head)
    while rest:
        out.append(rest.pop())
        if rest:
            out.append(rest.pop(0))
    return out


def gpu_plan(records_path, card_gib):
    """Parts (a)-(d) on a GPU of `card_gib` GiB."""
    records = read_records(records_path)
    cap = 0.9 * card_gib
    seen, usable = set(), []
    for r in records:
        if r.get("framework") != "pytorch" or r.get("superseded") or r["status"] == "oom":
            continue
        if not r.get("peak_gb") or r["peak_gb"] > cap or r["id"] == DIT_L_P2:
            continue
        k = _key(config_of(r, ""))
        if k in seen:
            continue
        seen.add(k)
        usable.append(r)
    fidelity = [dict(item(r), group_peak_gb=r["peak_gb"]) for r in spread(usable, FIDELITY_COUNT)]
    dit_l = next(r for r in records if r["id"] == DIT_L_P2)
    # (b): DiT-XL patch 2 on at least twice the card's memory: the group's own
    # OOM is DiT-XL at 80x64x64 (40,960 tokens) on an 80 GB card, and the peak
    # grows with the tokens, so 80 slices for every 40 GiB of card.
    depth = 80 * max(2, math.ceil(card_gib / 40))
    xl = {k: v for k, v in dit_l.items() if k not in ("hidden", "heads", "depth", "tokens", "params_m")}
    xl.update(id=f"dit_XL_p2_{depth}x64x64", variant="XL", spatial=[depth, 64, 64], peak_gb=None)
    by_id = {r["id"]: r for r in records}
    return {
        "fidelity": run_order(fidelity),
        "oom": [dict(item(xl), expect="oom", protocol="transformer")],
        "dit_l": [dict(item(dit_l), group_peak_gb=dit_l["peak_gb"])],
        # (m): the same with Burn's decomposed attention: 107 GB of f32 scores per head group.
        "materialised": [dict(item(dit_l), expect="oom")],
        "timing": [dict(item(by_id[i]), group_peak_gb=by_id[i]["peak_gb"]) for i in TIMING],
    }


def item(r):
    name = r["id"].replace("/", "_").replace("@", "_")
    return {"id": r["id"], "config": config_of(r, name), "group_peak_gb": r.get("peak_gb")}


def tiny(family, name, spatial=(8, 8, 8), ckpt=False, **model):
    """A CPU-sized config of `family` (the `--cpu` rehearsal)."""
    base = {
        "unet": {"channels": [8, 16], "attention_levels": [False, True], "num_res_blocks": 1, "num_head_channels": 8},
        "dit": {"hidden": 32, "heads": 2, "depth": 2, "patch": 2},
        "hdit": {"hidden": 32, "heads": 2, "patch": 2, "level_depths": [1, 1, 1]},
        "uvit": {"hidden": 32, "heads": 2, "depth": 3, "patch": 2},
    }[family]
    r = dict(base, **model)
    r.update(family=family, in_channels=r.pop("in_channels", 1), out_channels=1, spatial=list(spatial), batch=1, grad_ckpt=ckpt)
    r["id"] = name
    return r


def cpu_plan():
    """The same parts on a CPU: tiny configs of every family, a 64 MiB limit for the OOM."""
    # Checkpointed as the group runs them: every HDiT and U-ViT, the s2d UNets.
    fams = [
        tiny("unet", "tiny_unet_ckpt", ckpt=True),
        tiny("dit", "tiny_dit"),
        tiny("hdit", "tiny_hdit_ckpt", ckpt=True),
        tiny("uvit", "tiny_uvit_ckpt", ckpt=True),
        tiny("dit", "tiny_dit_ckpt", ckpt=True),
        tiny("unet", "tiny_unet_16", spatial=(16, 16, 16)),
    ]
    big = tiny("dit", "tiny_dit_32_p1", spatial=(32, 32, 32), patch=1)
    return {
        "fidelity": [item(r) for r in fams],
        "oom": [dict(item(big), expect="oom", memory_limit=64 << 20, protocol="transformer")],
        # 4,096 tokens: 128 MiB of f32 scores a layer for the decomposed attention, over a 64 MiB limit.
        "dit_l": [item(tiny("dit", "tiny_dit_p1_16", spatial=(16, 16, 16), patch=1))],
        "materialised": [dict(item(tiny("dit", "tiny_dit_p1_16", spatial=(16, 16, 16), patch=1)), expect="oom", memory_limit=64 << 20)],
        "timing": [item(r) for r in fams[:4]],
    }


def _group_entry(r):
    figure = r.get("peak_gb") if r["status"] != "oom" else r.get("oom_reported_gb")
    e = {"id": r["id"], "status": r["status"], "figure": figure}
    for k in ("model_gb", "fwd_gb", "bwd_gb", "params_m"):
        if r.get(k) is not None:
            e[k] = r[k]
    return e


def group_plan(records_path):
    """Part g: every config the group measured (one run per distinct config,
    beside every record of it), each under the protocol of the script behind
    its record. Order: the families in turn, each from its smallest peak up;
    the group's OOMs and the 1.3M-token HDiT configs (a minute each) last."""
    by_key, order = {}, []
    for r in read_records(records_path):
        if r.get("framework") != "pytorch" or r.get("superseded"):
            continue
        proto = protocol_of(r)
        cfg = config_of(r, r["id"])
        k = _key(cfg) + proto
        if k not in by_key:
            # The S2D and HDiT/U-ViT launchers export expandable segments
            # (IDUN/profiling/profile_s2d_3d.slurm, profile_hdit_uvit.slurm).
            expandable = proto == "s2d-unet" or r["family"] in ("hdit", "uvit")
            by_key[k] = {"id": r["id"], "config": cfg, "protocol": proto, "expandable": expandable, "group": []}
            order.append(k)
        by_key[k]["group"].append(_group_entry(r))
    items = [by_key[k] for k in order]

    def slow(it):
        m = it["config"]["model"]
        return any(g["status"] == "oom" for g in it["group"]) or (m["family"] == "hdit" and m["patch"] <= 2)

    def size(it):
        return max((g["figure"] or 0) for g in it["group"])

    lanes = {}
    for it in sorted((i for i in items if not slow(i)), key=lambda i: (size(i), i["id"])):
        lanes.setdefault((it["protocol"], it["config"]["model"]["family"]), []).append(it)
    out, lanes = [], [lanes[k] for k in sorted(lanes)]
    while any(lanes):
        for lane in lanes:
            if lane:
                out.append(lane.pop(0))
    # The OOMs without a figure last: they may run long before they fail.
    unknown = lambda i: any(g["figure"] is None for g in i["group"])  # noqa: E731
    out += sorted((i for i in items if slow(i)), key=lambda i: (unknown(i), size(i), i["id"]))
    return out


def cpu_group_plan():
    """Part g on a CPU: tiny stand-ins, one per protocol and family."""
    fams = [
        ("latent-unet", tiny("unet", "tiny_unet_latent", norm_num_groups=8)),
        ("s2d-unet", dict(tiny("unet", "tiny_unet_s2d", norm_num_groups=8), in_channels=2)),
        ("latent-unet", tiny("unet", "tiny_unet_ckpt", ckpt=True, norm_num_groups=8)),
        ("transformer", tiny("dit", "tiny_dit")),
        ("transformer", tiny("hdit", "tiny_hdit_ckpt", ckpt=True, in_channels=2)),
        ("transformer", tiny("uvit", "tiny_uvit_ckpt", ckpt=True)),
    ]
    return [
        {"id": r["id"], "config": config_of(r, r["id"]), "protocol": p, "group": [],
         "expandable": p == "s2d-unet" or r["family"] in ("hdit", "uvit")}
        for p, r in fams
    ]
