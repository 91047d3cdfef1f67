"""Entries of the families' PRETRAINED tables: a published checkpoint name -> its variant,
eval transform (a fi_jax pp string equal to the source's), class count and download url.

torchvision entries follow a weights enum's `transforms()` (Resize(resize, interp) ->
CenterCrop(crop) -> Normalize); timm entries a pretrained_cfg (`resolve_data_config`:
input_size, crop_pct, interpolation, crop_mode, mean / std). See docs/models.md.
"""
from __future__ import annotations

from fi_jax.data import preprocess

# mean / std of an eval transform
NORMS = {
    "imagenet": (preprocess.IMAGENET_MEAN, preprocess.IMAGENET_STD),
    "inception": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
}


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
  """{"timm/<tag>": entry}; the weights are the HF hub's timm/<tag> model.safetensors."""
  return {f"timm/{tag}": dict(
      variant=tag.split(".")[0], source="timm", num_classes=num_classes, input_size=size,
      pp=preprocess.timm_pp(size, crop_pct, interp, *NORMS[norm], crop_mode=crop_mode),
      url=f"https://huggingface.co/timm/{tag}/resolve/main/model.safetensors")}
