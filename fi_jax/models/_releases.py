"""Released checkpoints as data: names, files, download hints, eval pp strings.

Nothing here builds a model or downloads anything; model files and configs read these tables.
A vanity / release name is looked up as its file name in $FI_JAX_CHECKPOINT_DIR (default: the
working directory). See docs/models.md.
"""
from __future__ import annotations

import os
from typing import Mapping

from fi_jax.models.convert import readers
from fi_jax.models.text import tokenizers

# ----------------------------------------------------------------------------- ViT (big_vision)

# big_vision's shortcut names (facts: the released files they stand for). A vanity name is looked
# up as its file name in $FI_JAX_CHECKPOINT_DIR (default: the working directory); nothing is
# downloaded.
VANITY_NAMES = {
    "howto-i21k-Ti/16": "gs://vit_models/augreg/Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0.npz",
    "howto-i21k-S/32": "gs://vit_models/augreg/S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0.npz",
    "howto-i21k-S/16": "gs://vit_models/augreg/S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0.npz",
    "howto-i21k-B/32": "gs://vit_models/augreg/B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0.npz",
    "howto-i21k-B/16": "gs://vit_models/augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0.npz",
    "howto-i21k-B/8": "gs://vit_models/augreg/B_8-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0.npz",
    "howto-i21k-L/16": "gs://vit_models/augreg/L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0.npz",
    "i1k-s16-90ep": "gs://big_vision/vit_s16_i1k_90ep.npz",
    "i1k-s16-150ep": "gs://big_vision/vit_s16_i1k_150ep.npz",
    "i1k-s16-300ep": "gs://big_vision/vit_s16_i1k_300ep.npz",
}

CHECKPOINT_DIR_ENV = "FI_JAX_CHECKPOINT_DIR"


def resolve_vanity(init_file: str, names: Mapping[str, str] = VANITY_NAMES) -> tuple[str, str]:
  """(local path, download hint) for a path or a big_vision vanity name (+ optional ':sub/key')."""
  base, sep, key = init_file.partition(":")
  if base not in names:
    return init_file, download_hint(init_file)
  url = names[base]
  local = os.path.join(os.environ.get(CHECKPOINT_DIR_ENV, "."), url.rsplit("/", 1)[1])
  return local + sep + key, download_hint(url)


def download_hint(path: str) -> str:
  """Where to get a checkpoint (a known release name, else the usual places)."""
  name = os.path.basename(readers.split_subkey(path)[0])
  for url in list(VANITY_NAMES.values()) + list(SIGLIP_RELEASES.values()):
    if url.endswith("/" + name):
      return (f"Download it with `gsutil cp {url} .` (or https://storage.googleapis.com/"
              f"{url[len('gs://'):]}) and pass the local path.")
  return ("big_vision ViT checkpoints are at gs://big_vision/ (e.g. gs://big_vision/vit_s16_i1k_300ep.npz), "
          "AugReg ones at gs://vit_models/augreg/, SigLIP at gs://big_vision/siglip/ and "
          "gs://big_vision/siglip2/; torchvision weights at https://download.pytorch.org/models/ "
          "(one model's url: `zoo.resolve(\"torchvision/<name>\")[\"url\"]`); timm / HF weights "
          "are the repo's model.safetensors.")


# ----------------------------------------------------------------------------- SigLIP / SigLIP 2
# name: (file, image variant, resolution, text variant, embedding dim or None, text length,
#        vocab size, tokenizer kind). Facts from big_vision's SigLIP / SigLIP 2 demos and README.
_SIGLIP = "gs://big_vision/siglip/"
_SIGLIP2 = "gs://big_vision/siglip2/"
SIGLIP_TABLE = {
    "siglip_b16_224": (_SIGLIP + "webli_en_b16_224_63724782.npz", "B/16", 224, "B", 768, 64, 32_000, "siglip"),
    "siglip_b16_256": (_SIGLIP + "webli_en_b16_256_60500360.npz", "B/16", 256, "B", 768, 64, 32_000, "siglip"),
    "siglip_b16_384": (_SIGLIP + "webli_en_b16_384_68578854.npz", "B/16", 384, "B", 768, 64, 32_000, "siglip"),
    "siglip_b16_512": (_SIGLIP + "webli_en_b16_512_68580893.npz", "B/16", 512, "B", 768, 64, 32_000, "siglip"),
    "siglip_l16_256": (_SIGLIP + "webli_en_l16_256_60552751.npz", "L/16", 256, "L", 1024, 64, 32_000, "siglip"),
    "siglip_l16_384": (_SIGLIP + "webli_en_l16_384_63634585.npz", "L/16", 384, "L", 1024, 64, 32_000, "siglip"),
    "siglip_so400m14_224": (_SIGLIP + "webli_en_so400m_224_57633886.npz", "So400m/14", 224, "So400m", 1152, 16, 32_000, "siglip"),
    "siglip_so400m14_384": (_SIGLIP + "webli_en_so400m_384_58765454.npz", "So400m/14", 384, "So400m", 1152, 64, 32_000, "siglip"),
    "siglip_i18n_b16_256": (_SIGLIP + "webli_i18n_b16_256_66117334.npz", "B/16", 256, "B", 768, 64, 250_000, "siglip_i18n"),
    "siglip_i18n_so400m16_256": (_SIGLIP + "webli_i18n_so400m_16_256_78061115.npz", "So400m/16", 256, "So400m", None, 64, 250_000, "siglip_i18n"),
}
for _res in (224, 256, 384, 512):
  SIGLIP_TABLE[f"siglip2_b16_{_res}"] = (f"{_SIGLIP2}siglip2_b16_{_res}.npz", "B/16", _res, "B", 768, 64, 256_000, "siglip2")
for _res in (256, 384, 512):
  SIGLIP_TABLE[f"siglip2_l16_{_res}"] = (f"{_SIGLIP2}siglip2_l16_{_res}.npz", "L/16", _res, "L", 1024, 64, 256_000, "siglip2")
  SIGLIP_TABLE[f"siglip2_so400m16_{_res}"] = (f"{_SIGLIP2}siglip2_so400m16_{_res}.npz", "So400m/16", _res, "So400m", 1152, 64, 256_000, "siglip2")
for _res in (224, 384):
  SIGLIP_TABLE[f"siglip2_so400m14_{_res}"] = (f"{_SIGLIP2}siglip2_so400m14_{_res}.npz", "So400m/14", _res, "So400m", 1152, 64, 256_000, "siglip2")
for _res in (256, 384):  # g-opt image tower with a So400m text tower (text head 1152 -> 1536)
  SIGLIP_TABLE[f"siglip2_g-opt16_{_res}"] = (f"{_SIGLIP2}siglip2_g-opt16_{_res}.npz", "g-opt/16", _res, "So400m", 1536, 64, 256_000, "siglip2")
SIGLIP_TABLE["siglip2_b32_256"] = (_SIGLIP2 + "siglip2_b32_256.npz", "B/32", 256, "B", 768, 64, 256_000, "siglip2")
# NaFlex towers, run here as fixed-resolution ViTs on square 256 px inputs (16x16 = 256 patches,
# the sequence length of the README numbers); `convert.naflex.to_fixed_resolution` converts them on load.
SIGLIP_TABLE["siglip2_b16_naflex"] = (_SIGLIP2 + "siglip2_b16_naflex.npz", "B/16", 256, "B", 768, 64, 256_000, "siglip2")
SIGLIP_TABLE["siglip2_so400m16_naflex"] = (_SIGLIP2 + "siglip2_so400m16_naflex.npz", "So400m/16", 256, "So400m", 1152, 64, 256_000, "siglip2")

SIGLIP_RELEASES: dict[str, str] = {k: v[0] for k, v in SIGLIP_TABLE.items()}


def siglip_release_config(name: str, scan: bool = True) -> dict:
  """Everything a config needs for a released SigLIP / SigLIP 2 checkpoint.

  Returns dict(model=..., init_shape=..., model_init=<release name, found as its file name in
  $FI_JAX_CHECKPOINT_DIR>, url=<gs://... of the weights>, tokenizer=<tokenizers kind>,
  tokenizer_url=<gs://... of the SentencePiece model>, pp=<image pp string>). The image pp is
  big_vision's demo one: squash resize (bilinear, no antialias) to the resolution, values in
  [-1, 1].
  """
  if name not in SIGLIP_TABLE:
    raise ValueError(f"Unknown SigLIP release {name!r}; known: {sorted(SIGLIP_TABLE)}.")
  url, img_variant, res, txt_variant, emb, seq_len, vocab, tok = SIGLIP_TABLE[name]
  model = dict(image=dict(variant=img_variant, pool_type="map", scan=scan),
               text=dict(variant=txt_variant, vocab_size=vocab, scan=scan),
               out_dim=(None, emb), bias_init=-10.0, text_len=seq_len)
  return dict(model=model, init_shape=(1, res, res, 3), model_init=name, url=url, tokenizer=tok,
              tokenizer_url=tokenizers.KNOWN_MODELS[tokenizers.KINDS[tok][0]],
              pp=f"decode|resize({res})|value_range(-1, 1)")


# ----------------------------------------------------------------------------- CLIP
# CLIP's eval transform: Resize(res, bicubic) of the shorter side on PIL images (PIL's bicubic
# antialiases when shrinking), CenterCrop(res), mean/std. Most checkpoints use OpenAI's mean/std;
# LAION's L/14 laion2b_s32b_b82k uses 0.5/0.5 (inception) [open_clip pretrained.py].
CLIP_OPENAI_PP = ("decode|resize_small({res}, method='bicubic', antialias=True)|"
                  "central_crop({res})|clip_value_range")
CLIP_INCEPTION_PP = ("decode|resize_small({res}, method='bicubic', antialias=True)|"
                     "central_crop({res})|value_range(-1, 1)")

_HF = "https://huggingface.co/{}"
# name: (model kwargs, Hugging Face repo holding open_clip_model.safetensors or
# open_clip_pytorch_model.bin, pp string). OpenAI weights come re-hosted by timm in open_clip's
# state-dict layout (the original openaipublic .pt files are TorchScript archives, which fi_jax
# does not load: they are not plain state dicts).
CLIP_CHECKPOINTS = {
    "openai-B/32": (dict(variant="B/32", act="quick_gelu"),
                    _HF.format("timm/vit_base_patch32_clip_224.openai"), CLIP_OPENAI_PP.format(res=224)),
    "openai-B/16": (dict(variant="B/16", act="quick_gelu"),
                    _HF.format("timm/vit_base_patch16_clip_224.openai"), CLIP_OPENAI_PP.format(res=224)),
    "openai-L/14": (dict(variant="L/14", act="quick_gelu"),
                    _HF.format("timm/vit_large_patch14_clip_224.openai"),
                    CLIP_OPENAI_PP.format(res=224)),
    "openai-L/14@336": (dict(variant="L/14", act="quick_gelu", image_size=336),
                        _HF.format("timm/vit_large_patch14_clip_336.openai"),
                        CLIP_OPENAI_PP.format(res=336)),
    "laion2b-B/16": (dict(variant="B/16", act="gelu_exact"),
                     _HF.format("laion/CLIP-ViT-B-16-laion2B-s34B-b88K"),
                     CLIP_OPENAI_PP.format(res=224)),
    "laion2b-L/14": (dict(variant="L/14", act="gelu_exact"),
                     _HF.format("laion/CLIP-ViT-L-14-laion2B-s32B-b82K"),
                     CLIP_INCEPTION_PP.format(res=224)),
    "datacomp-B/16": (dict(variant="B/16", act="gelu_exact"),
                      _HF.format("laion/CLIP-ViT-B-16-DataComp.XL-s13B-b90K"),
                      CLIP_OPENAI_PP.format(res=224)),
    "datacomp-L/14": (dict(variant="L/14", act="gelu_exact"),
                      _HF.format("laion/CLIP-ViT-L-14-DataComp.XL-s13B-b90K"),
                      CLIP_OPENAI_PP.format(res=224)),
}
CLIP_DOWNLOAD_HINT = ("CLIP checkpoints are OpenCLIP state dicts (open_clip_model.safetensors or "
                      "open_clip_pytorch_model.bin from the model's Hugging Face repo), e.g. "
                      + "; ".join(f"{k}: {v[1]}" for k, v in list(CLIP_CHECKPOINTS.items())[:2])
                      + " (all in fi_jax.models._releases.CLIP_CHECKPOINTS)")



# ----------------------------------------------------------------------------- PE-Core
# Perception Encoder PE-Core (facebookresearch/perception_models @ 3e352cc, core/vision_encoder/
# config.py, transforms.py): the official eval transform is a squash resize of the PIL image to
# (res, res), bilinear (Pillow antialiases when shrinking), then mean = std = 0.5.
PE_CORE_PP = ("decode_pil|resize_torchvision(({res}, {res}), 'bilinear')|"
              "normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))")
# name: (pe_core.Model kwargs, input size, official file (Hugging Face facebook/<name>, file
# <name>.pt), open_clip's copy (open_clip 3.3.0 pretrained.py, Hugging Face repo), timm's
# vision tower (timm 1.0.31)).
PE_CORE_CHECKPOINTS = {
    "PE-Core-T16-384": (dict(variant="T/16"), 384, "PE-Core-T-16-384", "vit_pe_core_tiny_patch16_384.fb"),
    "PE-Core-S16-384": (dict(variant="S/16"), 384, "PE-Core-S-16-384", "vit_pe_core_small_patch16_384.fb"),
    "PE-Core-B16-224": (dict(variant="B/16"), 224, "PE-Core-B-16", "vit_pe_core_base_patch16_224.fb"),
    "PE-Core-L14-336": (dict(variant="L/14"), 336, "PE-Core-L-14-336", "vit_pe_core_large_patch14_336.fb"),
    "PE-Core-G14-448": (dict(variant="G/14"), 448, "PE-Core-bigG-14-448", "vit_pe_core_gigantic_patch14_448.fb"),
}


def pe_core_urls(name: str) -> dict[str, str]:
  """{"official": ..., "open_clip": ..., "timm": ...} download pages of a PE-Core release."""
  _, _, open_clip_name, timm_name = PE_CORE_CHECKPOINTS[name]
  return {"official": _HF.format(f"facebook/{name}") + f" (file {name}.pt)",
          "open_clip": _HF.format(f"timm/{open_clip_name}") + " (open_clip_model.safetensors)",
          "timm": _HF.format(f"timm/{timm_name}") + " (model.safetensors, image tower only)"}


PE_CORE_DOWNLOAD_HINT = (
    "PE-Core checkpoints: the official https://huggingface.co/facebook/<name>/<name>.pt "
    "(e.g. https://huggingface.co/facebook/PE-Core-B16-224, file PE-Core-B16-224.pt) or "
    "open_clip's open_clip_model.safetensors (https://huggingface.co/timm/PE-Core-B-16); names: "
    + ", ".join(PE_CORE_CHECKPOINTS) + " (fi_jax.models._releases.PE_CORE_CHECKPOINTS).")


# ----------------------------------------------------------------------------- DINOv2
# DINOv2's eval transform (transforms.py): Resize(256, bicubic) on PIL images (antialiased),
# CenterCrop(224), ImageNet mean/std.
DINOV2_PP = "decode|resize_small(256, method='bicubic', antialias=True)|central_crop(224)|vgg_value_range"

_DINOV2_URL = "https://dl.fbaipublicfiles.com/dinov2/dinov2_vit{s}14/dinov2_vit{s}14{reg}_{what}.pth"
DINOV2_DOWNLOAD_HINT = (
    "DINOv2 weights: " + _DINOV2_URL.format(s="{s,b,l,g}", reg="[_reg4]", what="pretrain")
    + " (backbones) and " + _DINOV2_URL.format(s="{s,b,l,g}", reg="[_reg4]", what="linear4_head")
    + " (heads; '_linear_head' for head_layers=1), or timm's vit_*_patch14_"
    "[reg4_]dinov2.lvd142m model.safetensors")


def dinov2_checkpoint_url(variant: str, registers: bool, what: str = "pretrain") -> str:
  """Official file for `variant` ('S/14'...), what = pretrain | linear_head | linear4_head."""
  return _DINOV2_URL.format(s=variant[0].lower(), reg="_reg4" if registers else "", what=what)
