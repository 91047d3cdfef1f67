"""Entries of the families' PRETRAINED tables: a published checkpoint name -> its variant,
eval transform (a fi_jax pp string equal to the source's), class count and download url.

torchvision entries follow a weights enum's `transforms()` (Resize(resize, interp) ->
CenterCrop(crop) -> Normalize); timm entries a pretrained_cfg (`resolve_data_config`:
input_size, crop_pct, interpolation, crop_mode, mean / std).

timm's weights are data, not code: a family names the timm architectures its module builds
(`timm_tags(models)`) and gets one entry per pretrained tag timm lists for them, read from
`_timm_tags.TAGS` (timm's pretrained_cfg facts, recorded in the repository; nothing imports
timm). A tag changes the weights, class count and eval transform, never the module. See
docs/models.md ("Published checkpoints").
"""
from __future__ import annotations

from typing import Iterable, Mapping, Optional, Union

from fi_jax.data import preprocess
from fi_jax.models import _timm_tags

# mean / std of an eval transform
NORMS = {
    "imagenet": (preprocess.IMAGENET_MEAN, preprocess.IMAGENET_STD),
    "inception": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
}

# eval crop modes fi_jax's resize_timm reproduces ('border' is not one)
TIMM_CROP_MODES = ("center", "squash")


def torchvision(tag: str, file: str, resize: int = 256, crop: int = 224,
                interp: str = "bilinear", norm: str = "imagenet", num_classes: int = 1000,
                ) -> dict[str, dict]:
  """{"torchvision/<tag>": entry}; `file` is the name under download.pytorch.org/models/."""
  return {f"torchvision/{tag}": dict(
      variant=tag.split(".")[0], source="torchvision", num_classes=num_classes,
      input_size=crop, pp=preprocess.torchvision_pp(resize, crop, interp, *NORMS[norm]),
      url=f"https://download.pytorch.org/models/{file}")}


def timm(tag: str, size: int, crop_pct: float, interp: str = "bicubic", num_classes: int = 1000,
         norm: str = "imagenet", crop_mode: str = "center") -> dict[str, dict]:
  """{"timm/<tag>": entry} written out by hand (prefer `timm_tags`, which reads the facts);
  the weights are the HF hub's timm/<tag> model.safetensors."""
  return {f"timm/{tag}": dict(
      variant=tag.split(".")[0], source="timm", num_classes=num_classes, input_size=size,
      pp=preprocess.timm_pp(size, crop_pct, interp, *NORMS[norm], crop_mode=crop_mode),
      url=f"https://huggingface.co/timm/{tag}/resolve/main/model.safetensors")}


def timm_tag_facts(name: str) -> Optional[tuple]:
  """The recorded pretrained_cfg facts of "<model>.<tag>" (see `_timm_tags`), or None."""
  return _timm_tags.TAGS.get(name)


def timm_unsupported_reason(name: str) -> Optional[str]:
  """Why a recorded tag's eval transform has no fi_jax pp string (None when it has one)."""
  h, w, _, _, crop_mode, *_ = _timm_tags.TAGS[name]
  if h != w:
    return f"a non-square input size {h}x{w}"
  if crop_mode not in TIMM_CROP_MODES:
    return f"crop_mode {crop_mode!r}"
  return None


def timm_entry(name: str, variant: str) -> dict:
  """The entry of the recorded timm tag "<model>.<tag>", built as `variant`."""
  size, _, crop_pct, interp, crop_mode, norm, classes, hub = _timm_tags.TAGS[name]
  mean, std = _timm_tags.NORMS[norm] if isinstance(norm, str) else norm
  return dict(variant=variant, source="timm", num_classes=classes, input_size=size,
              pp=preprocess.timm_pp(size, crop_pct, interp, mean, std, crop_mode=crop_mode),
              url=f"https://huggingface.co/{hub or 'timm/' + name}/resolve/main/model.safetensors")


def _tags_by_model() -> dict[str, list[str]]:
  out: dict[str, list[str]] = {}
  for name in _timm_tags.TAGS:
    model, _, tag = name.partition(".")
    out.setdefault(model, []).append(tag)
  return out


TIMM_TAGS_BY_MODEL: dict[str, list[str]] = _tags_by_model()
# timm model -> its default pretrained tag
TIMM_DEFAULT_TAGS: dict[str, str] = _timm_tags.DEFAULT_TAGS


def timm_tags(models: Union[Iterable[str], Mapping[str, str]]) -> dict[str, dict]:
  """{"timm/<model>.<tag>": entry} for every pretrained tag timm lists for `models` (timm
  architecture names; a mapping gives each the family's `variant` name, else the variant is
  the timm name). Tags whose eval transform fi_jax cannot express (`timm_unsupported_reason`)
  are left out. A model timm has no pretrained tag for raises ValueError."""
  variants = dict(models) if isinstance(models, Mapping) else {m: m for m in models}
  out = {}
  for model, variant in variants.items():
    if model not in TIMM_TAGS_BY_MODEL:
      raise ValueError(f"timm lists no pretrained tag for {model!r} (fi_jax.models._timm_tags, "
                       f"timm {_timm_tags.TIMM_VERSION}).")
    for tag in TIMM_TAGS_BY_MODEL[model]:
      name = f"{model}.{tag}"
      if timm_unsupported_reason(name) is None:
        out[f"timm/{name}"] = timm_entry(name, variant)
  return out
