"""The fields of a measurement record (facts/src/record.rs) that a config
gives: one definition for the PyTorch half and the worker half."""

MODEL_KEYS = ("channels", "attention_levels", "num_res_blocks", "num_head_channels", "norm_num_groups",
              "variant", "hidden", "heads", "depth", "patch", "level_depths")


def config_fields(cfg, precision):
    """The record fields of `cfg` (a RunConfig as JSON), run at `precision`."""
    m = cfg["model"]
    r = {
        "family": m["family"],
        "precision": precision,
        "grad_ckpt": cfg["grad_ckpt"],
        "batch": cfg["batch"],
        "in_channels": cfg["input"]["channels"],
        "out_channels": cfg["out_channels"],
        "spatial": cfg["input"]["spatial"],
    }
    r.update({k: m[k] for k in MODEL_KEYS if k in m})
    return r


def protocol_of(record):
    """The protocol of the script behind a record of the group (by its table)."""
    table = record.get("table") or ""
    if table.startswith("unet_latent"):
        return "latent-unet"
    if table.startswith("s2d"):
        return "s2d-unet"
    if record["family"] in ("dit", "hdit", "uvit"):
        return "transformer"
    raise ValueError(f"record {record['id']}: no profiling script known for table `{table}`")
