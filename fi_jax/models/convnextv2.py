"""ConvNeXt V2 in Flax, loading timm's `convnextv2_*` weights and the official files.

ConvNeXt V2 (Woo et al. 2023, arXiv 2301.00808) is ConvNeXt v1 (`fi_jax.models.convnext`) with
a Global Response Normalization layer after the MLP's GELU and without the per-block layer
scale: `Model(1000, variant="convnextv2_tiny")` builds `convnext._Model(grn=True,
layer_scale=False)`, so the module, its outputs (`out["pre_logits"]`: the LayerNorm'd pooled
feature, timm's `forward_head(x, pre_logits=True)`) and the key map
(`fi_jax.models.convert.convnext`) are shared with v1. Facts from timm 1.0.31
(`timm/models/convnext.py`, `timm/layers/grn.py`) and facebookresearch/ConvNeXt-V2
(`models/convnextv2.py`, `models/utils.py` GRN).

Files: timm's `model.safetensors` (stem.* / stages.*.blocks.* / mlp.grn.* / head.*; the small
models atto..nano keep their MLP as 1x1 convs, which load the same) and the official
`convnextv2_<size>_<data>_<res>_ema.pt` (`{"model": ...}` with downsample_layers.* /
stages.<i>.<j>.* / grn.gamma, grn.beta (1, 1, 1, C)), told apart by their keys.
"""
from __future__ import annotations

from typing import Mapping, Optional

from fi_jax.models import _pretrained as pretrained
from fi_jax.models import convnext

_V2 = dict(grn=True, layer_scale=False)
# variant: module keyword arguments (timm's convnextv2_* model functions).
ARCHS: dict[str, dict] = {
    "convnextv2_atto": dict(depths=(2, 2, 6, 2), dims=(40, 80, 160, 320), **_V2),
    "convnextv2_femto": dict(depths=(2, 2, 6, 2), dims=(48, 96, 192, 384), **_V2),
    "convnextv2_pico": dict(depths=(2, 2, 6, 2), dims=(64, 128, 256, 512), **_V2),
    "convnextv2_nano": dict(depths=(2, 2, 8, 2), dims=(80, 160, 320, 640), **_V2),
    "convnextv2_tiny": dict(depths=(3, 3, 9, 3), dims=(96, 192, 384, 768), **_V2),
    "convnextv2_base": dict(depths=(3, 3, 27, 3), dims=(128, 256, 512, 1024), **_V2),
    "convnextv2_large": dict(depths=(3, 3, 27, 3), dims=(192, 384, 768, 1536), **_V2),
    "convnextv2_huge": dict(depths=(3, 3, 27, 3), dims=(352, 704, 1408, 2816), **_V2),
}


def _pretrained() -> dict[str, dict]:
  # timm's ImageNet-1k classifiers (the fcmae_ft_* tags; the bare `fcmae` tags are the
  # headless self-supervised encoders): ImageNet mean/std, bicubic; crop_pct 0.875 at 224,
  # squash at 384 / 512 (timm's pretrained_cfg).
  table = {}
  for size in ("atto", "femto", "pico", "nano", "tiny", "base", "large", "huge"):
    table.update(pretrained.timm(f"convnextv2_{size}.fcmae_ft_in1k", 224, 0.875))
  for size in ("nano", "tiny", "base", "large"):
    table.update(pretrained.timm(f"convnextv2_{size}.fcmae_ft_in22k_in1k", 224, 0.875))
  for size, res in (("nano", 384), ("tiny", 384), ("base", 384), ("large", 384), ("huge", 384),
                    ("huge", 512)):
    table.update(pretrained.timm(f"convnextv2_{size}.fcmae_ft_in22k_in1k_{res}", res, 1.0,
                                 crop_mode="squash"))
  return table


PRETRAINED: dict[str, dict] = _pretrained()


def _arch(variant: str) -> dict:
  name = variant.split(".")[0]
  if name not in ARCHS:
    raise ValueError(f"Unknown ConvNeXt V2 variant {variant!r}; known: {sorted(ARCHS)}.")
  return ARCHS[name]


def Model(num_classes: Optional[int] = 1000, *, variant: str, **kw) -> convnext._Model:
  """`Model(1000, variant="convnextv2_tiny")`; `kw` overrides ARCHS (depths, dims, dtype...).
  A `source` key is accepted and ignored (every layout computes the same)."""
  kw.pop("source", None)
  return convnext._Model(num_classes, **{**_arch(variant), **kw})


def load(init_params, init_file: str, model_cfg: Optional[Mapping] = None) -> dict:
  """timm (stem.* / stages.*) or official (downsample_layers.*) ConvNeXt V2 weights from
  .safetensors / .pth / .pt onto `init_params` (arrays or ShapeDtypeStructs)."""
  return convnext.load(init_params, init_file, model_cfg)
