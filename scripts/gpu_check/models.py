"""The project's PyTorch reference models for DiT, HDiT and U-ViT.

Each is written to build exactly what the worker builds (worker/src/models/:
dit.rs, hdit.rs, uvit.rs, mod.rs; sizes from spec/src/model.rs), so that
PyTorch's `max_memory_allocated` and the worker's peak describe one network:
the parameter count of every model equals `spec::params::count` (the records'
`params_m`). The UNet is MONAI's `DiffusionModelUNet` (see unet()).

Attention is `F.scaled_dot_product_attention` (SDPA: the flash or
memory-efficient kernel, never the N x N scores), and with `grad_ckpt` every
transformer block runs under `torch.utils.checkpoint` (non-reentrant), as the
group's runs wrap each block.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

TIME_FREQ_DIM = 256

# (hidden, heads, depth) per family and variant: spec/src/model.rs `Variant::dims`.
VARIANTS = {
    "dit": {"S": (384, 6, 12), "B": (768, 12, 12), "L": (1024, 16, 24), "XL": (1152, 16, 28)},
    "uvit": {"S": (512, 8, 13), "S-Deep": (512, 8, 17), "M": (768, 12, 17), "L": (1024, 16, 21)},
}
VARIANTS["hdit"] = VARIANTS["dit"]


def dims(family, cfg):
    """(hidden, heads, depth) of a transformer config: explicit values win over the variant."""
    base = VARIANTS[family].get(cfg.get("variant") or "", (None, None, None))
    hidden = cfg.get("hidden") or base[0]
    heads = cfg.get("heads") or base[1]
    depth = cfg.get("depth") or base[2]
    if family == "hdit":
        depth = sum(cfg["level_depths"])
    return hidden, heads, depth


def timestep_embedding(t, dim=TIME_FREQ_DIM):
    """Sinusoidal embedding [B, dim]: the cos half, then the sin half (MONAI and DiT)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb


class TimeMlp(nn.Module):
    """sinusoidal(256) -> Linear(256, h) -> SiLU -> Linear(h, h)."""

    def __init__(self, h):
        super().__init__()
        self.fc1 = nn.Linear(TIME_FREQ_DIM, h)
        self.fc2 = nn.Linear(h, h)

    def forward(self, t):
        return self.fc2(F.silu(self.fc1(timestep_embedding(t))))


def self_attention(qkv, heads):
    """[B, N, 3h] packed q/k/v -> [B, N, h] through SDPA."""
    b, n, h3 = qkv.shape
    h = h3 // 3
    qkv = qkv.reshape(b, n, 3, heads, h // heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    out = F.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).reshape(b, n, h)


def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class DitBlock(nn.Module):
    """adaLN-Zero block: 18h^2 + 15h parameters."""

    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)
        self.ada_ln = nn.Linear(h, 6 * h)

    def forward(self, x, c):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.ada_ln(F.silu(c)).chunk(6, dim=1)
        hdim = x.shape[-1]
        h = modulate(F.layer_norm(x, (hdim,), eps=1e-6), shift_msa, scale_msa)
        x = x + gate_msa.unsqueeze(1) * self.proj(self_attention(self.qkv(h), self.heads))
        h = modulate(F.layer_norm(x, (hdim,), eps=1e-6), shift_mlp, scale_mlp)
        return x + gate_mlp.unsqueeze(1) * self.fc2(F.gelu(self.fc1(h), approximate="tanh"))


class FinalLayer(nn.Module):
    def __init__(self, h, patch, out):
        super().__init__()
        self.ada_ln = nn.Linear(h, 2 * h)
        self.proj = nn.Linear(h, patch**3 * out)

    def forward(self, x, c):
        shift, scale = self.ada_ln(F.silu(c)).chunk(2, dim=1)
        return self.proj(modulate(F.layer_norm(x, (x.shape[-1],), eps=1e-6), shift, scale))


def to_tokens(x):
    """[B, h, D', H', W'] -> [B, N, h]."""
    b, h = x.shape[:2]
    return x.reshape(b, h, -1).transpose(1, 2)


def unpatchify(x, grid, p, c):
    """Tokens [B, N, c*p^3] (ordered c, pd, ph, pw) -> [B, c, D, H, W]."""
    b = x.shape[0]
    gd, gh, gw = grid
    x = x.reshape(b, gd, gh, gw, c, p, p, p).permute(0, 4, 1, 5, 2, 6, 3, 7)
    return x.reshape(b, c, gd * p, gh * p, gw * p)


def merge_tokens(x, grid):
    """2x2x2 neighbours merged: [B, N, h] -> [B, N/8, 8h] (worker/src/models/mod.rs)."""
    b, _, h = x.shape
    gd, gh, gw = grid
    x = x.reshape(b * gd // 2, 2, gh // 2, 2, gw // 2, 2 * h).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, gd * gh * gw // 8, 8 * h)


def split_tokens(x, grid):
    """Inverse of merge_tokens: [B, N/8, 8h] -> [B, N, h]."""
    b, _, h8 = x.shape
    h = h8 // 8
    gd, gh, gw = grid
    x = x.reshape(b * gd // 2, gh // 2, gw // 2, 2, 2, 2 * h).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, gd * gh * gw, h)


def sincos_table(grid, h):
    """DiT's fixed 3D sin-cos position table [tokens, h] (worker: `sincos_table`)."""
    gd, gh, gw = grid
    per_axis = (h // 6) * 2
    half = per_axis // 2
    idx = torch.arange(gd * gh * gw)
    pos = torch.stack([idx // (gh * gw), (idx // gw) % gh, idx % gw], dim=1).double()
    omega = 1.0 / 10000 ** (torch.arange(half).double() / max(half, 1))
    table = torch.zeros(gd * gh * gw, h, dtype=torch.float64)
    for a in range(3):
        v = pos[:, a : a + 1] * omega[None]
        table[:, a * per_axis : a * per_axis + half] = torch.sin(v)
        table[:, a * per_axis + half : (a + 1) * per_axis] = torch.cos(v)
    return table.float()


def grid_of(spatial, p):
    d, h, w = spatial
    if d % p or h % p or w % p:
        raise ValueError(f"patch {p} does not divide the input {d}x{h}x{w}")
    return (d // p, h // p, w // p)


def run_blocks(blocks, x, c, ckpt):
    for b in blocks:
        x = checkpoint(b, x, c, use_reentrant=False) if ckpt else b(x, c)
    return x


class Dit(nn.Module):
    def __init__(self, cfg, cin, cout, spatial, ckpt):
        super().__init__()
        h, heads, depth = dims("dit", cfg)
        p = cfg["patch"]
        self.grid, self.p, self.cout, self.ckpt = grid_of(spatial, p), p, cout, ckpt
        self.patch_embed = nn.Conv3d(cin, h, p, stride=p)
        self.pos = nn.Parameter(sincos_table(self.grid, h), requires_grad=False)
        self.time = TimeMlp(h)
        self.blocks = nn.ModuleList(DitBlock(h, heads) for _ in range(depth))
        self.final_layer = FinalLayer(h, p, cout)

    def forward(self, x, t):
        x = to_tokens(self.patch_embed(x)) + self.pos
        c = self.time(t)
        x = run_blocks(self.blocks, x, c, self.ckpt)
        return unpatchify(self.final_layer(x, c), self.grid, self.p, self.cout)


class Transition(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.merge = nn.Linear(8 * h, h)
        self.split = nn.Linear(h, 8 * h)
        self.skip = nn.Linear(2 * h, h)


class Hdit(nn.Module):
    """Hourglass DiT: DiT blocks per level, 2x2x2 merges down, splits up, skips joined by a Linear(2h, h)."""

    def __init__(self, cfg, cin, cout, spatial, ckpt):
        super().__init__()
        h, heads, _ = dims("hdit", cfg)
        p, depths = cfg["patch"], cfg["level_depths"]
        if len(depths) % 2 == 0:
            raise ValueError("level_depths must have odd length")
        levels = (len(depths) + 1) // 2
        grids = [grid_of(spatial, p)]
        for _ in range(1, levels):
            g = grids[-1]
            if any(s % 2 for s in g):
                raise ValueError(f"token grid {g} cannot be merged 2x2x2")
            grids.append(tuple(s // 2 for s in g))
        self.grids, self.p, self.cout, self.ckpt = grids, p, cout, ckpt

        def blocks(n):
            return nn.ModuleList(DitBlock(h, heads) for _ in range(n))

        self.patch_embed = nn.Conv3d(cin, h, p, stride=p)
        self.pos = nn.ParameterList(nn.Parameter(torch.randn(g[0] * g[1] * g[2], h) * 0.02) for g in grids)
        self.time = TimeMlp(h)
        self.down = nn.ModuleList(blocks(n) for n in depths[: levels - 1])
        self.mid = blocks(depths[levels - 1])
        self.up = nn.ModuleList(blocks(n) for n in reversed(depths[levels:]))
        self.transitions = nn.ModuleList(Transition(h) for _ in range(levels - 1))
        self.final_layer = FinalLayer(h, p, cout)

    def forward(self, x, t):
        c = self.time(t)
        x = to_tokens(self.patch_embed(x)) + self.pos[0]
        skips = []
        for lvl, level in enumerate(self.down):
            x = run_blocks(level, x, c, self.ckpt)
            skips.append(x)
            x = self.transitions[lvl].merge(merge_tokens(x, self.grids[lvl])) + self.pos[lvl + 1]
        x = run_blocks(self.mid, x, c, self.ckpt)
        for lvl in reversed(range(len(self.up))):
            tr = self.transitions[lvl]
            up = split_tokens(tr.split(x), self.grids[lvl])
            x = run_blocks(self.up[lvl], tr.skip(torch.cat([up, skips.pop()], dim=2)), c, self.ckpt)
        return unpatchify(self.final_layer(x, c), self.grids[0], self.p, self.cout)


class UvitBlock(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.proj = nn.Linear(h, h)
        self.norm2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)

    def forward(self, x):
        x = x + self.proj(self_attention(self.qkv(self.norm1(x)), self.heads))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class SkipBlock(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.skip = nn.Linear(2 * h, h)
        self.block = UvitBlock(h, heads)

    def forward(self, x, skip):
        return self.block(self.skip(torch.cat([x, skip], dim=2)))


class Uvit(nn.Module):
    """U-ViT: time as a token, long skips between the halves; output channels = input channels."""

    def __init__(self, cfg, cin, spatial, ckpt):
        super().__init__()
        h, heads, depth = dims("uvit", cfg)
        p = cfg["patch"]
        self.grid, self.p, self.cin, self.ckpt = grid_of(spatial, p), p, cin, ckpt
        tokens = self.grid[0] * self.grid[1] * self.grid[2]
        half = depth // 2
        self.patch_embed = nn.Conv3d(cin, h, p, stride=p)
        self.time = TimeMlp(h)
        self.pos = nn.Parameter(torch.randn(1 + tokens, h) * 0.02)
        self.in_blocks = nn.ModuleList(UvitBlock(h, heads) for _ in range(half))
        self.mid = nn.ModuleList(UvitBlock(h, heads) for _ in range(depth - 2 * half))
        self.out_blocks = nn.ModuleList(SkipBlock(h, heads) for _ in range(half))
        self.norm = nn.LayerNorm(h)
        self.pred = nn.Linear(h, p**3 * cin)
        self.final_conv = nn.Conv3d(cin, cin, 3, padding=1)

    def _run(self, block, *args):
        return checkpoint(block, *args, use_reentrant=False) if self.ckpt else block(*args)

    def forward(self, x, t):
        tokens = to_tokens(self.patch_embed(x))
        x = torch.cat([self.time(t).unsqueeze(1).to(tokens.dtype), tokens], dim=1) + self.pos
        skips = []
        for b in self.in_blocks:
            x = self._run(b, x)
            skips.append(x)
        for b in self.mid:
            x = self._run(b, x)
        for b in self.out_blocks:
            x = self._run(b, x, skips.pop())
        x = self.pred(self.norm(x))[:, 1:]
        return self.final_conv(unpatchify(x, self.grid, self.p, self.cin))


def unet(cfg, cin, cout):
    """MONAI's DiffusionModelUNet (spatial_dims=3) as the group ran it."""
    try:
        from monai.networks.nets import DiffusionModelUNet
    except ImportError:  # MONAI before 1.4 kept it in `generative`
        from generative.networks.nets import DiffusionModelUNet
    levels = len(cfg["channels"])
    per_level = lambda v: list(v) if isinstance(v, list) else [v] * levels  # noqa: E731
    return DiffusionModelUNet(
        spatial_dims=3,
        in_channels=cin,
        out_channels=cout,
        channels=tuple(cfg["channels"]),
        attention_levels=tuple(cfg["attention_levels"]),
        num_res_blocks=tuple(per_level(cfg["num_res_blocks"])),
        num_head_channels=tuple(per_level(cfg["num_head_channels"])),
        norm_num_groups=cfg["norm_num_groups"],
    )


def build(cfg):
    """The model of a worker RunConfig (spec::RunConfig as JSON)."""
    m, cin, cout = cfg["model"], cfg["input"]["channels"], cfg["out_channels"]
    spatial, ckpt = cfg["input"]["spatial"], cfg["grad_ckpt"]
    family = m["family"]
    if family == "unet":
        return unet(m, cin, cout)
    if family == "dit":
        return Dit(m, cin, cout, spatial, ckpt)
    if family == "hdit":
        return Hdit(m, cin, cout, spatial, ckpt)
    if family == "uvit":
        return Uvit(m, cin, spatial, ckpt)
    raise ValueError(f"unknown family {family}")
