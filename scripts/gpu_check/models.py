"""The PyTorch reference models: the group's DiT, HDiT and U-ViT as its code
defines them, written anew from the facts (docs/group-code.md in the team's
notes; each fact cites `path@commit:line` of `ModeS7/AIS4900_master`), and
MONAI's `DiffusionModelUNet` as the group's scripts build it.

What changes bytes, parameters or the saved-tensor list is kept exactly:

- DiT and HDiT attention normalise q and k (`LayerNorm(head_dim, eps=1e-6)`,
  affine) before SDPA (`src/medgen/models/dit_blocks.py@3140d97:116,135-137,
  152-154`); under bf16 autocast `layer_norm` runs in fp32, so a block keeps
  fp32 copies of q and k, their statistics and bf16 casts of the normed q, k;
  the SDPA output is laid out like the contiguous normed q, so the
  `transpose(1, 2).reshape` before `proj` copies it (`:157`).
- DiT's position table is an `nn.Parameter` (trainable, given to AdamW),
  sin-cos initialised (`src/medgen/models/dit.py@3140d97:109,143`); HDiT has
  one such table per level (`src/medgen/models/hdit.py@ff513e0`).
- MLPs use GELU with the tanh approximation (`dit_blocks.py@3140d97`, `Mlp`).
- U-ViT: pre-LN blocks, `LayerNorm(h, eps=1e-6)`, qkv without bias, no
  qk-norm, the long skip fused by `Linear(2h, h)` inside each out-block,
  a final `Conv3d(C, C, 3, padding=1)` (`src/medgen/models/uvit.py@ff513e0`).
- UNet with `grad_ckpt`: each `down_blocks[i]`, the `middle_block` and each
  `up_blocks[i]` recomputed in backward, nothing else, as the group's pixel
  scripts wrap them (`misc/profiling/profile_pixel_3d_unet.py@b8e04ab:32-48`).
- Transformers with `grad_ckpt`: every block under non-reentrant
  `torch.utils.checkpoint` (`hdit.py@ff513e0`, `_checkpoint_forward`).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

TIME_FREQ_DIM = 256

# (hidden, heads, depth) per family and variant: facts/src/model.rs `Variant::dims`.
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
    """Sinusoidal embedding [B, dim]: the cos half, then the sin half."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TimeMlp(nn.Module):
    """sinusoidal(256) -> Linear(256, h) -> SiLU -> Linear(h, h)."""

    def __init__(self, h):
        super().__init__()
        self.fc1 = nn.Linear(TIME_FREQ_DIM, h)
        self.fc2 = nn.Linear(h, h)

    def forward(self, t):
        return self.fc2(F.silu(self.fc1(timestep_embedding(t))))


class Attention(nn.Module):
    """Multi-head self-attention through SDPA, with the group's optional qk-norm."""

    def __init__(self, h, heads, qkv_bias, qk_norm):
        super().__init__()
        self.heads, self.head_dim = heads, h // heads
        self.qkv = nn.Linear(h, 3 * h, bias=qkv_bias)
        self.proj = nn.Linear(h, h)
        self.q_norm = nn.LayerNorm(self.head_dim, eps=1e-6) if qk_norm else None
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6) if qk_norm else None

    def forward(self, x):
        b, n, h = x.shape
        # [B, N, 3h] -> three views [B, heads, N, head_dim]
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if self.q_norm is not None:
            # fp32 under autocast: q, k become contiguous [B, heads, N, head_dim]
            q, k = self.q_norm(q), self.k_norm(k)
        out = F.scaled_dot_product_attention(q, k, v)
        # [B, heads, N, hd] -> [B, N, h]: a copy when `out` is laid out like a contiguous q
        return self.proj(out.transpose(1, 2).reshape(b, n, h))


class Mlp(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class DitBlock(nn.Module):
    """adaLN-Zero block with qk-norm: 18h^2 + 15h + 4 head_dim parameters."""

    def __init__(self, h, heads):
        super().__init__()
        self.attn = Attention(h, heads, qkv_bias=True, qk_norm=True)
        self.mlp = Mlp(h)
        self.ada_ln = nn.Linear(h, 6 * h)

    def forward(self, x, c):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.ada_ln(F.silu(c)).chunk(6, dim=1)
        hdim = x.shape[-1]
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(F.layer_norm(x, (hdim,), eps=1e-6), shift_msa, scale_msa))
        return x + gate_mlp.unsqueeze(1) * self.mlp(modulate(F.layer_norm(x, (hdim,), eps=1e-6), shift_mlp, scale_mlp))


class FinalLayer(nn.Module):
    def __init__(self, h, patch, out):
        super().__init__()
        self.ada_ln = nn.Linear(h, 2 * h)
        self.proj = nn.Linear(h, patch**3 * out)

    def forward(self, x, c):
        shift, scale = self.ada_ln(F.silu(c)).chunk(2, dim=1)
        return self.proj(modulate(F.layer_norm(x, (x.shape[-1],), eps=1e-6), shift, scale))


class PatchEmbed(nn.Module):
    """Conv3d(C, h, p, stride p), then [B, h, D', H', W'] -> tokens [B, N, h]."""

    def __init__(self, cin, h, p):
        super().__init__()
        self.proj = nn.Conv3d(cin, h, p, stride=p)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


def unpatchify(x, grid, p, c):
    """Tokens [B, N, p^3 c] (ordered pd, ph, pw, c) -> [B, c, D, H, W]."""
    b = x.shape[0]
    gd, gh, gw = grid
    x = x.reshape(b, gd, gh, gw, p, p, p, c).permute(0, 7, 1, 4, 2, 5, 3, 6)
    return x.reshape(b, c, gd * p, gh * p, gw * p)


def merge_tokens(x, grid):
    """2x2x2 neighbours regrouped: [B, N, h] -> [B, N/8, 8h] (a copy)."""
    b, _, h = x.shape
    gd, gh, gw = grid
    x = x.reshape(b, gd // 2, 2, gh // 2, 2, gw // 2, 2, h).permute(0, 1, 3, 5, 2, 4, 6, 7)
    return x.reshape(b, gd * gh * gw // 8, 8 * h)


def split_tokens(x, grid):
    """[B, N, 8h] at `grid` -> [B, 8N, h] at twice the grid (a copy)."""
    b, _, h8 = x.shape
    h = h8 // 8
    gd, gh, gw = grid
    x = x.reshape(b, gd, gh, gw, 2, 2, 2, h).permute(0, 1, 4, 2, 5, 3, 6, 7)
    return x.reshape(b, gd * gh * gw * 8, h)


def sincos_table(grid, h):
    """A 3D sin-cos position table [1, tokens, h] (the initial value of the trainable table)."""
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
    return table.float().unsqueeze(0)


def grid_of(spatial, p):
    d, h, w = spatial
    if d % p or h % p or w % p:
        raise ValueError(f"patch {p} does not divide the input {d}x{h}x{w}")
    return (d // p, h // p, w // p)


def run_block(block, ckpt, *args):
    return checkpoint(block, *args, use_reentrant=False) if ckpt else block(*args)


class Dit(nn.Module):
    def __init__(self, cfg, cin, cout, spatial, ckpt):
        super().__init__()
        h, heads, depth = dims("dit", cfg)
        p = cfg["patch"]
        self.grid, self.p, self.cout, self.ckpt = grid_of(spatial, p), p, cout, ckpt
        self.patch_embed = PatchEmbed(cin, h, p)
        self.pos = nn.Parameter(sincos_table(self.grid, h))  # trainable (dit.py@3140d97:109)
        self.time = TimeMlp(h)
        self.blocks = nn.ModuleList(DitBlock(h, heads) for _ in range(depth))
        self.final_layer = FinalLayer(h, p, cout)

    def forward(self, x, t):
        x = self.patch_embed(x) + self.pos  # bf16 tokens + fp32 table: the stream is fp32
        c = self.time(t)
        for b in self.blocks:
            x = run_block(b, self.ckpt, x, c)
        return unpatchify(self.final_layer(x, c), self.grid, self.p, self.cout)


class Hdit(nn.Module):
    """Hourglass DiT: DiT blocks per level, 2x2x2 merges down, splits up, skips fused by Linear(2h, h)."""

    def __init__(self, cfg, cin, cout, spatial, ckpt):
        super().__init__()
        h, heads, _ = dims("hdit", cfg)
        p, depths = cfg["patch"], cfg["level_depths"]
        if len(depths) % 2 == 0:
            raise ValueError("level_depths must have odd length")
        down = len(depths) // 2
        grids = [grid_of(spatial, p)]
        for _ in range(down):
            g = grids[-1]
            if any(s % 2 for s in g):
                raise ValueError(f"token grid {g} cannot be merged 2x2x2")
            grids.append(tuple(s // 2 for s in g))
        self.grids, self.p, self.cout, self.ckpt = grids, p, cout, ckpt

        def blocks(n):
            return nn.ModuleList(DitBlock(h, heads) for _ in range(n))

        self.patch_embed = PatchEmbed(cin, h, p)
        self.pos = nn.ParameterList(nn.Parameter(sincos_table(g, h)) for g in grids)
        self.time = TimeMlp(h)
        self.encoder = nn.ModuleList(blocks(n) for n in depths[:down])
        self.merge = nn.ModuleList(nn.Linear(8 * h, h) for _ in range(down))
        self.mid = blocks(depths[down])
        self.split = nn.ModuleList(nn.Linear(h, 8 * h) for _ in range(down))
        self.skip = nn.ModuleList(nn.Linear(2 * h, h) for _ in range(down))
        self.decoder = nn.ModuleList(blocks(n) for n in depths[down + 1 :])
        self.final_layer = FinalLayer(h, p, cout)

    def forward(self, x, t):
        x = self.patch_embed(x) + self.pos[0]
        c = self.time(t)
        skips = []
        for lvl, level in enumerate(self.encoder):
            for b in level:
                x = run_block(b, self.ckpt, x, c)
            skips.append(x)
            x = self.merge[lvl](merge_tokens(x, self.grids[lvl])) + self.pos[lvl + 1]
        for b in self.mid:
            x = run_block(b, self.ckpt, x, c)
        for i, level in enumerate(self.decoder):
            lvl = len(self.decoder) - 1 - i  # the grid this decoder level works at
            x = split_tokens(self.split[i](x), self.grids[lvl + 1])
            x = self.skip[i](torch.cat([x, skips[lvl]], dim=-1))  # bf16 from here
            for b in level:
                x = run_block(b, self.ckpt, x, c)
        return unpatchify(self.final_layer(x, c), self.grids[0], self.p, self.cout)


class UvitBlock(nn.Module):
    """Pre-LN block; an out-block first fuses its long skip with Linear(2h, h)."""

    def __init__(self, h, heads, skip=False):
        super().__init__()
        self.norm1 = nn.LayerNorm(h, eps=1e-6)
        self.attn = Attention(h, heads, qkv_bias=False, qk_norm=False)
        self.norm2 = nn.LayerNorm(h, eps=1e-6)
        self.mlp = Mlp(h)
        self.skip = nn.Linear(2 * h, h) if skip else None

    def forward(self, x, skip=None):
        if self.skip is not None:
            x = self.skip(torch.cat([x, skip], dim=-1))
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Uvit(nn.Module):
    """U-ViT: time as a token, long skips between the halves; output channels = input channels."""

    def __init__(self, cfg, cin, spatial, ckpt):
        super().__init__()
        h, heads, depth = dims("uvit", cfg)
        p = cfg["patch"]
        self.grid, self.p, self.cin, self.ckpt = grid_of(spatial, p), p, cin, ckpt
        tokens = self.grid[0] * self.grid[1] * self.grid[2]
        half = depth // 2
        self.patch_embed = PatchEmbed(cin, h, p)
        self.time = TimeMlp(h)
        self.pos = nn.Parameter(torch.zeros(1, 1 + tokens, h))
        self.in_blocks = nn.ModuleList(UvitBlock(h, heads) for _ in range(half))
        self.mid = UvitBlock(h, heads)
        self.out_blocks = nn.ModuleList(UvitBlock(h, heads, skip=True) for _ in range(half))
        self.norm = nn.LayerNorm(h, eps=1e-6)
        self.pred = nn.Linear(h, p**3 * cin)
        self.final_conv = nn.Conv3d(cin, cin, 3, padding=1)

    def forward(self, x, t):
        tokens = self.patch_embed(x)
        x = torch.cat([self.time(t).unsqueeze(1), tokens], dim=1) + self.pos
        skips = []
        for b in self.in_blocks:
            x = run_block(b, self.ckpt, x)
            skips.append(x)
        x = run_block(self.mid, self.ckpt, x)
        for b in self.out_blocks:
            x = run_block(b, self.ckpt, x, skips.pop())
        x = self.pred(self.norm(x))[:, 1:]
        return self.final_conv(unpatchify(x, self.grid, self.p, self.cin))


def checkpoint_level_blocks(unet):
    """Each down block, the middle block and each up block recomputed in backward."""

    def wrap(block):
        inner = block.forward

        def forward(*args, **kwargs):
            return checkpoint(inner, *args, use_reentrant=False, **kwargs)

        block.forward = forward

    for b in unet.down_blocks:
        wrap(b)
    wrap(unet.middle_block)
    for b in unet.up_blocks:
        wrap(b)


def unet(cfg, cin, cout, ckpt):
    """MONAI's DiffusionModelUNet (spatial_dims=3) as the group's scripts build it."""
    try:
        from monai.networks.nets import DiffusionModelUNet
    except ImportError:  # MONAI before 1.4 kept it in `generative`
        from generative.networks.nets import DiffusionModelUNet
    levels = len(cfg["channels"])
    per_level = lambda v: list(v) if isinstance(v, list) else [v] * levels  # noqa: E731
    model = DiffusionModelUNet(
        spatial_dims=3,
        in_channels=cin,
        out_channels=cout,
        channels=tuple(cfg["channels"]),
        attention_levels=tuple(cfg["attention_levels"]),
        num_res_blocks=tuple(per_level(cfg["num_res_blocks"])),
        num_head_channels=tuple(per_level(cfg["num_head_channels"])),
        norm_num_groups=cfg["norm_num_groups"],
    )
    if ckpt:
        checkpoint_level_blocks(model)
    return model


def build(cfg):
    """The model of a worker RunConfig (facts::RunConfig as JSON)."""
    m, cin, cout = cfg["model"], cfg["input"]["channels"], cfg["out_channels"]
    spatial, ckpt = cfg["input"]["spatial"], cfg["grad_ckpt"]
    family = m["family"]
    if family == "unet":
        return unet(m, cin, cout, ckpt)
    if family == "dit":
        return Dit(m, cin, cout, spatial, ckpt)
    if family == "hdit":
        return Hdit(m, cin, cout, spatial, ckpt)
    if family == "uvit":
        return Uvit(m, cin, spatial, ckpt)
    raise ValueError(f"unknown family {family}")
