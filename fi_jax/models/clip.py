"""CLIP (OpenAI and OpenCLIP ViT models) in Flax, loading the released PyTorch weights.

`Model(variant="B/16", act="quick_gelu")` builds both towers from big_vision's ViT blocks
(`vit.Encoder`) with CLIP's differences: the class token is prepended *before* the position
embedding (so it has its own posemb slot), `ln_pre` before the blocks, conv stem without bias,
LayerNorm eps 1e-5, QuickGELU or exact GELU, a causal text mask and EOT pooling (the argmax of
the token ids). As in big_vision's two_towers, `apply({'params': p}, images, texts)` returns
`(zimg, ztxt, out)` with L2-normalised embeddings; either input may be None.
`out["pre_logits"]` is the normalised image embedding: with the zero-shot head (class text
embeddings times exp(t)) it gives the logits (see `predictor`).

Parameter tree (big_vision-like names):
  img/embedding/kernel (P,P,3,W)  img/cls (1,1,W)  img/pos_embedding (1,1+N,W)  img/ln_pre
  img/Transformer/encoderblock_{i}/... (vit.Encoder1DBlock)
  img/Transformer/encoder_norm (= ln_post)
  img/head/kernel (W,E) (= visual.proj)
  txt/Embed_0/embedding (V,Wt)  txt/pos_embedding (1,77,Wt)  txt/Encoder_0/encoderblock_{i}/...
  txt/Encoder_0/encoder_norm (= ln_final)  txt/head/kernel (Wt,E) (= text_projection)
  t (1,) = logit_scale (log of the logit multiplier, ~ln 100 for released models)

Activation per checkpoint (wrong choice silently costs accuracy): `quick_gelu` for all OpenAI
weights and OpenCLIP's `*-quickgelu`, `dfn2b`, MetaCLIP tags; `gelu_exact` for LAION-2B and
DataComp tags. See `CHECKPOINTS` for files, settings and the matching pp strings.

The PyTorch-to-Flax helpers at the bottom (state-dict reading, fused-qkv splitting, torch's
bicubic resize, merging into the init tree) are shared with `dinov2.py`.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.models import checkpoints
from fi_jax.models import vit

# CLIP's eval transform: Resize(res, bicubic) of the shorter side on PIL images (PIL's bicubic
# antialiases when shrinking), CenterCrop(res), mean/std. Most checkpoints use OpenAI's mean/std;
# LAION's L/14 laion2b_s32b_b82k uses 0.5/0.5 (inception) [open_clip pretrained.py].
OPENAI_PP = ("decode|resize_small({res}, method='bicubic', antialias=True)|central_crop({res})|"
             "clip_value_range")
INCEPTION_PP = ("decode|resize_small({res}, method='bicubic', antialias=True)|"
                "central_crop({res})|value_range(-1, 1)")

# OpenCLIP model configs: image (width, depth, heads, mlp_dim, patch), text (width, depth,
# heads), embed dim.  [open_clip model_configs/ViT-*.json]
_VARIANTS = {
    "B/32": ((768, 12, 12, 3072, 32), (512, 12, 8), 512),
    "B/16": ((768, 12, 12, 3072, 16), (512, 12, 8), 512),
    "L/14": ((1024, 24, 16, 4096, 14), (768, 12, 12), 768),
    "H/14": ((1280, 32, 16, 5120, 14), (1024, 24, 16), 1024),
    "g/14": ((1408, 40, 16, 6144, 14), (1024, 24, 16), 1024),
    "bigG/14": ((1664, 48, 16, 8192, 14), (1280, 32, 20), 1280),
}

_HF = "https://huggingface.co/{}"
# name: (model kwargs, Hugging Face repo holding open_clip_model.safetensors or
# open_clip_pytorch_model.bin, pp string). OpenAI weights come re-hosted by timm in open_clip's
# state-dict layout (the original openaipublic .pt files are TorchScript archives, which fi_jax
# does not load: they are not plain state dicts).
CHECKPOINTS = {
    "openai-B/32": (dict(variant="B/32", act="quick_gelu"),
                    _HF.format("timm/vit_base_patch32_clip_224.openai"), OPENAI_PP.format(res=224)),
    "openai-B/16": (dict(variant="B/16", act="quick_gelu"),
                    _HF.format("timm/vit_base_patch16_clip_224.openai"), OPENAI_PP.format(res=224)),
    "openai-L/14": (dict(variant="L/14", act="quick_gelu"),
                    _HF.format("timm/vit_large_patch14_clip_224.openai"),
                    OPENAI_PP.format(res=224)),
    "openai-L/14@336": (dict(variant="L/14", act="quick_gelu", image_size=336),
                        _HF.format("timm/vit_large_patch14_clip_336.openai"),
                        OPENAI_PP.format(res=336)),
    "laion2b-B/16": (dict(variant="B/16", act="gelu_exact"),
                     _HF.format("laion/CLIP-ViT-B-16-laion2B-s34B-b88K"),
                     OPENAI_PP.format(res=224)),
    "laion2b-L/14": (dict(variant="L/14", act="gelu_exact"),
                     _HF.format("laion/CLIP-ViT-L-14-laion2B-s32B-b82K"),
                     INCEPTION_PP.format(res=224)),
    "datacomp-B/16": (dict(variant="B/16", act="gelu_exact"),
                      _HF.format("laion/CLIP-ViT-B-16-DataComp.XL-s13B-b90K"),
                      OPENAI_PP.format(res=224)),
    "datacomp-L/14": (dict(variant="L/14", act="gelu_exact"),
                      _HF.format("laion/CLIP-ViT-L-14-DataComp.XL-s13B-b90K"),
                      OPENAI_PP.format(res=224)),
}
DOWNLOAD_HINT = ("CLIP checkpoints are OpenCLIP state dicts (open_clip_model.safetensors or "
                 "open_clip_pytorch_model.bin from the model's Hugging Face repo), e.g. "
                 + "; ".join(f"{k}: {v[1]}" for k, v in list(CHECKPOINTS.items())[:2])
                 + " (all in fi_jax.models.clip.CHECKPOINTS)")


def decode_variant(variant: Optional[str]) -> dict:
  """'B/16' -> dict(image=..., text=..., out_dim=...) (OpenCLIP's model configs)."""
  if variant is None:
    return {}
  if variant not in _VARIANTS:
    raise ValueError(f"Unknown CLIP variant {variant!r}; known: {sorted(_VARIANTS)}.")
  (w, d, h, m, p), (tw, td, th), e = _VARIANTS[variant]
  return dict(image=dict(width=w, depth=d, num_heads=h, mlp_dim=m, patch_size=p),
              text=dict(width=tw, depth=td, num_heads=th), out_dim=e)


def _normalize(z: jax.Array) -> jax.Array:
  return z / (jnp.linalg.norm(z, axis=-1, keepdims=True) + 1e-8)


class VisionTower(nn.Module):
  """CLIP ViT: conv stem (no bias), [cls; patches] + posemb, ln_pre, blocks, ln_post, proj."""
  out_dim: int = 512
  width: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_dim: Optional[int] = None
  patch_size: int = 16
  act: str = "quick_gelu"
  ln_eps: float = 1e-5
  scan: bool = False
  dtype_mm: str = "float32"

  @nn.compact
  def __call__(self, image):
    out = {}
    p = self.patch_size
    x = nn.Conv(self.width, (p, p), strides=(p, p), padding="VALID", use_bias=False,
                dtype=self.dtype_mm, name="embedding")(jnp.asarray(image, self.dtype_mm))
    n, h, w, c = x.shape
    x = jnp.reshape(x, (n, h * w, c))
    cls = self.param("cls", nn.initializers.normal(c ** -0.5), (1, 1, c), jnp.float32)
    x = jnp.concatenate([jnp.tile(cls.astype(x.dtype), (n, 1, 1)), x], axis=1)
    pos = posemb_param(self, (1, 1 + h * w, c), c ** -0.5)   # any grid; resized per call
    x = out["with_posemb"] = x + resize_posemb(pos, (h, w), antialias=True).astype(x.dtype)
    x = nn.LayerNorm(epsilon=self.ln_eps, name="ln_pre")(x)
    x, out["encoder"] = vit.Encoder(
        depth=self.depth, mlp_dim=self.mlp_dim, num_heads=self.num_heads, act=self.act,
        ln_eps=self.ln_eps, scan=self.scan, dtype_mm=self.dtype_mm, attention="heads_first",
        name="Transformer")(x)
    out["encoded"] = x
    x = out["head_input"] = x[:, 0]          # ln_post (= encoder_norm) of the class token
    x = out["logits"] = nn.Dense(self.out_dim, use_bias=False, name="head")(x)
    return x, out


class TextTower(nn.Module):
  """CLIP text transformer: causal blocks, ln_final, EOT (argmax id) pooling, projection."""
  out_dim: int = 512
  width: int = 512
  depth: int = 12
  num_heads: int = 8
  mlp_dim: Optional[int] = None
  vocab_size: int = 49408
  context_length: int = 77
  act: str = "quick_gelu"
  ln_eps: float = 1e-5
  scan: bool = False
  dtype_mm: str = "float32"

  @nn.compact
  def __call__(self, text):
    out = {}
    text = jnp.asarray(text)
    length = text.shape[1]
    if length > self.context_length:
      raise ValueError(f"Text of length {length} is longer than the CLIP context "
                       f"({self.context_length}); tokenize with clip_tokenizer.Tokenizer.")
    x = nn.Embed(self.vocab_size, self.width, embedding_init=nn.initializers.normal(0.02),
                 name="Embed_0")(text).astype(self.dtype_mm)
    pos = self.param("pos_embedding", nn.initializers.normal(0.01),
                     (1, self.context_length, self.width), jnp.float32)
    x = x + pos[:, :length].astype(x.dtype)
    mask = nn.make_causal_mask(text, dtype=jnp.bool_)
    x, out["encoder"] = vit.Encoder(
        depth=self.depth, mlp_dim=self.mlp_dim, num_heads=self.num_heads, act=self.act,
        ln_eps=self.ln_eps, scan=self.scan, dtype_mm=self.dtype_mm, attention="heads_first",
        name="Encoder_0")(x, mask=mask)
    out["encoded"] = x
    eot = jnp.argmax(text, axis=-1)            # EOT (49407) is the largest id
    x = out["head_input"] = jnp.take_along_axis(x, eot[:, None, None], axis=1)[:, 0]
    x = out["logits"] = nn.Dense(self.out_dim, use_bias=False, name="head")(x)
    return x, out


class _Model(nn.Module):
  """Two towers + learned log logit scale `t`, returning (zimg, ztxt, out)."""
  out_dim: int = 512
  image: Optional[Mapping[str, Any]] = None
  text: Optional[Mapping[str, Any]] = None
  act: str = "quick_gelu"
  ln_eps: float = 1e-5
  scan: bool = False
  image_size: int = 224
  dtype_mm: str = "float32"

  def _towers(self):
    kw = dict(out_dim=self.out_dim, act=self.act, ln_eps=self.ln_eps, scan=self.scan,
              dtype_mm=self.dtype_mm)
    return (VisionTower(**kw, **dict(self.image or {}), name="img"),
            TextTower(**kw, **dict(self.text or {}), name="txt"))

  @nn.compact
  def __call__(self, image, text=None, *, train=False):
    del train  # no dropout in CLIP inference
    img_tower, txt_tower = self._towers()
    out, zimg, ztxt = {}, None, None
    t = self.param("t", nn.initializers.constant(np.log(1 / 0.07)), (1,), jnp.float32)
    out["t"], out["t/parameter"] = jnp.exp(t), t
    if self.is_initializing():   # create both towers' params from image-only or text-only init
      if image is None:
        image = jnp.zeros((1, self.image_size, self.image_size, 3), jnp.float32)
      if text is None:
        text = jnp.zeros((1, txt_tower.context_length), jnp.int32)
    if image is not None:
      z, img_out = img_tower(image)
      out.update({f"img/{k}": v for k, v in img_out.items()})
      out["img/norm"] = jnp.linalg.norm(z, axis=-1, keepdims=True)
      zimg = out["img/normalized"] = out["pre_logits"] = _normalize(z)
    if text is not None:
      z, txt_out = txt_tower(text)
      out.update({f"txt/{k}": v for k, v in txt_out.items()})
      out["txt/norm"] = jnp.linalg.norm(z, axis=-1, keepdims=True)
      ztxt = out["txt/normalized"] = _normalize(z)
    return zimg, ztxt, out


def Model(variant: Optional[str] = None, **kw) -> _Model:  # pylint: disable=invalid-name
  """`Model("B/16", act="quick_gelu")`; `image=`/`text=` dicts override single tower fields."""
  kw.pop("num_classes", None)   # the classifier of a CLIP model is its zero-shot head
  base = decode_variant(variant)
  for tower in ("image", "text"):
    base[tower] = {**base.get(tower, {}), **dict(kw.pop(tower, None) or {})}
  return _Model(**{**base, **kw})


def logits(zimg: jax.Array, ztxt: jax.Array, t: jax.Array) -> jax.Array:
  """CLIP's image-text logits exp(t) * zimg . ztxt^T (highest precision)."""
  return jnp.exp(t) * jnp.dot(zimg, ztxt.T, precision=jax.lax.Precision.HIGHEST)


# ----------------------------------------------------------------------------- loading

_IGNORED = re.compile(r"^(attn_mask|input_resolution|context_length|vocab_size|"
                      r"visual\.attn_mask)$")


def _block(prefix: str, m: re.Match, v: np.ndarray, heads: int) -> dict[str, np.ndarray]:
  conv = convert_block(m[2], v, heads, CLIP_BLOCK_NAMES)
  if conv is None:
    raise checkpoints.CheckpointError(
        f"CLIP checkpoint tensor {m[0]!r} (shape {v.shape}) does not fit the model: an "
        f"unknown block tensor, or a width that {heads} heads do not divide (wrong variant "
        f"or sizes?). {DOWNLOAD_HINT}.")
  return {f"{prefix}/{k}": a for k, a in conv.items()}


def _clip_rules():
  """(regex, fn(match, value, heads) -> {flax path: array}) for OpenCLIP state-dict keys."""
  ln = {"weight": "scale", "bias": "bias"}
  return [
      (r"visual\.conv1\.weight",
       lambda m, v, h: {"img/embedding/kernel": checkpoints.torch_conv(v)["kernel"]}),
      (r"visual\.class_embedding", lambda m, v, h: {"img/cls": v.reshape(1, 1, -1)}),
      (r"visual\.positional_embedding", lambda m, v, h: {"img/pos_embedding": v[None]}),
      (r"visual\.ln_pre\.(weight|bias)", lambda m, v, h: {f"img/ln_pre/{ln[m[1]]}": v}),
      (r"visual\.transformer\.resblocks\.(\d+)\.(.+)",
       lambda m, v, h: _block(f"img/Transformer/encoderblock_{m[1]}", m, v, h["img"])),
      (r"visual\.ln_post\.(weight|bias)",
       lambda m, v, h: {f"img/Transformer/encoder_norm/{ln[m[1]]}": v}),
      (r"visual\.proj", lambda m, v, h: {"img/head/kernel": v}),
      (r"token_embedding\.weight", lambda m, v, h: {"txt/Embed_0/embedding": v}),
      (r"positional_embedding", lambda m, v, h: {"txt/pos_embedding": v[None]}),
      (r"transformer\.resblocks\.(\d+)\.(.+)",
       lambda m, v, h: _block(f"txt/Encoder_0/encoderblock_{m[1]}", m, v, h["txt"])),
      (r"ln_final\.(weight|bias)", lambda m, v, h: {f"txt/Encoder_0/encoder_norm/{ln[m[1]]}": v}),
      (r"text_projection", lambda m, v, h: {"txt/head/kernel": v}),
      (r"logit_scale", lambda m, v, h: {"t": np.reshape(v, (1,))}),
  ]


def convert_state_dict(sd: Mapping[str, np.ndarray], num_heads: Mapping[str, int]
                       ) -> dict[str, np.ndarray]:
  """OpenCLIP / OpenAI state dict -> flat {flax path: array} (unrolled blocks)."""
  sd = dict(sd)
  if any(k.startswith("text.") for k in sd):   # CustomTextCLIP puts the text tower under text.
    sd = {k[len("text."):] if k.startswith("text.") else k: v for k, v in sd.items()}
  rules = [(re.compile(p), f) for p, f in _clip_rules()]
  flat = {}
  for key, value in sd.items():
    if _IGNORED.match(key):
      continue
    for pattern, fn in rules:
      m = pattern.fullmatch(key)
      if m:
        flat.update(fn(m, value, num_heads))
        break
    else:
      raise checkpoints.CheckpointError(
          f"Unexpected key {key!r} in the CLIP checkpoint (not a ViT CLIP model fi_jax "
          f"supports). {DOWNLOAD_HINT}.")
  return flat


def load(init_params, init_file: str, model_cfg: Optional[Mapping[str, Any]] = None,
         dont_load: Sequence[str] = ()) -> dict:
  """Loads an OpenCLIP/OpenAI state dict (.safetensors, or .pt/.pth/.bin via torch) into
  the tree of `init_params`. The image posemb keeps the checkpoint's grid (e.g. 24x24 for
  L/14@336) whatever resolution the model was initialised at; other input resolutions resize
  it per call exactly as open_clip's load-time `resize_pos_embed` (bicubic, antialias)."""
  del model_cfg  # shapes and head counts come from init_params
  init_params = jax.device_get(init_params)
  sd = read_state_dict(init_file, hint=DOWNLOAD_HINT)
  heads = {t: heads_of(init_params[t][enc]) for t, enc in (("img", "Transformer"),
                                                           ("txt", "Encoder_0"))}
  flat = convert_state_dict(sd, heads)
  return merge_torch(init_params, flat, init_file, DOWNLOAD_HINT, dont_load,
                     posemb="img/pos_embedding")


# ----------------------------------------------------------------------------- zero-shot head

def text_embedder(model: _Model, params, tokenizer, batch_size: int = 256):
  """texts -> [N, E] normalised text embeddings (numpy), jitted in fixed-size batches."""
  fn = jax.jit(lambda p, ids: model.apply({"params": p}, None, ids)[1])

  def embed(texts: Sequence[str]) -> np.ndarray:
    ids = tokenizer(list(texts))
    n = len(ids)
    pad = (-n) % batch_size
    ids = np.concatenate([ids, np.zeros((pad, ids.shape[1]), ids.dtype)])
    out = [np.asarray(fn(params, ids[i:i + batch_size])) for i in range(0, len(ids), batch_size)]
    return np.concatenate(out)[:n]
  return embed


def openai_templates() -> list[str]:
  """The 80 prompt templates of OpenAI's ImageNet notebook (big_vision's 'clip_paper' less
  its extra bare '{}')."""
  from fi_jax.models import zero_shot  # pylint: disable=g-import-not-at-top
  return [t for t in zero_shot.templates_by_name("clip_paper") if t != "{}"]


def predictor(model: _Model, params, config):
  """(predict_fn, Head) for fi_jax.run: logits of the zero-shot head exp(t) * E.T on the
  normalised image embedding, features = that embedding (`out['pre_logits']`).

  `config.zero_shot` (all optional): vocab_path (CLIP BPE file; default: open_clip's copy),
  class_names (default ImageNet-1k CLIP names), templates (default OpenAI's 80), batch_size,
  canonicalize_text (default False: CLIP's own protocol keeps prompts verbatim).
  """
  from fi_jax import detectors  # pylint: disable=g-import-not-at-top
  from fi_jax.models import clip_tokenizer  # pylint: disable=g-import-not-at-top
  from fi_jax.models import zero_shot  # pylint: disable=g-import-not-at-top
  zs = dict(config.get("zero_shot", None) or {})
  tok = clip_tokenizer.Tokenizer(zs.pop("vocab_path", None))
  embed = text_embedder(model, params, tok, int(zs.pop("batch_size", 256)))
  zs.setdefault("canonicalize_text", False)
  templates = zs.pop("templates", None) or openai_templates()
  scale = float(np.exp(np.asarray(jax.device_get(params["t"])).reshape(-1)[0]))
  w, b = zero_shot.head_arrays(embed, zs.pop("class_names", None), templates, scale=scale, **zs)
  w, b = jnp.asarray(w, jnp.float32), jnp.asarray(b, jnp.float32)

  def predict(p, images):
    zimg, _, _ = model.apply({"params": p}, images)
    return jnp.dot(zimg, w, precision=jax.lax.Precision.HIGHEST) + b, zimg
  return predict, detectors.Head(w, b)


# ----------------------------------------------------------------------------- PyTorch helpers
# Shared with dinov2.py: reading state dicts, converting blocks, torch's bicubic resize.

def _read_torch(path: str, hint: str) -> dict[str, np.ndarray]:
  """torch.load(weights_only=True) -> numpy; torch is imported only here (a test extra)."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise checkpoints.CheckpointError(
        f"{path!r} is a PyTorch file and reading it needs torch (the CPU build is enough); "
        f"install torch, or use the .safetensors version of the checkpoint. {hint}".strip()
    ) from None
  if _is_torchscript(path):
    raise checkpoints.CheckpointError(
        f"{path!r} is a TorchScript archive (like OpenAI's original CLIP .pt files), not a "
        f"state dict; use the state-dict version (.safetensors/.bin). {hint}".strip())
  import pickle  # pylint: disable=g-import-not-at-top  (only for its error type)
  try:
    obj = torch.load(path, map_location="cpu", weights_only=True)
  except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as e:
    raise checkpoints.CheckpointError(
        f"Cannot read {path!r} as a PyTorch state dict ({str(e).splitlines()[0]}). "
        f"{hint}".strip()) from None
  if not isinstance(obj, Mapping):
    raise checkpoints.CheckpointError(
        f"{path!r} holds a {type(obj).__name__}, not a state dict. {hint}".strip())
  out = {}
  for k, v in obj.items():
    if isinstance(v, Mapping):
      out.update({f"{k}.{kk}": vv for kk, vv in _tensors_to_numpy(v).items()})
    elif hasattr(v, "numpy"):
      out[k] = _tensor_to_numpy(v)
  return out


def _tensors_to_numpy(d: Mapping) -> dict[str, np.ndarray]:
  return {k: _tensor_to_numpy(v) for k, v in d.items() if hasattr(v, "numpy")}


def _tensor_to_numpy(v) -> np.ndarray:
  import torch  # pylint: disable=g-import-not-at-top
  v = v.detach().cpu()
  if v.dtype == torch.bfloat16:
    v = v.to(torch.float32)
  return v.numpy()


def _is_torchscript(path: str) -> bool:
  import zipfile  # pylint: disable=g-import-not-at-top
  if not zipfile.is_zipfile(path):
    return False
  with zipfile.ZipFile(path) as z:
    return any(n.split("/", 1)[-1].startswith("code/") for n in z.namelist()[:200])


def read_state_dict(path: str, hint: str = "") -> dict[str, np.ndarray]:
  """A PyTorch state dict as {key: numpy array}: .safetensors (numpy only) or
  .pt/.pth/.bin (torch.load(weights_only=True)); unwraps 'state_dict'/'model' and a
  'module.' prefix."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"Checkpoint {path!r} does not exist. {hint}".strip())
  if path.endswith(".safetensors"):
    sd = checkpoints.load_safetensors(path, hint)
  elif path.endswith((".pt", ".pth", ".bin")):
    sd = _read_torch(path, hint)
  else:
    raise checkpoints.CheckpointError(
        f"Checkpoint {path!r}: unknown file type; expected .safetensors, .pt, .pth or .bin. "
        f"{hint}".strip())
  for wrapper in ("state_dict", "model"):
    if sd and all(k.startswith(wrapper + ".") for k in sd):
      sd = {k[len(wrapper) + 1:]: v for k, v in sd.items()}
  if sd and all(k.startswith("module.") for k in sd):
    sd = {k[len("module."):]: v for k, v in sd.items()}
  if not sd:
    raise checkpoints.CheckpointError(f"Checkpoint {path!r} holds no tensors. {hint}".strip())
  return sd


# torch sub-key of a block -> flax sub-path (None: special handling). CLIP and DINOv2 naming.
CLIP_BLOCK_NAMES = {"ln_1": "LayerNorm_0", "ln_2": "LayerNorm_1", "attn.in_proj": "qkv",
                    "attn.out_proj": "out", "mlp.c_fc": "MlpBlock_0/Dense_0",
                    "mlp.c_proj": "MlpBlock_0/Dense_1", "ls_1": "LayerScale_0",
                    "ls_2": "LayerScale_1"}
_MHA = "MultiHeadDotProductAttention_0"


def convert_block(sub: str, v: np.ndarray, num_heads: int, names: Mapping[str, str]
                  ) -> Optional[dict[str, np.ndarray]]:
  """One torch transformer-block tensor -> {flax sub-path: array} for vit.Encoder1DBlock;
  None for a tensor the block does not have or whose width `num_heads` does not divide."""
  module, _, leaf = sub.rpartition(".")
  if leaf in ("in_proj_weight", "in_proj_bias"):       # nn.MultiheadAttention fused qkv
    module, leaf = f"{module}.in_proj", leaf[len("in_proj_"):]
  target = names.get(module)
  if target is None or leaf not in ("weight", "bias", "gamma"):
    return None
  if target == "qkv":
    if v.shape[0] % (3 * num_heads):
      return None
    parts = np.split(v, 3, axis=0)
    if leaf == "weight":
      return {f"{_MHA}/{n}/kernel": p.T.reshape(p.shape[1], num_heads, -1)
              for n, p in zip(("query", "key", "value"), parts)}
    return {f"{_MHA}/{n}/bias": p.reshape(num_heads, -1)
            for n, p in zip(("query", "key", "value"), parts)}
  if target == "out":
    if leaf == "bias":
      return {f"{_MHA}/out/bias": v}
    if v.shape[1] % num_heads:
      return None
    return {f"{_MHA}/out/kernel": v.T.reshape(num_heads, -1, v.shape[0])}
  if target.startswith("LayerScale"):
    return {f"{target}/scale": v}
  if target.startswith("LayerNorm"):
    return {f"{target}/{'scale' if leaf == 'weight' else 'bias'}": v}
  return {f"{target}/{'kernel' if leaf == 'weight' else 'bias'}": v.T if leaf == "weight" else v}


def heads_of(encoder_params: Mapping[str, Any]) -> int:
  """Number of attention heads of an encoder's init params (scanned or unrolled)."""
  for path, v in checkpoints.flatten(encoder_params).items():
    if path.endswith(f"{_MHA}/query/bias"):
      return int(v.shape[-2])
  raise ValueError("No attention blocks in the init params of this encoder.")


def _adopt_posemb(init_params, path: str, loaded: np.ndarray, source: str, hint: str):
  """Init tree whose posemb leaf (1, 1 + grid, C) takes the checkpoint's square grid: the
  models resize posembs to the input's patch grid per call."""
  flat = checkpoints.flatten(init_params)
  init = flat[path]            # an array or a jax.ShapeDtypeStruct (from jax.eval_shape)
  if loaded.ndim != 3 or loaded.shape[2] != init.shape[2]:
    return init_params          # a different model: merge_params reports the shape mismatch
  n = loaded.shape[1] - 1
  if n < 1 or int(round(np.sqrt(n))) ** 2 != n:
    raise checkpoints.CheckpointError(
        f"{source}: {path!r} has shape {loaded.shape} in the checkpoint but the model expects "
        f"(1, 1 + a square grid, {init.shape[2]}); check the model config. {hint}.")
  flat[path] = jax.ShapeDtypeStruct(loaded.shape, init.dtype)
  return checkpoints.recover_tree(flat)


def merge_torch(init_params, flat: Mapping[str, np.ndarray], source: str, hint: str,
                dont_load: Sequence[str] = (), posemb: Optional[str] = None) -> dict:
  """Converted (unrolled) arrays onto the init tree: stacks blocks where the model is scanned
  (`scan=True`), lets the `posemb` leaf follow the checkpoint's grid, then
  checkpoints.merge_params (casts to the init dtypes, one clear error on any mismatch)."""
  tree = checkpoints.recover_tree(dict(flat))
  if posemb and posemb in flat:
    init_params = _adopt_posemb(init_params, posemb, np.asarray(flat[posemb]), source, hint)

  def restack(loaded, init):    # every encoder subtree to the init's scan layout
    for k, v in init.items():
      if isinstance(v, Mapping) and isinstance(loaded.get(k), Mapping):
        loaded[k] = checkpoints.match_scan(loaded[k], v)
        restack(loaded[k], v)
  restack(tree, init_params)
  return checkpoints.merge_params(tree, init_params, dont_load, source=source, hint=hint)


def posemb_param(module: nn.Module, shape: Sequence[int], std: float) -> jax.Array:
  """`pos_embedding` param of `shape` at init; afterwards whatever grid was loaded (the
  checkpoint's), since `resize_posemb` adapts it to the input per call."""
  if module.has_variable("params", "pos_embedding"):
    shape = module.get_variable("params", "pos_embedding").shape
  return module.param("pos_embedding", nn.initializers.normal(std), tuple(shape), jnp.float32)


def _cubic(x: np.ndarray, a: float) -> np.ndarray:
  x = np.abs(x)
  return np.where(x <= 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                  np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.))


def bicubic_matrix(n_in: int, n_out: int, antialias: bool,
                   scale_factor: Optional[float] = None) -> np.ndarray:
  """(n_out, n_in) weights of torch's F.interpolate(mode='bicubic', align_corners=False).

  Without antialias: Keys cubic a=-0.75, taps clamped at the border. With antialias: the
  Pillow-style filter torch uses (a=-0.5, support widened by the downscale factor, weights
  renormalised over in-range taps). `scale_factor` (as passed to F.interpolate) replaces
  n_out/n_in in the coordinate mapping, as torch does when it is given.
  """
  scale = 1.0 / scale_factor if scale_factor else n_in / n_out
  w = np.zeros((n_out, n_in))
  if not antialias:
    for i in range(n_out):
      src = scale * (i + 0.5) - 0.5
      i0 = int(np.floor(src))
      t = src - i0
      for tap, wt in zip(range(i0 - 1, i0 + 3), _cubic(np.array([t + 1, t, 1 - t, 2 - t]), -0.75)):
        w[i, min(max(tap, 0), n_in - 1)] += wt
    return w
  support = 2.0 * scale if scale >= 1.0 else 2.0
  invscale = 1.0 / scale if scale >= 1.0 else 1.0
  for i in range(n_out):
    center = scale * (i + 0.5)
    lo = max(int(center - support + 0.5), 0)
    hi = min(int(center + support + 0.5), n_in)
    taps = np.arange(lo, hi)
    wt = _cubic((taps - center + 0.5) * invscale, -0.5)
    total = wt.sum()
    w[i, lo:hi] = wt / total if total != 0 else wt
  return w


def resize_grid(grid: jax.Array, out_hw: Sequence[int], antialias: bool,
                scale_factor: Optional[Sequence[float]] = None) -> jax.Array:
  """Bicubic resize of a (H, W, C) grid, numerically as torch's F.interpolate."""
  h, w = grid.shape[:2]
  sf = scale_factor or (None, None)
  rh = bicubic_matrix(h, out_hw[0], antialias, sf[0])
  rw = bicubic_matrix(w, out_hw[1], antialias, sf[1])
  return jnp.einsum("yh,xw,hwc->yxc", jnp.asarray(rh, grid.dtype), jnp.asarray(rw, grid.dtype),
                    grid, precision=jax.lax.Precision.HIGHEST)


def resize_posemb(pos: jax.Array, grid_hw: Sequence[int], antialias: bool = True,
                  prefix: int = 1, offset: float = 0.0) -> jax.Array:
  """(1, prefix + M*M, C) posemb -> (1, prefix + h*w, C) for a (h, w) patch grid.

  Identity when the grid already matches. `offset` > 0 reproduces DINOv2's
  `interpolate_offset` (F.interpolate with scale_factor=(h + offset) / M)."""
  h, w = grid_hw
  n = pos.shape[1] - prefix
  m = int(round(np.sqrt(n)))
  if m * m != n:
    raise ValueError(f"Position embedding with {n} patch entries is not a square grid.")
  if (h, w) == (m, m):
    return pos
  sf = ((h + offset) / m, (w + offset) / m) if offset else None
  grid = resize_grid(pos[0, prefix:].reshape(m, m, -1), (h, w), antialias, sf)
  return jnp.concatenate([pos[:, :prefix], grid.reshape(1, h * w, -1)], axis=1)
