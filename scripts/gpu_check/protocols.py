"""How each of the group's profiling scripts measured its records, written
anew from the facts (`ModeS7/AIS4900_master`; the team's docs/group-code.md):

- `latent-unet` (`misc/profiling/profile_latent_3d_unet.py@02d6741`): the
  peak window opens once, before the build; Model = `memory_allocated` after
  the build; forward and `output.mean()` under autocast; Fwd, Bwd, Total =
  the running `max_memory_allocated` after forward, after backward and after
  an `AdamW(lr=1e-4)` created after backward has stepped.
- `s2d-unet` (`misc/profiling/profile_s2d_3d_memory.py@7dc81f3:57-110`): the
  window opens before the build; AdamW is created before forward; images,
  labels, noise, the noisy mix and the concatenated input live through the
  step; fp32 MSE of the prediction against `images - noise`; one figure after
  backward and step, and at an OOM the running maximum at the failure.
- `transformer` (`misc/profile_dit_memory.py@3140d97`,
  `misc/profiling/profile_hdit_uvit_memory.py@ff513e0`): model and AdamW
  built, the allocator's cache emptied, the window opened; forward and
  `pred.float().pow(2).mean()` under autocast; a `GradScaler` scales the loss
  and steps; one figure after the step.

Every run is batch 1 in bf16 autocast. `run(protocol, cfg, device, meter)`
returns the marks (bytes: `model` where the protocol reads it, and the running
maximum after `fwd`, `bwd`, `step`), the parameter count, and the failure
(`(is_oom, text, phase)`) or None.
"""

import gc

import torch

import models


def is_oom(e):
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def _build(cfg, device):
    # Built on the device directly (the same parameters in the same bytes as
    # `.to(device)` after a CPU build, without the CPU's initialisation time).
    with device:
        return models.build(cfg)


def _input(cfg, device, channels=None):
    b = cfg["batch"]
    return torch.randn(b, channels or cfg["input"]["channels"], *cfg["input"]["spatial"], device=device)


def _latent_unet(cfg, device, meter, marks):
    meter.reset_peak()
    model = _build(cfg, device)
    model.train()
    marks["model"] = meter.current()
    marks["phase"] = "fwd"
    x = _input(cfg, device)
    timesteps = torch.randint(0, 1000, (cfg["batch"],), device=device)
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        output = model(x, timesteps)
        loss = output.mean()
    marks["fwd"] = meter.peak()
    marks["phase"] = "bwd"
    loss.backward()
    marks["bwd"] = meter.peak()
    marks["phase"] = "step"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    opt.step()
    opt.zero_grad()
    marks["step"] = meter.peak()


def _s2d_unet(cfg, device, meter, marks):
    meter.reset_peak()
    model = _build(cfg, device)
    marks["model"] = meter.current()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    marks["phase"] = "fwd"
    c = cfg["out_channels"]  # the image's channels; the input is cat(image, seg)
    images = _input(cfg, device, c)
    labels = _input(cfg, device, c)
    b = cfg["batch"]
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        noise = torch.randn_like(images)
        t = torch.rand(b, device=device)
        t_exp = t.view(b, 1, 1, 1, 1)
        noisy = (1 - t_exp) * images + t_exp * noise
        model_input = torch.cat([noisy, labels], dim=1)
        pred = model(model_input, timesteps=(t * 1000).float())
        target = images - noise
        loss = ((pred.float() - target.float()) ** 2).mean()
    marks["fwd"] = meter.peak()
    marks["phase"] = "bwd"
    loss.backward()
    marks["bwd"] = meter.peak()
    marks["phase"] = "step"
    opt.step()
    marks["step"] = meter.peak()


def _transformer(cfg, device, meter, marks):
    model = _build(cfg, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(device.type)
    gc.collect()
    meter.empty_cache()
    meter.reset_peak()
    marks["model"] = meter.current()
    marks["phase"] = "fwd"
    x = _input(cfg, device)
    t = torch.rand(cfg["batch"], device=device)
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        pred = model(x, t)
        loss = pred.float().pow(2).mean()
    marks["fwd"] = meter.peak()
    marks["phase"] = "bwd"
    scaler.scale(loss).backward()
    marks["bwd"] = meter.peak()
    marks["phase"] = "step"
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    marks["step"] = meter.peak()


RUNNERS = {"latent-unet": _latent_unet, "s2d-unet": _s2d_unet, "transformer": _transformer}


def run(protocol, cfg, device, meter):
    """One config under `protocol`: (marks, params, failure or None)."""
    marks = {"phase": "model"}
    params = count_params(cfg)
    try:
        RUNNERS[protocol](cfg, device, meter, marks)
        return marks, params, None
    except Exception as e:  # noqa: BLE001 - every failure is recorded, the next config goes on
        # Only the words: the exception's frames hold this config's tensors.
        failure = (is_oom(e), f"{type(e).__name__}: {e}"[:300], marks["phase"])
        marks["at_failure"] = meter.peak()
        return marks, params, failure


def count_params(cfg):
    """The model's parameters, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in models.build(cfg).parameters())
