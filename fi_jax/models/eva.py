"""timm's `Eva` in Flax: EVA-02, EVA-01 giant and the RoPE ViTs timm builds with it (NAVER's
RoPE-ViT, timm's SBB `vit_*_rope_reg*_gap_256`), loading timm's weights.

EVA-02 (`eva02_*`): patch conv, a class token in front and a learned absolute position
embedding covering it (`pos_embed`, (1, 1 + h*w, D)), then pre-LN blocks whose attention
applies **2-D rotary position embeddings** (RoPE) to the patch tokens' queries and keys (not
the class token's), with a query / value bias and no key bias; the MLP is **SwiGLU**
(`silu(gate) * x`): fused in one Dense for tiny / small (timm `GluMlp`, gate first), split into
`fc1_g` / `fc1_x` with a LayerNorm on the hidden width (**sub-LN**, timm `scale_mlp`) for
base / large, whose q / k / v are separate Denses. Pooling: mean over the patch tokens ->
`fc_norm` = `out["pre_logits"]` -> `head`; LayerNorm eps 1e-6. No layer scale.

The other configurations change only these switches (ARCHS): a GELU MLP (`mlp='gelu'`),
per-channel layer scale on both branches (`gamma_1`, `gamma_2`), register tokens after the
class token or instead of it (`num_reg`, `class_token`), the posemb covering the prefix tokens,
the patches only (timm `no_embed_class`) or absent, one qkv Dense with its own bias (timm
`AttentionRope`, `qkv_bias='qkv'`), no RoPE (EVA-01), class-token pooling after a final `norm`
(`pool='token'`), and the RoPE kind:
- 'cat' (timm `RotaryEmbeddingCat(in_pixels=False)`): head_dim / 4 frequencies
  1 / temperature^(i / (head_dim/4)); positions are the patch indices (row, column), for EVA
  rescaled by `ref_feat_shape / grid` (a 336 px fine-tune of a 224 px model sees the 16x16
  pre-training grid's coordinates); each angle is applied to an interleaved pair of channels
  (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin); bands [row | column] ('ij', EVA, SBB,
  temperature 10000) or [column | row] ('xy', NAVER, temperature 100, no rescaling).
- 'mixed' (RoPE-Mixed, NAVER; timm `RotaryEmbeddingMixed`): learned frequencies per block and
  head (`rope_freqs`, timm `rope.freqs`, (2, depth, heads, head_dim/2)); angle = column *
  f_x + row * f_y, interleaved pairs.
The RoPE tables follow the input's patch grid (no parameter but `rope_freqs`); the absolute
position embedding is a parameter of the initialised grid, and a file for another grid is
resampled on load as timm does (`convert/eva.py`). Facts from timm 1.0.31
(`timm/models/eva.py`, `timm/layers/pos_embed_sincos.py`, `timm/layers/attention.py`,
`timm/layers/mlp.py`, `timm/layers/pos_embed.py`).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.models import _blocks
from fi_jax.models import _pretrained as pretrained
from fi_jax.models.beit import attention, layer_norm
from fi_jax.models.convert import eva as convert
from fi_jax.models.convert import readers

HIGHEST = jax.lax.Precision.HIGHEST


def rope_sin_cos(h: int, w: int, head_dim: int, ref_feat_shape: Optional[Sequence[int]] = None,
                 temperature: float = 10_000., indexing: str = "ij",
                 ) -> tuple[np.ndarray, np.ndarray]:
  """(sin, cos), each (h*w, head_dim) float32, of EVA's axial RoPE in the interleaved layout:
  channels 2i, 2i+1 share the angle of band i, bands [row bands | column bands] ('ij') or
  [column bands | row bands] ('xy', NAVER's RoPE-ViT); tokens in row-major order."""
  nb = head_dim // 4
  bands = np.float32(1.0) / (np.float32(temperature) ** (np.arange(nb, dtype=np.float32) / nb))
  ty, tx = np.arange(h, dtype=np.float32), np.arange(w, dtype=np.float32)
  if ref_feat_shape is not None:
    ty, tx = ty / h * ref_feat_shape[0], tx / w * ref_feat_shape[1]
  y, x = np.meshgrid(ty, tx, indexing="ij")                           # (h, w) each
  grid = np.stack([y, x] if indexing == "ij" else [x, y], axis=-1)   # (h, w, 2)
  angle = (grid[..., None] * bands).reshape(h * w, 2 * nb)
  angle = np.repeat(angle, 2, axis=-1)
  return np.sin(angle).astype(np.float32), np.cos(angle).astype(np.float32)


def mixed_rope_sin_cos(freqs, h: int, w: int):
  """(sin, cos), each (depth, heads, h*w, head_dim), of RoPE-Mixed (NAVER's RoPE-ViT, timm
  `RotaryEmbeddingMixed`): learned frequencies `freqs` (2, depth, heads, head_dim/2) per block
  and head, angle = column * freqs[0] + row * freqs[1] in float32, interleaved pairs."""
  f = jnp.asarray(freqs, jnp.float32)
  col, row = (jnp.asarray(a.reshape(-1)) for a in np.meshgrid(
      np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32), indexing="xy"))
  angle = col[:, None] * f[0][..., None, :] + row[:, None] * f[1][..., None, :]
  angle = jnp.repeat(angle, 2, axis=-1)
  return jnp.sin(angle), jnp.cos(angle)


def apply_rope(x, sin, cos, half: bool = False):
  """Rotation of the last axis. Interleaved (EVA): pairs (x0, x1) -> (x0 cos - x1 sin,
  x1 cos + x0 sin); `half` (DINOv3): the halves [a | b] -> [a cos - b sin | b cos + a sin]."""
  if half:
    a, b = jnp.split(x, 2, axis=-1)
    rotated = jnp.concatenate([-b, a], axis=-1)
  else:
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    rotated = jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)
  return x * cos + rotated * sin


class Attention(nn.Module):
  """Fused or separate (`q_proj`, `k_proj` without bias, `v_proj`) projections. Fused biases
  (`qkv_bias`): 'qv' = `q_bias` + `v_bias` params, no key bias (timm `EvaAttention`); 'qkv' =
  the `qkv` Dense's own bias (timm `AttentionRope`); 'none'. RoPE (when `sin` is given) on the
  tokens after the `num_prefix` class / register tokens (`rope_half`: DINOv3's half layout),
  optional LayerNorm on the output (`norm`, timm `scale_attn_inner`), `proj`."""
  num_heads: int
  fused: bool = True
  inner_norm: bool = False
  num_prefix: int = 1
  qkv_bias: Any = "qv"
  rope_half: bool = False
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x, sin, cos):
    b, n, d = x.shape
    dense = lambda f, name, bias=True: nn.Dense(f, use_bias=bias, dtype=self.dtype,
                                                precision=self.precision, name=name)
    bias = {True: "qv", False: "none"}.get(self.qkv_bias, self.qkv_bias)
    if bias not in ("qv", "qkv", "none"):
      raise ValueError(f"Unknown EVA qkv_bias {self.qkv_bias!r}; use 'qv', 'qkv' or 'none'.")
    if self.fused:
      qkv = dense(3 * d, "qkv", bias=bias == "qkv")(x)
      if bias == "qv":
        q_bias = self.param("q_bias", nn.initializers.zeros, (d,), jnp.float32)
        v_bias = self.param("v_bias", nn.initializers.zeros, (d,), jnp.float32)
        qkv = qkv + jnp.concatenate([q_bias, jnp.zeros_like(q_bias), v_bias]).astype(qkv.dtype)
      q, k, v = jnp.split(qkv, 3, axis=-1)
    else:
      q, k, v = dense(d, "q_proj")(x), dense(d, "k_proj", bias=False)(x), dense(d, "v_proj")(x)
    q, k, v = (jnp.swapaxes(t.reshape(b, n, self.num_heads, -1), 1, 2) for t in (q, k, v))
    if sin is not None:
      p = self.num_prefix
      rope = lambda t: apply_rope(t, sin, cos, self.rope_half).astype(t.dtype)
      q = jnp.concatenate([q[:, :, :p], rope(q[:, :, p:])], 2)
      k = jnp.concatenate([k[:, :, :p], rope(k[:, :, p:])], 2)
    y = jnp.swapaxes(attention(q, k, v, None, self.precision), 1, 2).reshape(b, n, d)
    if self.inner_norm:
      y = layer_norm("norm")(y).astype(self.dtype)
    return dense(d, "proj")(y)


class Mlp(nn.Module):
  """`glu` = SwiGLU with one `fc1` to [gate | x] (timm GluMlp, gate first), `swiglu` = SwiGLU
  with `fc1_g`, `fc1_x` (timm SwiGLU): silu(gate) * x; `gelu` = `fc1`, exact GELU (timm Mlp).
  Then an optional LayerNorm (`norm`, sub-LN) and `fc2`."""
  hidden: int
  kind: str = "glu"
  sub_norm: bool = False
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    kw = dict(dtype=self.dtype, precision=self.precision)
    if self.kind == "glu":
      gate, y = jnp.split(nn.Dense(2 * self.hidden, name="fc1", **kw)(x), 2, axis=-1)
      y = nn.silu(gate) * y
    elif self.kind == "swiglu":
      gate, y = nn.Dense(self.hidden, name="fc1_g", **kw)(x), nn.Dense(self.hidden, name="fc1_x",
                                                                       **kw)(x)
      y = nn.silu(gate) * y
    elif self.kind == "gelu":
      y = _blocks.gelu_exact(nn.Dense(self.hidden, name="fc1", **kw)(x))
    else:
      raise ValueError(f"Unknown EVA MLP kind {self.kind!r}; use 'glu', 'swiglu' or 'gelu'.")
    if self.sub_norm:
      y = layer_norm("norm")(y).astype(self.dtype)
    return nn.Dense(d, name="fc2", **kw)(y)


class Block(nn.Module):
  """Pre-LN block; `layer_scale`: per-channel `gamma_1` / `gamma_2` on both branches."""
  num_heads: int
  mlp_hidden: int
  fused_qkv: bool = True
  mlp: str = "glu"
  sub_norm: bool = False
  qkv_bias: str = "qv"
  num_prefix: int = 1
  layer_scale: bool = False
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x, sin, cos):
    kw = dict(dtype=self.dtype, precision=self.precision)
    d = x.shape[-1]
    scale = (lambda name, y: y * self.param(name, nn.initializers.ones, (d,),
                                            jnp.float32).astype(y.dtype)) \
        if self.layer_scale else (lambda name, y: y)
    y = layer_norm("norm1")(x).astype(self.dtype)
    x = x + scale("gamma_1", Attention(self.num_heads, self.fused_qkv, num_prefix=self.num_prefix,
                                       qkv_bias=self.qkv_bias, name="attn", **kw)(y, sin, cos))
    y = layer_norm("norm2")(x).astype(self.dtype)
    return x + scale("gamma_2", Mlp(self.mlp_hidden, self.mlp, self.sub_norm, name="mlp",
                                    **kw)(y))


class _Model(nn.Module):
  """timm's `Eva`. Tokens: [class token (`class_token`)] [`num_reg` register tokens] patches.
  `pos_embed`: 'prefix' = a learned (1, prefix + h*w, D) embedding covering the class /
  register tokens too, 'patch' = (1, h*w, D) on the patches only (timm `no_embed_class`), None.
  `rope`: 'cat' (axial: `rope_temperature`, `rope_indexing`, `ref_feat_shape`), 'mixed'
  (learned per-block, per-head frequencies `rope_freqs`), None. `pool`: 'avg' = mean of the
  patch tokens -> `fc_norm`; 'token' = final `norm` -> the class token."""
  num_classes: Optional[int] = 1000
  patch_size: int = 14
  width: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_hidden: int = 2048
  fused_qkv: bool = True
  qkv_bias: str = "qv"
  mlp: str = "glu"
  sub_norm: bool = False
  layer_scale: bool = False
  class_token: bool = True
  num_reg: int = 0
  pos_embed: Optional[str] = "prefix"
  rope: Optional[str] = "cat"
  rope_temperature: float = 10_000.
  rope_indexing: str = "ij"
  ref_feat_shape: Optional[Sequence[int]] = (16, 16)
  pool: str = "avg"
  dtype: str = "float32"
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, image, *, train: bool = False):
    del train
    dt = jnp.dtype(self.dtype)
    kw = dict(dtype=dt, precision=self.precision)
    p = self.patch_size
    x = nn.Conv(self.width, (p, p), strides=(p, p), padding="VALID", name="patch_embed",
                **kw)(jnp.asarray(image, dt))
    b, h, w, d = x.shape
    x = x.reshape(b, h * w, d)
    prefix = []
    if self.class_token:
      prefix.append(self.param("cls_token", nn.initializers.zeros, (1, 1, d), jnp.float32))
    if self.num_reg:
      prefix.append(self.param("reg_token", nn.initializers.zeros, (1, self.num_reg, d),
                               jnp.float32))
    npt = int(self.class_token) + self.num_reg
    if self.pos_embed not in ("prefix", "patch", None):
      raise ValueError(f"Unknown EVA pos_embed {self.pos_embed!r}; use 'prefix', 'patch' or None.")
    if self.pos_embed:
      n_pos = h * w + (npt if self.pos_embed == "prefix" else 0)
      pos = self.param("pos_embed", nn.initializers.normal(0.02), (1, n_pos, d), jnp.float32)
    if self.pos_embed == "patch":
      x = x + pos.astype(dt)
    x = jnp.concatenate([jnp.broadcast_to(t.astype(dt), (b, t.shape[1], d)) for t in prefix]
                        + [x], axis=1)
    if self.pos_embed == "prefix":
      x = x + pos.astype(dt)
    head_dim = d // self.num_heads
    if self.rope == "cat":
      sin, cos = (jnp.asarray(a, dt) for a in rope_sin_cos(
          h, w, head_dim, self.ref_feat_shape, self.rope_temperature, self.rope_indexing))
      tables = [(sin, cos)] * self.depth
    elif self.rope == "mixed":
      freqs = self.param("rope_freqs", nn.initializers.normal(0.1),
                         (2, self.depth, self.num_heads, head_dim // 2), jnp.float32)
      sin, cos = (a.astype(dt) for a in mixed_rope_sin_cos(freqs, h, w))
      tables = [(sin[i], cos[i]) for i in range(self.depth)]
    elif self.rope is None:
      tables = [(None, None)] * self.depth
    else:
      raise ValueError(f"Unknown EVA rope {self.rope!r}; use 'cat', 'mixed' or None.")
    for i in range(self.depth):
      x = Block(self.num_heads, self.mlp_hidden, self.fused_qkv, self.mlp, self.sub_norm,
                self.qkv_bias, npt, self.layer_scale, name=f"blocks_{i}", **kw)(x, *tables[i])
    out = {"encoded": x}
    if self.pool == "token" and not self.class_token:
      raise ValueError("EVA pool='token' needs the class token (class_token=True).")
    if self.pool == "avg":
      x = layer_norm("fc_norm")(jnp.mean(x[:, npt:].astype(jnp.float32), 1))
    elif self.pool == "token":
      x = layer_norm("norm")(x[:, 0].astype(jnp.float32))
    else:
      raise ValueError(f"Unknown EVA pool {self.pool!r}; use 'avg' or 'token'.")
    out["pre_logits"] = x
    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, name="head", **kw)(x.astype(dt)).astype(
          jnp.float32)
    return x, out


# timm's eva02_* model functions: mlp_ratio 4*2/3 (hidden int(D * 8/3)), RoPE reference grid
# 16x16 (224 / 14); tiny / small: fused qkv + GluMlp; base / large: separate q/k/v + SwiGLU
# with sub-LN.
_TS = dict(patch_size=14, fused_qkv=True, mlp="glu", sub_norm=False, ref_feat_shape=(16, 16))
_BL = dict(patch_size=14, fused_qkv=False, mlp="swiglu", sub_norm=True, ref_feat_shape=(16, 16))
_SIZES = {"tiny": dict(width=192, depth=12, num_heads=3, mlp_hidden=512, **_TS),
          "small": dict(width=384, depth=12, num_heads=6, mlp_hidden=1024, **_TS),
          "base": dict(width=768, depth=12, num_heads=12, mlp_hidden=2048, **_BL),
          "large": dict(width=1024, depth=24, num_heads=16, mlp_hidden=2730, **_BL)}
ARCHS: dict[str, dict] = {
    f"eva02_{s}_patch14_{r}": _SIZES[s] for s, r in (
        ("tiny", 224), ("small", 224), ("base", 224), ("large", 224), ("tiny", 336),
        ("small", 336), ("base", 448), ("large", 448))}


def _rope_vit_archs() -> dict[str, dict]:
  """NAVER's RoPE-ViT, timm's SBB RoPE ViTs and EVA-01 giant, as timm's model functions
  configure them.

  NAVER (`vit_*_patch16_rope*_224`, attn_type 'rope'): DeiT-III-like blocks (GELU MLP 4x,
  layer scale, one qkv Dense with bias), class-token pooling after the final norm; axial RoPE
  (temperature 100, 'xy' grid, no reference grid) or RoPE-Mixed (learned frequencies,
  initialised with temperature 10); `_ape`: plus an absolute posemb on the patches.
  SBB (`vit_*_patch16_rope_reg*_gap_256`): no class token, 1 or 4 register tokens, no absolute
  posemb, EVA RoPE with the 16x16 reference grid, GELU MLP 4x, layer scale, q / v biases (none
  for mediumd), mean of the patch tokens -> fc_norm.
  EVA-01 giant (`eva_giant_patch14_*`): class token + posemb, GELU MLP (6144), q / v biases,
  no RoPE, no layer scale, mean of the patch tokens -> fc_norm."""
  out = {}
  naver = dict(patch_size=16, mlp="gelu", qkv_bias="qkv", layer_scale=True, pool="token",
               rope_indexing="xy", ref_feat_shape=None)
  for size, (w, d, h) in {"small": (384, 12, 6), "base": (768, 12, 12),
                          "large": (1024, 24, 16)}.items():
    for kind, rope in (("rope", dict(rope="cat", rope_temperature=100.)),
                       ("rope_mixed", dict(rope="mixed", rope_temperature=10.))):
      for ape, pos in (("", None), ("_ape", "patch")):
        out[f"vit_{size}_patch16_{kind}{ape}_224"] = dict(
            width=w, depth=d, num_heads=h, mlp_hidden=4 * w, pos_embed=pos, **rope, **naver)
  sbb = dict(patch_size=16, mlp="gelu", layer_scale=True, class_token=False, pos_embed=None,
             ref_feat_shape=(16, 16))
  for name, (w, d, h, reg, bias) in {
      "medium": (512, 12, 8, 1, "qv"), "mediumd": (512, 20, 8, 1, "none"),
      "betwixt": (640, 12, 10, 4, "qv"), "base": (768, 12, 12, 1, "qv")}.items():
    out[f"vit_{name}_patch16_rope_reg{reg}_gap_256"] = dict(
        width=w, depth=d, num_heads=h, mlp_hidden=4 * w, num_reg=reg, qkv_bias=bias, **sbb)
  for res in (224, 336, 560):
    out[f"eva_giant_patch14_{res}"] = dict(patch_size=14, width=1408, depth=40, num_heads=16,
                                           mlp_hidden=6144, mlp="gelu", rope=None)
  return out


ARCHS.update(_rope_vit_archs())

_timm = pretrained.timm
# timm's ImageNet classifiers (the mim_* tags without a head are the MIM encoders: not listed);
# OpenAI CLIP mean / std, bicubic, crop_pct 1.0; the in22k-intermediate fine-tunes squash.
PRETRAINED: dict[str, dict] = {
    **_timm("eva02_tiny_patch14_336.mim_in22k_ft_in1k", 336, 1.0, norm="clip"),
    **_timm("eva02_small_patch14_336.mim_in22k_ft_in1k", 336, 1.0, norm="clip"),
    **_timm("eva02_base_patch14_448.mim_in22k_ft_in1k", 448, 1.0, norm="clip"),
    **_timm("eva02_base_patch14_448.mim_in22k_ft_in22k_in1k", 448, 1.0, norm="clip",
            crop_mode="squash"),
    **_timm("eva02_large_patch14_448.mim_in22k_ft_in1k", 448, 1.0, norm="clip"),
    **_timm("eva02_large_patch14_448.mim_m38m_ft_in1k", 448, 1.0, norm="clip"),
    **_timm("eva02_large_patch14_448.mim_in22k_ft_in22k_in1k", 448, 1.0, norm="clip",
            crop_mode="squash"),
    **_timm("eva02_large_patch14_448.mim_m38m_ft_in22k_in1k", 448, 1.0, norm="clip",
            crop_mode="squash"),
    **pretrained.timm_tags([a for a in ARCHS if not a.startswith("eva02_")]),
}


def Model(num_classes: Optional[int] = 1000, *, variant: str, **kw) -> _Model:
  """`Model(1000, variant="eva02_base_patch14_448")`; `kw` overrides ARCHS (width, depth,
  num_heads, mlp_hidden, patch_size, ref_feat_shape, dtype, ...)."""
  name = variant.split(".")[0]
  if name not in ARCHS:
    raise ValueError(f"Unknown Eva variant {variant!r} (EVA-02, EVA-01 giant, RoPE ViTs); "
                     f"known: {sorted(ARCHS)}.")
  kw.pop("source", None)
  return _Model(num_classes, **{**ARCHS[name], **kw})


def load(init_params, init_file: str, model_cfg: Optional[Mapping] = None) -> dict:
  """timm Eva weights (`model.safetensors` or a .pth state dict) onto `init_params`; a
  `pos_embed` of another patch grid is resampled to the model's (timm's rule)."""
  sd = readers.read_state_dict(init_file, hint=convert.HINT)
  return convert.convert(sd, init_params, file=init_file)
