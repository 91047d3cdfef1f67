"""DINOv2 ViT backbones (with or without registers) and their linear ImageNet heads, in Flax.

`Model(num_classes=1000, variant="B/14", num_registers=0, head_layers=4)` builds big_vision's
ViT blocks (`vit.Encoder` with LayerScale, exact GELU — SwiGLU for giant — and LayerNorm eps
1e-6) with DINOv2's token layout: [cls; patches] + posemb (the cls token has its own posemb
slot), then the register tokens after cls (no posemb), blocks, final norm.
`apply({'params': p}, images)` returns `(logits, out)`:
  out["pre_logits"]  the linear head's input: head_layers=4 -> concat(cls of the last 4 blocks
                     after the final norm, mean of the last block's patch tokens) = 5*D;
                     head_layers=1 -> concat(cls, mean patch token) = 2*D; 0 -> cls token (D).
  out["cls"], out["patch_tokens"], out["register_tokens"], out["encoded"] (normed tokens).

Position embeddings keep the checkpoint's grid (37 = 518/14; `posemb_grid` only sets it for a
random init) and are interpolated to the input's patch grid per call with PyTorch's bicubic
(numerically, see posemb.bicubic_matrix), as DINOv2 does: models without registers use
`interpolate_offset=0.1` (F.interpolate with scale_factor (g + 0.1) / 37) and no antialias;
register models use the exact size with antialias. timm's DINOv2 port instead always resizes
to the exact size with antialias: set
`interpolate_offset=0.0, interpolate_antialias=True` to match timm features.

`load` reads the official state dicts (`dinov2_vit{s,b,l,g}14[_reg4]_pretrain.pth`) or timm's
DINOv2 weights (safetensors or .pth), plus the linear heads (`..._linear_head.pth`,
`..._linear4_head.pth`): `load(init, backbone_file, cfg, head=head_file)` (in a config:
`model_init` = the backbone, `model_load.head` = the head), a dict {"backbone": .., "head": ..},
or one file holding both (keys `backbone.*` and `linear_head.*`); the key map is
`convert/dinov2.py`, files and the eval pp string are in `releases` (DINOV2_*).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

import flax.linen as nn
import jax
import jax.numpy as jnp

from fi_jax.models import _posemb as posemb
from fi_jax.models import _releases as releases
from fi_jax.models import vit
from fi_jax.models._checkpoints import CheckpointError
from fi_jax.models.convert import dinov2 as convert
from fi_jax.models.convert import torch_layers as tl

# name: (width, depth, mlp_dim, num_heads, ffn activation). DINOv2's "giant2" uses SwiGLU
# with hidden 4096: one fused w12 projection to 2 * 4096 (mlp_dim) and w3 back.
_VARIANTS = {
    "S": (384, 12, 1536, 6, "gelu_exact"),
    "B": (768, 12, 3072, 12, "gelu_exact"),
    "L": (1024, 24, 4096, 16, "gelu_exact"),
    "g": (1536, 40, 8192, 24, "swiglu"),
}

def decode_variant(variant: Optional[str]) -> dict:
  """'B/14' -> dict(width, depth, mlp_dim, num_heads, act, patch_size)."""
  if variant is None:
    return {}
  name, _, patch = variant.partition("/")
  if name not in _VARIANTS:
    raise ValueError(f"Unknown DINOv2 variant {variant!r}; known: "
                     f"{[v + '/14' for v in _VARIANTS]}.")
  width, depth, mlp_dim, heads, act = _VARIANTS[name]
  return dict(width=width, depth=depth, mlp_dim=mlp_dim, num_heads=heads, act=act,
              patch_size=int(patch or 14))


class _Model(nn.Module):
  """DINOv2 ViT + optional linear head on the DINOv2 linear-probe features."""
  num_classes: Optional[int] = None
  patch_size: int = 14
  width: int = 768
  depth: int = 12
  mlp_dim: Optional[int] = None
  num_heads: int = 12
  act: str = "gelu_exact"
  num_registers: int = 0
  posemb_grid: int = 37
  interpolate_offset: Optional[float] = None      # None: 0.1 without registers, 0.0 with
  interpolate_antialias: Optional[bool] = None    # None: False without registers, True with
  head_layers: int = 4
  ln_eps: float = 1e-6
  layerscale: float = 1.0
  scan: bool = False
  dtype_mm: str = "float32"

  def _interp(self) -> tuple[float, bool]:
    reg = self.num_registers > 0
    offset = self.interpolate_offset if self.interpolate_offset is not None else (
        0.0 if reg else 0.1)
    aa = self.interpolate_antialias if self.interpolate_antialias is not None else reg
    return offset, aa

  @nn.compact
  def __call__(self, image, *, train=False):
    del train  # inference only (no dropout / drop-path)
    if self.head_layers not in (0, 1, 4):
      raise ValueError(f"head_layers must be 0, 1 or 4 (DINOv2 linear heads), got "
                       f"{self.head_layers}.")
    if self.head_layers > self.depth:
      raise ValueError(f"head_layers={self.head_layers} needs at least that many blocks "
                       f"(depth={self.depth}).")
    out = {}
    p = self.patch_size
    x = out["stem"] = nn.Conv(self.width, (p, p), strides=(p, p), padding="VALID",
                              dtype=self.dtype_mm, name="embedding")(
                                  jnp.asarray(image, self.dtype_mm))
    n, h, w, c = x.shape
    x = jnp.reshape(x, (n, h * w, c))
    cls = self.param("cls", nn.initializers.normal(1e-6), (1, 1, c), jnp.float32)
    x = jnp.concatenate([jnp.tile(cls.astype(x.dtype), (n, 1, 1)), x], axis=1)
    pos = posemb.posemb_param(self, (1, 1 + self.posemb_grid ** 2, c), 0.02)
    offset, aa = self._interp()
    x = x + posemb.resize_posemb(pos, (h, w), antialias=aa, offset=offset).astype(x.dtype)
    if self.num_registers:
      reg = self.param("registers", nn.initializers.normal(1e-6), (1, self.num_registers, c),
                       jnp.float32)
      x = jnp.concatenate([x[:, :1], jnp.tile(reg.astype(x.dtype), (n, 1, 1)), x[:, 1:]], axis=1)
    out["with_posemb"] = x

    x, out["encoder"] = vit.Encoder(
        depth=self.depth, mlp_dim=self.mlp_dim, num_heads=self.num_heads, act=self.act,
        ln_eps=self.ln_eps, layerscale=self.layerscale, scan=self.scan, final_norm=False,
        dtype_mm=self.dtype_mm, attention="heads_first", name="Transformer")(x)
    norm = nn.LayerNorm(epsilon=self.ln_eps, name="encoder_norm")
    x = out["encoded"] = norm(x)
    first = 1 + self.num_registers
    out["cls"] = x[:, 0]
    out["register_tokens"] = x[:, 1:first]
    out["patch_tokens"] = x[:, first:]
    mean_patch = jnp.mean(out["patch_tokens"], axis=1)
    if self.head_layers == 4:
      blocks = [out["encoder"][f"block{i:02d}"]["+mlp"] for i in range(self.depth - 4, self.depth)]
      feats = [norm(b[:, 0]) for b in blocks] + [mean_patch]
      x = jnp.concatenate(feats, axis=-1)
    elif self.head_layers == 1:
      x = jnp.concatenate([out["cls"], mean_patch], axis=-1)
    else:
      x = out["cls"]
    out["pre_logits"] = out["head_input"] = x
    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, name="head")(x)
    return x, out


def Model(num_classes: Optional[int] = None, *, variant: Optional[str] = None,
          **kw) -> _Model:
  """`Model(1000, variant="B/14", num_registers=4, head_layers=4)`."""
  return _Model(num_classes, **{**decode_variant(variant), **kw})


# ----------------------------------------------------------------------------- loading

def load(init_params, init_file: Union[str, Mapping[str, str]],
         model_cfg: Optional[Mapping[str, Any]] = None, dont_load: Sequence[str] = (),
         head: Optional[str] = None) -> dict:
  """Loads DINOv2 weights into `init_params`.

  `init_file`: a backbone file (official or timm; .pth/.pt/.bin or .safetensors), optionally
  holding the head too, or {"backbone": path, "head": path}; `head` (e.g. from the config's
  `model_load.head`) names the linear-head file. A model with a head (num_classes) needs head
  weights unless `dont_load` covers 'head/.*'. The posemb keeps the checkpoint's grid (37x37
  for the official files) whatever `posemb_grid` says; it is interpolated per call.
  """
  init_params = jax.device_get(init_params)
  files = dict(init_file) if isinstance(init_file, Mapping) else {"backbone": init_file}
  if head:
    files["head"] = head
  unknown = sorted(set(files) - {"backbone", "head"})
  if unknown or "backbone" not in files:
    raise ValueError(f"DINOv2 model_init dict needs 'backbone' (and optionally 'head'); got "
                     f"keys {sorted(files)}.")
  flat = convert.backbone(convert.read_combined(files["backbone"]),
                          tl.num_heads(init_params["Transformer"]))
  if files.get("head"):
    flat.update(convert.read_head(files["head"]))
  source = " + ".join(str(v) for v in files.values())
  hint = releases.DINOV2_DOWNLOAD_HINT
  if "head" in init_params and "head/kernel" in flat:
    want, got = init_params["head"]["kernel"].shape[0], flat["head/kernel"].shape[0]
    if want != got:
      raise CheckpointError(
          f"{source}: the linear head takes {got} features but the model builds {want} "
          f"(head_layers={(model_cfg or {}).get('head_layers', 4)}): a linear4_head needs "
          f"head_layers=4, a linear_head head_layers=1. {hint}.")
  return tl.merge_unrolled(init_params, flat, source, hint, dont_load, posemb="pos_embedding")
