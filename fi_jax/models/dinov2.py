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
(numerically, see clip.bicubic_matrix), as DINOv2 does: models without registers use
`interpolate_offset=0.1` (F.interpolate with scale_factor (g + 0.1) / 37) and no antialias;
register models use the exact size with antialias. timm's DINOv2 port instead always resizes
to the exact size with antialias: set
`interpolate_offset=0.0, interpolate_antialias=True` to match timm features.

`load` reads the official state dicts (`dinov2_vit{s,b,l,g}14[_reg4]_pretrain.pth`) or timm's
DINOv2 weights (safetensors or .pth), plus the linear heads (`..._linear_head.pth`,
`..._linear4_head.pth`): `load(init, backbone_file, cfg, head=head_file)` (in a config:
`model_init` = the backbone, `model_load.head` = the head), a dict {"backbone": .., "head": ..},
or one file holding both (keys `backbone.*` and `linear_head.*`).
Eval pp (DINOv2 transforms.py: Resize(256, bicubic) on PIL images, i.e. antialiased,
CenterCrop(224), ImageNet mean/std): `PP` below.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Sequence, Union

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from fi_jax.models import checkpoints
from fi_jax.models import clip as torch_port   # shared PyTorch -> Flax helpers
from fi_jax.models import vit

PP = "decode|resize_small(256, method='bicubic', antialias=True)|central_crop(224)|vgg_value_range"

# name: (width, depth, mlp_dim, num_heads, ffn activation). DINOv2's "giant2" uses SwiGLU
# with hidden 4096: one fused w12 projection to 2 * 4096 (mlp_dim) and w3 back.
_VARIANTS = {
    "S": (384, 12, 1536, 6, "gelu_exact"),
    "B": (768, 12, 3072, 12, "gelu_exact"),
    "L": (1024, 24, 4096, 16, "gelu_exact"),
    "g": (1536, 40, 8192, 24, "swiglu"),
}

_URL = "https://dl.fbaipublicfiles.com/dinov2/dinov2_vit{s}14/dinov2_vit{s}14{reg}_{what}.pth"
DOWNLOAD_HINT = ("DINOv2 weights: " + _URL.format(s="{s,b,l,g}", reg="[_reg4]", what="pretrain")
                 + " (backbones) and " + _URL.format(s="{s,b,l,g}", reg="[_reg4]",
                                                     what="linear4_head")
                 + " (heads; '_linear_head' for head_layers=1), or timm's vit_*_patch14_"
                 "[reg4_]dinov2.lvd142m model.safetensors")


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


def checkpoint_url(variant: str, registers: bool, what: str = "pretrain") -> str:
  """Official file for `variant` ('S/14'...), what = pretrain | linear_head | linear4_head."""
  return _URL.format(s=variant[0].lower(), reg="_reg4" if registers else "", what=what)


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
    pos = torch_port.posemb_param(self, (1, 1 + self.posemb_grid ** 2, c), 0.02)
    offset, aa = self._interp()
    x = x + torch_port.resize_posemb(pos, (h, w), antialias=aa, offset=offset).astype(x.dtype)
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
          **kw) -> _Model:  # pylint: disable=invalid-name
  """`Model(1000, variant="B/14", num_registers=4, head_layers=4)`."""
  return _Model(num_classes, **{**decode_variant(variant), **kw})


# ----------------------------------------------------------------------------- loading

DINOV2_BLOCK_NAMES = {"norm1": "LayerNorm_0", "norm2": "LayerNorm_1", "attn.qkv": "qkv",
                      "attn.proj": "out", "ls1": "LayerScale_0", "ls2": "LayerScale_1",
                      "mlp.fc1": "MlpBlock_0/Dense_0", "mlp.fc2": "MlpBlock_0/Dense_1",
                      "mlp.w12": "MlpBlock_0/Dense_0", "mlp.w3": "MlpBlock_0/Dense_1"}
_LN = {"weight": "scale", "bias": "bias"}
_IGNORED = {"mask_token"}


def _is_timm_registers(sd: Mapping[str, np.ndarray]) -> bool:
  """timm stores register models with `reg_token`, the cls posemb folded into `cls_token`
  and a patch-only `pos_embed` (no_embed_class)."""
  return "reg_token" in sd


def convert_backbone(sd: Mapping[str, np.ndarray], num_heads: int) -> dict[str, np.ndarray]:
  """Official or timm DINOv2 state dict -> flat {flax path: array} (unrolled blocks)."""
  sd = dict(sd)
  if _is_timm_registers(sd):
    pos = sd["pos_embed"]
    sd["pos_embed"] = np.concatenate([np.zeros_like(pos[:, :1]), pos], axis=1)
    sd["register_tokens"] = sd.pop("reg_token")
  flat = {}
  for key, v in sd.items():
    if key in _IGNORED:
      continue
    if m := re.fullmatch(r"blocks\.(\d+)\.(.+)", key):
      conv = torch_port.convert_block(m[2], v, num_heads, DINOV2_BLOCK_NAMES)
      if conv is None:
        raise checkpoints.CheckpointError(
            f"DINOv2 checkpoint tensor {key!r} (shape {v.shape}) does not fit the model: an "
            f"unknown block tensor, or a width that {num_heads} heads do not divide (wrong "
            f"variant?). {DOWNLOAD_HINT}.")
      flat.update({f"Transformer/encoderblock_{m[1]}/{k}": a for k, a in conv.items()})
    elif key in ("patch_embed.proj.weight", "patch_embed.proj.bias"):
      flat[f"embedding/{'kernel' if key.endswith('weight') else 'bias'}"] = (
          checkpoints.torch_conv(v)["kernel"] if key.endswith("weight") else v)
    elif key == "cls_token":
      flat["cls"] = v.reshape(1, 1, -1)
    elif key == "pos_embed":
      flat["pos_embedding"] = v.reshape(1, v.shape[-2], v.shape[-1])
    elif key == "register_tokens":
      flat["registers"] = v.reshape(1, -1, v.shape[-1])
    elif m := re.fullmatch(r"norm\.(weight|bias)", key):
      flat[f"encoder_norm/{_LN[m[1]]}"] = v
    elif m := re.fullmatch(r"(?:head|linear_head)\.(weight|bias)", key):
      flat.update(_convert_head({m[1]: v}))
    else:
      raise checkpoints.CheckpointError(
          f"Unexpected key {key!r} in the DINOv2 checkpoint. {DOWNLOAD_HINT}.")
  return flat


def _convert_head(sd: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  out = {}
  for k, v in sd.items():
    if k not in ("weight", "bias"):
      raise checkpoints.CheckpointError(
          f"Unexpected key {k!r} in a DINOv2 linear head file (expected weight, bias). "
          f"{DOWNLOAD_HINT}.")
    out[f"head/{'kernel' if k == 'weight' else 'bias'}"] = v.T if k == "weight" else v
  return out


def _strip(sd: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
  return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


def _read_combined(path: str) -> dict[str, np.ndarray]:
  """A backbone (+ head) file; a hub classifier's state dict has backbone.* / linear_head.*."""
  sd = torch_port.read_state_dict(path, hint=DOWNLOAD_HINT)
  if any(k.startswith("backbone.") for k in sd):
    rest = [k for k in sd if not k.startswith(("backbone.", "linear_head."))]
    if rest:
      raise checkpoints.CheckpointError(
          f"{path}: unexpected key {rest[0]!r} next to backbone.*/linear_head.*. {DOWNLOAD_HINT}.")
    return {**_strip(sd, "backbone."), **{f"head.{k}": v
                                          for k, v in _strip(sd, "linear_head.").items()}}
  return sd


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
  import jax  # pylint: disable=g-import-not-at-top
  init_params = jax.device_get(init_params)
  files = dict(init_file) if isinstance(init_file, Mapping) else {"backbone": init_file}
  if head:
    files["head"] = head
  unknown = sorted(set(files) - {"backbone", "head"})
  if unknown or "backbone" not in files:
    raise ValueError(f"DINOv2 model_init dict needs 'backbone' (and optionally 'head'); got "
                     f"keys {sorted(files)}.")
  sd = _read_combined(files["backbone"])
  heads = torch_port.heads_of(init_params["Transformer"])
  flat = convert_backbone(sd, heads)
  if files.get("head"):
    head_sd = torch_port.read_state_dict(files["head"], hint=DOWNLOAD_HINT)
    head_sd = _strip(head_sd, "linear_head.") or head_sd
    flat.update(_convert_head(head_sd))
  source = " + ".join(str(v) for v in files.values())
  if "head" in init_params and "head/kernel" in flat:
    want, got = init_params["head"]["kernel"].shape[0], flat["head/kernel"].shape[0]
    if want != got:
      raise checkpoints.CheckpointError(
          f"{source}: the linear head takes {got} features but the model builds {want} "
          f"(head_layers={(model_cfg or {}).get('head_layers', 4)}): a linear4_head needs "
          f"head_layers=4, a linear_head head_layers=1. {DOWNLOAD_HINT}.")
  return torch_port.merge_torch(init_params, flat, source, DOWNLOAD_HINT, dont_load,
                                posemb="pos_embedding")
