"""Published torchvision / timm checkpoints by name -> (model, params, eval preprocessing).

  model, params, info = zoo.from_pretrained("torchvision/resnet50.IMAGENET1K_V1", "/ckpt/r50.pth")
  logits, out = model.apply({"params": params}, images_nhwc)   # out["pre_logits"]: [B, D]

Names are "torchvision/<model>[.<weights enum>]" and "timm/<model>[.<tag>]", as the libraries
spell them, and "<source>/<model>[.<tag>]" for official releases outside both libraries (MAE's
fine-tuned ViTs "mae/vit_base_patch16.finetuned_in1k", DINOv3's "dinov3/dinov3_vitb16.lvd1689m").
Without a tag the name means the source's default: torchvision's `DEFAULT` weights of that
model, timm's default pretrained tag (the first it lists for the model), the official release;
all are recorded below (`TORCHVISION_DEFAULTS`, `TIMM_DEFAULTS`, `MAE_DEFAULTS`,
`DINOV3_DEFAULTS`), so nothing imports torch or timm.
The names come from the `PRETRAINED` tables of the family modules (`FAMILIES`); `info` is that
table's entry plus `name`, `family` and `mean` / `std` (from its pp string): `pp` is the
fi_jax pp string of the source's eval transform, `input_size` the resolution the model is
evaluated (and initialised) at, `url` where the file is downloaded.
"""
from __future__ import annotations

import difflib
import importlib
import os
import re
from collections import defaultdict
from typing import Any

import jax
import jax.numpy as jnp

# Model files with a `PRETRAINED` table, in the order `names()` lists them.
FAMILIES = ("resnet", "resnetv2", "regnet", "convnext", "swin", "efficientnet", "vit",
            "convnextv2", "beit", "eva", "dinov3")

# torchvision: model -> the weights enum member `get_model_weights(model).DEFAULT` points to.
TORCHVISION_DEFAULTS: dict[str, str] = {
    "convnext_base": "IMAGENET1K_V1", "convnext_large": "IMAGENET1K_V1",
    "convnext_small": "IMAGENET1K_V1", "convnext_tiny": "IMAGENET1K_V1",
    "efficientnet_b0": "IMAGENET1K_V1", "efficientnet_b1": "IMAGENET1K_V2",
    "efficientnet_b2": "IMAGENET1K_V1", "efficientnet_b3": "IMAGENET1K_V1",
    "efficientnet_b4": "IMAGENET1K_V1", "efficientnet_b5": "IMAGENET1K_V1",
    "efficientnet_b6": "IMAGENET1K_V1", "efficientnet_b7": "IMAGENET1K_V1",
    "efficientnet_v2_s": "IMAGENET1K_V1", "efficientnet_v2_m": "IMAGENET1K_V1",
    "efficientnet_v2_l": "IMAGENET1K_V1",
    "regnet_x_400mf": "IMAGENET1K_V2", "regnet_x_800mf": "IMAGENET1K_V2",
    "regnet_x_1_6gf": "IMAGENET1K_V2", "regnet_x_3_2gf": "IMAGENET1K_V2",
    "regnet_x_8gf": "IMAGENET1K_V2", "regnet_x_16gf": "IMAGENET1K_V2",
    "regnet_x_32gf": "IMAGENET1K_V2",
    "regnet_y_400mf": "IMAGENET1K_V2", "regnet_y_800mf": "IMAGENET1K_V2",
    "regnet_y_1_6gf": "IMAGENET1K_V2", "regnet_y_3_2gf": "IMAGENET1K_V2",
    "regnet_y_8gf": "IMAGENET1K_V2", "regnet_y_16gf": "IMAGENET1K_V2",
    "regnet_y_32gf": "IMAGENET1K_V2", "regnet_y_128gf": "IMAGENET1K_SWAG_E2E_V1",
    "resnet18": "IMAGENET1K_V1", "resnet34": "IMAGENET1K_V1", "resnet50": "IMAGENET1K_V2",
    "resnet101": "IMAGENET1K_V2", "resnet152": "IMAGENET1K_V2",
    "resnext50_32x4d": "IMAGENET1K_V2", "resnext101_32x8d": "IMAGENET1K_V2",
    "resnext101_64x4d": "IMAGENET1K_V1",
    "wide_resnet50_2": "IMAGENET1K_V2", "wide_resnet101_2": "IMAGENET1K_V2",
    "swin_t": "IMAGENET1K_V1", "swin_s": "IMAGENET1K_V1", "swin_b": "IMAGENET1K_V1",
    "swin_v2_t": "IMAGENET1K_V1", "swin_v2_s": "IMAGENET1K_V1", "swin_v2_b": "IMAGENET1K_V1",
    "vit_b_16": "IMAGENET1K_V1", "vit_b_32": "IMAGENET1K_V1", "vit_l_16": "IMAGENET1K_V1",
    "vit_l_32": "IMAGENET1K_V1", "vit_h_14": "IMAGENET1K_SWAG_E2E_V1",
}

# timm: model -> its default pretrained tag (`timm.models.get_pretrained_cfg(model).tag`).
TIMM_DEFAULTS: dict[str, str] = {
    "deit3_base_patch16_224": "fb_in1k", "deit3_base_patch16_384": "fb_in1k",
    "deit3_large_patch16_224": "fb_in1k", "deit3_small_patch16_224": "fb_in1k",
    "deit_base_patch16_224": "fb_in1k", "deit_base_patch16_384": "fb_in1k",
    "deit_small_patch16_224": "fb_in1k", "deit_tiny_patch16_224": "fb_in1k",
    "vit_base_patch14_reg4_dinov2": "lvd142m", "vit_base_patch16_224": "augreg2_in21k_ft_in1k",
    "vit_base_patch16_384": "augreg_in21k_ft_in1k", "vit_base_patch16_clip_224": "laion2b_ft_in12k_in1k",
    "vit_base_patch16_clip_384": "laion2b_ft_in12k_in1k", "vit_base_patch32_clip_224": "laion2b_ft_in12k_in1k",
    "vit_large_patch14_clip_224": "laion2b_ft_in12k_in1k", "vit_large_patch16_224": "augreg_in21k_ft_in1k",
    "vit_small_patch14_reg4_dinov2": "lvd142m", "vit_small_patch16_224": "augreg_in21k_ft_in1k",
    "convnext_tiny": "in12k_ft_in1k", "convnext_small": "in12k_ft_in1k",
    "convnext_base": "fb_in22k_ft_in1k", "convnext_large": "fb_in22k_ft_in1k",
    "efficientnet_b0": "ra_in1k", "efficientnet_b1": "ra4_e3600_r240_in1k",
    "efficientnet_b2": "ra_in1k", "efficientnet_b3": "ra2_in1k", "efficientnet_b4": "ra2_in1k",
    "efficientnet_b5": "sw_in12k_ft_in1k", "efficientnetv2_rw_t": "ra2_in1k",
    "efficientnetv2_rw_s": "ra2_in1k", "efficientnetv2_rw_m": "agc_in1k",
    **{f"tf_efficientnet_b{i}": "ns_jft_in1k" for i in range(8)},
    **{f"tf_efficientnetv2_{s}": "in21k_ft_in1k" for s in "sml"},
    "resnet18": "a1_in1k", "resnet34": "a1_in1k", "resnet26": "bt_in1k", "resnet50": "a1_in1k",
    "resnet101": "a1h_in1k", "resnet152": "a1h_in1k",
    "resnet18d": "ra2_in1k", "resnet34d": "ra2_in1k", "resnet26d": "bt_in1k",
    "resnet50d": "ra2_in1k", "resnet101d": "ra2_in1k", "resnet152d": "ra2_in1k",
    "resnet200d": "ra2_in1k", "resnet50c": "gluon_in1k", "resnet50s": "gluon_in1k",
    "resnext50_32x4d": "a1h_in1k", "resnext50d_32x4d": "bt_in1k",
    "resnext101_32x8d": "tv_in1k", "resnext101_64x4d": "c1_in1k",
    "wide_resnet50_2": "racm_in1k",
    "resnetv2_50x1_bit": "goog_distilled_in1k", "resnetv2_50x3_bit": "goog_in21k_ft_in1k",
    "resnetv2_101x1_bit": "goog_in21k_ft_in1k", "resnetv2_101x3_bit": "goog_in21k_ft_in1k",
    "resnetv2_152x2_bit": "goog_teacher_in21k_ft_in1k",
    "resnetv2_152x4_bit": "goog_in21k_ft_in1k",
    "swin_tiny_patch4_window7_224": "ms_in1k",
    "swin_small_patch4_window7_224": "ms_in22k_ft_in1k",
    "swin_base_patch4_window7_224": "ms_in22k_ft_in1k",
    "swin_base_patch4_window12_384": "ms_in22k_ft_in1k",
    "swin_large_patch4_window7_224": "ms_in22k_ft_in1k",
    "swin_large_patch4_window12_384": "ms_in22k_ft_in1k",
    **{f"swinv2_{s}_window{w}_256": "ms_in1k" for s in ("tiny", "small", "base")
       for w in (8, 16)},
    "swinv2_base_window12_192": "ms_in22k", "swinv2_large_window12_192": "ms_in22k",
    "swinv2_base_window12to16_192to256": "ms_in22k_ft_in1k",
    "swinv2_base_window12to24_192to384": "ms_in22k_ft_in1k",
    "swinv2_large_window12to16_192to256": "ms_in22k_ft_in1k",
    "swinv2_large_window12to24_192to384": "ms_in22k_ft_in1k",
}
# ConvNeXt V2 (fi_jax.models.convnextv2)
TIMM_DEFAULTS.update({
    **{f"convnextv2_{s}": "fcmae_ft_in1k" for s in ("atto", "femto", "pico")},
    **{f"convnextv2_{s}": "fcmae_ft_in22k_in1k" for s in ("nano", "tiny", "base", "large")},
    "convnextv2_huge": "fcmae_ft_in22k_in1k_384",
})
# BEiT / BEiT v2 (fi_jax.models.beit)
TIMM_DEFAULTS.update({
    **{f"beit_{s}_patch16_224": "in22k_ft_in22k_in1k" for s in ("base", "large")},
    **{f"beit_{s}_patch16_{r}": "in22k_ft_in22k_in1k"
       for s, r in (("base", 384), ("large", 384), ("large", 512))},
    **{f"beitv2_{s}_patch16_224": "in1k_ft_in22k_in1k" for s in ("base", "large")},
})
# EVA-02 (fi_jax.models.eva)
TIMM_DEFAULTS.update({
    "eva02_tiny_patch14_336": "mim_in22k_ft_in1k", "eva02_small_patch14_336": "mim_in22k_ft_in1k",
    "eva02_base_patch14_448": "mim_in22k_ft_in22k_in1k",
    "eva02_large_patch14_448": "mim_in22k_ft_in22k_in1k",
})
# DINOv3 ViT (fi_jax.models.dinov3): timm's tags; the official files are "dinov3/<hub name>".
TIMM_DEFAULTS.update({
    **{f"vit_{s}_patch16_dinov3": "lvd1689m"
       for s in ("small", "small_plus", "base", "large", "huge_plus")},
    **{f"vit_{s}_patch16_dinov3_qkvb": "lvd1689m"
       for s in ("small", "small_plus", "base", "large", "huge_plus")},
})
DINOV3_DEFAULTS: dict[str, str] = {
    m: "lvd1689m" for m in ("dinov3_vits16", "dinov3_vits16plus", "dinov3_vitb16",
                            "dinov3_vitl16", "dinov3_vith16plus")}

# MAE's official fine-tuned files (fi_jax.models.vit, `mae_*` variants): "mae/<model>.<tag>".
MAE_DEFAULTS: dict[str, str] = {
    m: "finetuned_in1k" for m in ("vit_base_patch16", "vit_large_patch16", "vit_huge_patch14")}

_DEFAULTS = {"torchvision": TORCHVISION_DEFAULTS, "timm": TIMM_DEFAULTS, "mae": MAE_DEFAULTS,
             "dinov3": DINOV3_DEFAULTS}
_TABLE: dict[str, dict] | None = None


def family_module(family: str):
  """`fi_jax.models.<family>`."""
  return importlib.import_module(f"fi_jax.models.{family}")


def table() -> dict[str, dict]:
  """{full name: entry (with `family`)} over every family's PRETRAINED table (a family
  without one yet contributes nothing)."""
  global _TABLE
  if _TABLE is None:
    out = {}
    for family in FAMILIES:
      for name, entry in getattr(family_module(family), "PRETRAINED", {}).items():
        out[name] = {**entry, "family": family}
    _TABLE = out
  return _TABLE


def names() -> list[str]:
  """Every full name `from_pretrained` takes ("torchvision/resnet50.IMAGENET1K_V1", ...); the
  tag-less forms ("torchvision/resnet50") mean the defaults recorded in this module."""
  return list(table())


def canonical_name(name: str) -> str:
  """"torchvision/resnet50" -> "torchvision/resnet50.IMAGENET1K_V2" (the default weights);
  a name with a tag is returned as is. Raises ValueError with close matches if unknown."""
  source, slash, rest = name.partition("/")
  if not slash or source not in _DEFAULTS or not rest:
    raise ValueError(f"Checkpoint name {name!r} must be 'torchvision/<model>[.<weights>]', "
                     f"'timm/<model>[.<tag>]' or '<official source>/<model>[.<tag>]' "
                     f"({sorted(set(_DEFAULTS) - {'torchvision', 'timm'})}){_close(name)}")
  full = name
  if "." not in rest:
    if rest not in _DEFAULTS[source]:
      raise ValueError(f"Unknown {source} model {rest!r} (no default weights recorded in "
                       f"fi_jax.models.zoo){_close(name)}")
    full = f"{source}/{rest}.{_DEFAULTS[source][rest]}"
  if full not in table():
    what = f"{name!r} (default of {rest!r}: {full!r})" if full != name else repr(name)
    raise ValueError(f"Unknown checkpoint {what}{_close(full)}")
  return full


def _close(name: str) -> str:
  all_names = names()
  close = difflib.get_close_matches(name, all_names, n=8, cutoff=0.6)
  model = name.split("/")[-1].split(".")[0]
  close += [n for n in all_names if n.split("/")[1].split(".")[0] == model and n not in close]
  hint = " `python -c \"from fi_jax.models import zoo; print(zoo.names())\"` lists every name."
  return (f"; close matches: {close[:12]}." if close else ".") + hint


def _mean_std(pp: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
  m = re.search(r"normalize\(\(([^)]*)\), \(([^)]*)\)\)", pp)
  if not m:
    raise ValueError(f"No normalize(mean, std) in the pp string {pp!r}.")
  return tuple(float(v) for v in m[1].split(",")), tuple(float(v) for v in m[2].split(","))


def resolve(name: str) -> dict[str, Any]:
  """The `info` of a checkpoint name (no file needed): the PRETRAINED entry plus `name` (the
  full name), `family`, `route`, `mean` and `std` (those of its pp's normalize) and `model`
  (the Model kwargs: num_classes, variant).

  `route` is "flax" for the native ports (they keep priority) and "torchax" for any other
  timm / torchvision ImageNet-1k classifier, which runs through torchax
  (`fi_jax.models.torchax_classifier`; needs the `torch` extra or that route's cache)."""
  try:
    full = canonical_name(name)
  except ValueError as native:
    return _resolve_torchax(name, native)
  info = dict(table()[full], name=full, route="flax")
  info["mean"], info["std"] = _mean_std(info["pp"])
  info["model"] = dict(num_classes=info["num_classes"], variant=info["variant"])
  return info


def _resolve_torchax(name: str, native: ValueError) -> dict[str, Any]:
  """`resolve` of a name without a native port, through the torchax route."""
  from fi_jax.models import torchax_classifier  # torch-side, and only for such names
  try:
    entry = torchax_classifier.resolve(name)
  except ImportError as e:
    raise ValueError(f"{native} Models without a native port run through torchax: {e}") from None
  except ValueError as e:
    raise ValueError(f"{native} (Nor does the torchax route take it: {e})") from None
  info = dict(entry, name=entry["variant"])
  info["mean"], info["std"] = _mean_std(info["pp"])
  info["model"] = dict(num_classes=info["num_classes"], variant=info["variant"])
  return info


def init_shape(info: dict[str, Any]) -> tuple[int, int, int, int]:
  """(1, H, W, 3) of the entry's `input_size` (an int or (H, W))."""
  size = info["input_size"]
  h, w = (size, size) if isinstance(size, int) else size
  return (1, int(h), int(w), 3)


def from_pretrained(name: str, ckpt: str, **overrides) -> tuple[Any, dict, dict[str, Any]]:
  """(model, params, info) of a published checkpoint `name` read from the local file `ckpt`
  (.pth weights-only, .bin or .safetensors). `overrides` go to the family's `Model` (e.g.
  dtype="bfloat16", or smaller widths for a stand-in file). The model is initialised at
  info["input_size"] as shapes only: every value comes from the checkpoint."""
  info = resolve(name)
  if not os.path.exists(ckpt):
    raise FileNotFoundError(f"Checkpoint file {ckpt!r} of {info['name']} not found; download "
                            f"it from {info['url']}.")
  mod = family_module(info["family"])
  model_kw = {**info["model"], **overrides}
  model = mod.Model(**model_kw)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                          jnp.zeros(init_shape(info), jnp.float32))["params"]
  params = mod.load(shapes, ckpt, model_kw)
  return model, params, {**info, "model": model_kw}


def names_markdown() -> str:
  """The supported names as a markdown list, one line per model (tags in table order, the
  default in bold): the listing in docs/models.md ("Published checkpoints")."""
  groups: dict = defaultdict(lambda: defaultdict(list))
  for name, e in table().items():
    source, rest = name.split("/", 1)
    model, tag = rest.split(".", 1)
    groups[(e["family"], source)][model].append(tag)
  lines = []
  for (family, source), models in groups.items():
    lines.append(f"- `{family}` ({source}):")
    for model, tags in models.items():
      default = _DEFAULTS[source].get(model)
      tags = [f"**{t}**" if t == default else t for t in tags]
      lines.append(f"  - `{model}`: {', '.join(tags)}")
  return "\n".join(lines) + "\n"
