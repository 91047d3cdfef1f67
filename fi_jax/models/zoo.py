"""Published torchvision / timm checkpoints by name -> (model, params, eval preprocessing).

  model, params, info = zoo.from_pretrained("torchvision/resnet50.IMAGENET1K_V1", "/ckpt/r50.pth")
  logits, out = model.apply({"params": params}, images_nhwc)   # out["pre_logits"]: [B, D]

Names are "torchvision/<model>[.<weights enum>]" and "timm/<model>[.<tag>]", as the libraries
spell them, and "<source>/<model>[.<tag>]" for official releases outside both libraries (MAE's
fine-tuned ViTs "mae/vit_base_patch16.finetuned_in1k", DINOv3's "dinov3/dinov3_vitb16.lvd1689m").
Without a tag the name means the source's default: torchvision's `DEFAULT` weights of that
model (recorded below, `TORCHVISION_DEFAULTS`), timm's default pretrained tag (`TIMM_DEFAULTS`,
from the timm facts recorded in `_timm_tags`), the official release (`MAE_DEFAULTS`,
`DINOV3_DEFAULTS`); nothing imports torch or timm.

The names come from the `PRETRAINED` tables of the family modules (`FAMILIES`). A family
registers timm weights by architecture, not by tag: its table holds
`_pretrained.timm_tags(<the timm models its Model builds>)`, one entry per pretrained tag timm
lists for them (the tag changes the weights, class count and eval transform, not the module).
`python -m fi_jax.models list [--family F]` prints every name with its input size and
preprocessing; docs/models.md's table is `names_markdown()`. `info` is that
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

from fi_jax.data import preprocess
from fi_jax.models import _pretrained as pretrained
from fi_jax.models._checkpoints import CheckpointError

# Model files with a `PRETRAINED` table, in the order `names()` lists them.
FAMILIES = ("resnet", "resnetv2", "regnet", "convnext", "swin", "efficientnet", "vit",
            "convnextv2", "beit", "eva", "dinov3", "vgg", "densenet", "mlp_mixer", "cait",
            "xcit", "vit_timm", "byobnet")

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

DINOV3_DEFAULTS: dict[str, str] = {
    **{m: "lvd1689m" for m in ("dinov3_vits16", "dinov3_vits16plus", "dinov3_vitb16",
                               "dinov3_vitl16", "dinov3_vith16plus", "dinov3_vit7b16",
                               "dinov3_convnext_tiny", "dinov3_convnext_small",
                               "dinov3_convnext_base", "dinov3_convnext_large")},
    "dinov3_vit7b16_lc": "imagenet1k"}   # the 7B's ImageNet-1k linear classifier

# MAE's official fine-tuned files (fi_jax.models.vit, `mae_*` variants): "mae/<model>.<tag>".
MAE_DEFAULTS: dict[str, str] = {
    m: "finetuned_in1k" for m in ("vit_base_patch16", "vit_large_patch16", "vit_huge_patch14")}

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
    TIMM_DEFAULTS.clear()
    TIMM_DEFAULTS.update({m: t for m, t in pretrained.TIMM_DEFAULT_TAGS.items()
                          if f"timm/{m}.{t}" in out})
  return _TABLE


# timm: model -> its default pretrained tag (`timm.models.get_pretrained_cfg(model).tag`, as
# recorded in `_timm_tags.DEFAULT_TAGS`), for the models of the table; filled by `table()`.
TIMM_DEFAULTS: dict[str, str] = {}
_DEFAULTS = {"torchvision": TORCHVISION_DEFAULTS, "timm": TIMM_DEFAULTS, "mae": MAE_DEFAULTS,
             "dinov3": DINOV3_DEFAULTS}


def names() -> list[str]:
  """Every full name `from_pretrained` takes ("torchvision/resnet50.IMAGENET1K_V1", ...); the
  tag-less forms ("torchvision/resnet50") mean the defaults recorded in this module."""
  return list(table())


def canonical_name(name: str, close_matches: bool = True) -> str:
  """"torchvision/resnet50" -> "torchvision/resnet50.IMAGENET1K_V2" (the default weights);
  a name with a tag is returned as is. Raises ValueError, with close matches if unknown
  (`close_matches=False` leaves them out: they take a while over the whole table)."""
  _close = _close_matches if close_matches else (lambda name: ".")
  source, slash, rest = name.partition("/")
  if not slash or source not in _DEFAULTS or not rest:
    raise ValueError(f"Checkpoint name {name!r} must be 'torchvision/<model>[.<weights>]', "
                     f"'timm/<model>[.<tag>]' or '<official source>/<model>[.<tag>]' "
                     f"({sorted(set(_DEFAULTS) - {'torchvision', 'timm'})}){_close(name)}")
  full = name
  table()   # fills TIMM_DEFAULTS
  if "." not in rest:
    if rest not in _DEFAULTS[source]:
      raise ValueError(f"Unknown {source} model {rest!r} (no default weights recorded in "
                       f"fi_jax.models.zoo){_close(name)}")
    full = f"{source}/{rest}.{_DEFAULTS[source][rest]}"
  if full not in table():
    what = f"{name!r} (default of {rest!r}: {full!r})" if full != name else repr(name)
    raise ValueError(f"Unknown checkpoint {what}{_close(full)}")
  return full


def _close_matches(name: str) -> str:
  all_names = names()
  close = difflib.get_close_matches(name, all_names, n=8, cutoff=0.6)
  model = name.split("/")[-1].split(".")[0]
  close += [n for n in all_names if n.split("/")[1].split(".")[0] == model and n not in close]
  hint = " `python -m fi_jax.models list` lists every name."
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
    full = canonical_name(name, close_matches=False)
  except ValueError:
    return _resolve_torchax(name)
  info = dict(table()[full], name=full, route="flax")
  info["mean"], info["std"] = _mean_std(info["pp"])
  info["model"] = dict(num_classes=info["num_classes"], variant=info["variant"])
  return info


def _resolve_torchax(name: str) -> dict[str, Any]:
  """`resolve` of a name without a native port, through the torchax route; if that refuses
  it too, the native error (with close matches) and the route's reason."""
  from fi_jax.models import torchax_classifier  # torch-side, and only for such names

  def native() -> str:
    try:
      canonical_name(name)
    except ValueError as e:
      return str(e)
    return ""
  try:
    entry = torchax_classifier.resolve(name)
  except ImportError as e:
    raise ValueError(f"{native()} Models without a native port run through torchax: {e}") \
        from None
  except ValueError as e:
    raise ValueError(f"{native()} (Nor does the torchax route take it: {e})") from None
  info = dict(entry, name=entry["variant"])
  info["mean"], info["std"] = _mean_std(info["pp"])
  info["model"] = dict(num_classes=info["num_classes"], variant=info["variant"])
  return info


def init_shape(info: dict[str, Any]) -> tuple[int, int, int, int]:
  """(1, H, W, 3) of the entry's `input_size` (an int or (H, W))."""
  size = info["input_size"]
  h, w = (size, size) if isinstance(size, int) else size
  return (1, int(h), int(w), 3)


def from_pretrained(name: str, ckpt: str | dict[str, str],
                    **overrides) -> tuple[Any, dict, dict[str, Any]]:
  """(model, params, info) of a published checkpoint `name` read from the local file `ckpt`
  (.pth weights-only, .bin or .safetensors; a model published as a backbone plus a linear
  head file, "dinov3/dinov3_vit7b16_lc", takes {"backbone": path, "head": path}). `overrides`
  go to the family's `Model` (e.g. dtype="bfloat16", or smaller widths for a stand-in file).
  The model is initialised at info["input_size"] as shapes only: every value comes from the
  checkpoint. A file that does not fit raises CheckpointError naming the file's key and shape,
  the model's, and where the named checkpoint is downloaded."""
  info = resolve(name)
  parts = dict(ckpt) if isinstance(ckpt, dict) else {"": ckpt}
  for part, path in parts.items():   # {"backbone": .., "head": ..}: a backbone + linear head
    if not os.path.exists(path):
      raise FileNotFoundError(f"Checkpoint file {path!r} of {info['name']} not found; download "
                              f"it from {info.get(f'{part}_url', info['url'])}.")
  mod = family_module(info["family"])
  model_kw = {**info["model"], **overrides}
  model = mod.Model(**model_kw)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                          jnp.zeros(init_shape(info), jnp.float32))["params"]
  try:
    params = mod.load(shapes, ckpt, model_kw)
  except CheckpointError as e:
    raise CheckpointError(f"{e} {info['name']}'s weights: {info['url']}") from None
  return model, params, {**info, "model": model_kw}


def describe_pp(pp: str) -> str:
  """A short reading of a zoo pp string: "resize 256 bilinear, crop 224, imagenet" (torchvision),
  "resize 248 (crop_pct 0.9) bicubic, crop 224, inception" (timm; 'squash' when both sides are
  resized to the crop)."""
  ops = {}
  for op in pp.split("|"):
    head, _, args = op.partition("(")
    ops[head] = args[:-1] if args else ""
  mean_std = _mean_std(pp)
  norm = next((k for k, v in pretrained.NORMS.items() if tuple(map(tuple, v)) == mean_std),
              f"mean {mean_std[0]} std {mean_std[1]}")
  if "resize_torchvision" in ops:
    size, method = (a.strip(" '") for a in ops["resize_torchvision"].split(","))
    crop = ops["central_crop_torchvision"]
    return f"resize {size} {method}, crop {crop}, {norm}"
  if "resize_timm" in ops:
    size, crop_pct, method, mode = (a.strip(" '") for a in ops["resize_timm"].split(","))
    if mode == "squash":
      return f"squash {size} {method}, {norm}"
    scaled = preprocess.timm_scale_size(int(size), float(crop_pct))
    return f"resize {scaled} (crop_pct {crop_pct}) {method}, crop {size}, {norm}"
  return pp


def rows(family: str | None = None) -> list[dict[str, Any]]:
  """One dict per accepted name (name, family, source, input_size, preprocessing: the
  `describe_pp` of its pp, default: whether the tag-less name means it), in table order;
  `family` keeps one family. Tag-less names are the `default` rows' models."""
  if family is not None and family not in FAMILIES:
    raise ValueError(f"Unknown family {family!r}; known: {list(FAMILIES)}.")
  out = []
  for name, e in table().items():
    if family is not None and e["family"] != family:
      continue
    source, rest = name.split("/", 1)
    model, tag = rest.split(".", 1)
    out.append(dict(name=name, family=e["family"], source=source,
                    input_size=e["input_size"], num_classes=e["num_classes"],
                    preprocessing=describe_pp(e["pp"]),
                    default=_DEFAULTS[source].get(model) == tag))
  return out


def names_markdown() -> str:
  """docs/models.md's table of the accepted names: one row per model (family, source, model,
  its tags with the default in bold, each with its input size when the model has several),
  generated from `table()`."""
  groups: dict = defaultdict(list)
  for r in rows():
    source, rest = r["name"].split("/", 1)
    model, tag = rest.split(".", 1)
    groups[(r["family"], source, model)].append((tag, r["input_size"], r["default"]))
  lines = ["| family | source | model | tags (**default**) |", "|---|---|---|---|"]
  for (family, source, model), tags in groups.items():
    sizes = {s for _, s, _ in tags}
    cells = [(f"**{t}**" if d else t) + (f" ({s})" if len(sizes) > 1 else "") for t, s, d in tags]
    size = f" ({next(iter(sizes))} px)" if len(sizes) == 1 else ""
    lines.append(f"| {family} | {source} | `{model}`{size} | {', '.join(cells)} |")
  return "\n".join(lines) + "\n"
