"""Two-tower image-text model (SigLIP, SigLIP 2) in big_vision's layout.

`Model(image=..., text=..., out_dim=(None, 768), bias_init=-10.)` holds an image tower `img`
(fi_jax.models.vit) and a text tower `txt` (fi_jax.models.text_transformer), the log
temperature `t` and, with `bias_init`, the bias `b`. `apply({'params': p}, images, tokens)`
returns `(zimg, ztxt, out)` with L2-normalised embeddings; either input may be None. SigLIP's
pairwise logit is `zimg @ ztxt.T * exp(t) + b`.

For the detectors `out["pre_logits"]` is the normalised image embedding, so that the zero-shot
logits are exactly `pre_logits @ head.w + head.b` (see `predictor`); the raw tower output stays
in `out["img/pre_logits"]`.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.models import checkpoints as ckpt
from fi_jax.models import text_transformer
from fi_jax.models import vit

# --------------------------------------------------------------------------- released checkpoints
# name: (file, image variant, resolution, text variant, embedding dim or None, text length,
#        vocab size, tokenizer kind). Facts from big_vision's SigLIP / SigLIP 2 demos and README.
_SIGLIP = "gs://big_vision/siglip/"
_SIGLIP2 = "gs://big_vision/siglip2/"
_RELEASE_TABLE = {
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
  _RELEASE_TABLE[f"siglip2_b16_{_res}"] = (f"{_SIGLIP2}siglip2_b16_{_res}.npz", "B/16", _res, "B", 768, 64, 256_000, "siglip2")
for _res in (256, 384, 512):
  _RELEASE_TABLE[f"siglip2_l16_{_res}"] = (f"{_SIGLIP2}siglip2_l16_{_res}.npz", "L/16", _res, "L", 1024, 64, 256_000, "siglip2")
  _RELEASE_TABLE[f"siglip2_so400m16_{_res}"] = (f"{_SIGLIP2}siglip2_so400m16_{_res}.npz", "So400m/16", _res, "So400m", 1152, 64, 256_000, "siglip2")
for _res in (224, 384):
  _RELEASE_TABLE[f"siglip2_so400m14_{_res}"] = (f"{_SIGLIP2}siglip2_so400m14_{_res}.npz", "So400m/14", _res, "So400m", 1152, 64, 256_000, "siglip2")
for _res in (256, 384):  # g-opt image tower with a So400m text tower (text head 1152 -> 1536)
  _RELEASE_TABLE[f"siglip2_g-opt16_{_res}"] = (f"{_SIGLIP2}siglip2_g-opt16_{_res}.npz", "g-opt/16", _res, "So400m", 1536, 64, 256_000, "siglip2")
_RELEASE_TABLE["siglip2_b32_256"] = (_SIGLIP2 + "siglip2_b32_256.npz", "B/32", 256, "B", 768, 64, 256_000, "siglip2")
# NaFlex towers, run here as fixed-resolution ViTs on square 256 px inputs (16x16 = 256 patches,
# the sequence length of the README numbers); `vit.from_naflex` converts them on load.
_RELEASE_TABLE["siglip2_b16_naflex"] = (_SIGLIP2 + "siglip2_b16_naflex.npz", "B/16", 256, "B", 768, 64, 256_000, "siglip2")
_RELEASE_TABLE["siglip2_so400m16_naflex"] = (_SIGLIP2 + "siglip2_so400m16_naflex.npz", "So400m/16", 256, "So400m", 1152, 64, 256_000, "siglip2")

RELEASES: dict[str, str] = {k: v[0] for k, v in _RELEASE_TABLE.items()}


def release_config(name: str, scan: bool = True) -> dict:
  """Everything a config needs for a released SigLIP / SigLIP 2 checkpoint.

  Returns dict(model=..., init_shape=..., model_init=<release name, found as its file name in
  $FI_JAX_CHECKPOINT_DIR>, url=<gs://... of the weights>, tokenizer=<tokenizers kind>,
  tokenizer_url=<gs://... of the SentencePiece model>, pp=<image pp string>). The image pp is
  big_vision's demo one: squash resize (bilinear, no antialias) to the resolution, values in
  [-1, 1].
  """
  from fi_jax.models import tokenizers  # pylint: disable=g-import-not-at-top
  if name not in _RELEASE_TABLE:
    raise ValueError(f"Unknown SigLIP release {name!r}; known: {sorted(_RELEASE_TABLE)}.")
  url, img_variant, res, txt_variant, emb, seq_len, vocab, tok = _RELEASE_TABLE[name]
  model = dict(image=dict(variant=img_variant, pool_type="map", scan=scan),
               text=dict(variant=txt_variant, vocab_size=vocab, scan=scan),
               out_dim=(None, emb), bias_init=-10.0, text_len=seq_len)
  return dict(model=model, init_shape=(1, res, res, 3), model_init=name, url=url, tokenizer=tok,
              tokenizer_url=tokenizers.KNOWN_MODELS[tokenizers.KINDS[tok][0]],
              pp=f"decode|resize({res})|value_range(-1, 1)")


# --------------------------------------------------------------------------- model

def _module(name: str):
  """'vit' / 'proj.image_text.text_transformer' (big_vision names) -> fi_jax.models module."""
  return importlib.import_module(f"fi_jax.models.{name.rsplit('.', 1)[-1]}")


def _normalize(z):
  norm = jnp.linalg.norm(z, axis=-1, keepdims=True)
  return z / (norm + 1e-8), norm


class Model(nn.Module):
  """Image tower `img`, text tower `txt`, log temperature `t`, optional bias `b`."""
  image: Optional[Mapping[str, Any]] = None
  text: Optional[Mapping[str, Any]] = None
  image_model: str = "vit"
  text_model: str = "text_transformer"
  out_dim: Any = 128
  temperature_init: float = 1.0
  bias_init: Optional[float] = None
  text_len: int = 64  # text length the text tower is initialised with (SigLIP So400m/14@224: 16)

  @nn.compact
  def __call__(self, image, text=None, *, train=False):
    out_dims = tuple(self.out_dim) if isinstance(self.out_dim, (list, tuple)) else (self.out_dim,) * 2
    if self.is_initializing() and text is None:  # init builds both towers from the images alone
      text = jnp.zeros((1, self.text_len), jnp.int32)
    out = {}
    zimg = ztxt = None
    if image is not None:
      img = _module(self.image_model).Model(num_classes=out_dims[0], **dict(self.image or {}), name="img")
      zimg, out_img = img(image, train=train)
      out.update({f"img/{k}": v for k, v in out_img.items()})
      zimg, out["img/norm"] = _normalize(zimg)
      out["img/normalized"] = out["pre_logits"] = zimg
    if text is not None:
      txt = _module(self.text_model).Model(num_classes=out_dims[1], **dict(self.text or {}), name="txt")
      ztxt, out_txt = txt(text, train=train)
      out.update({f"txt/{k}": v for k, v in out_txt.items()})
      ztxt, out["txt/norm"] = _normalize(ztxt)
      out["txt/normalized"] = ztxt
    t = self.param("t", nn.initializers.constant(np.log(self.temperature_init)), (1,), jnp.float32)
    out["t/parameter"], out["t"] = t, jnp.exp(t)
    if self.bias_init is not None:
      out["b"] = self.param("b", nn.initializers.constant(self.bias_init), (1,), jnp.float32)
    return zimg, ztxt, out


# --------------------------------------------------------------------------- loading

def from_hf_siglip(flat: Mapping[str, np.ndarray], img_heads: int, txt_heads: int,
                   source: str = "HF checkpoint", hint: str = "") -> dict:
  """HF transformers SiglipModel / Siglip2Model state dict -> big_vision two-tower tree."""
  get = vit.Tensors(flat, source, hint)
  if "vision_model.embeddings.patch_embedding.weight" not in get:
    raise ckpt.CheckpointError(
        f"{source}: not an HF SigLIP checkpoint (no 'vision_model.embeddings.patch_embedding."
        f"weight'; first keys {sorted(flat)[:4]}). {hint}".strip())
  tree = {"img": vit.from_hf_siglip_vision(flat, img_heads, "vision_model.", source, hint),
          "txt": text_transformer.from_hf_siglip_text(flat, txt_heads, "text_model.", source, hint),
          "t": get("logit_scale").reshape(1)}
  if "logit_bias" in get:
    tree["b"] = get("logit_bias").reshape(1)
  return tree


def _load_tree(path: str, init_params: Mapping[str, Any]) -> tuple[dict, str, str]:
  """(two-tower tree, file, hint) of an npz (params/ prefix optional) or HF safetensors."""
  path, hint = vit.resolve_vanity(path, RELEASES)
  file, _ = ckpt.split_subkey(path)
  if ckpt.is_safetensors(file):
    tree = from_hf_siglip(ckpt.load_safetensors(file, hint), vit.num_heads_of(init_params["img"]),
                          vit.num_heads_of(init_params["txt"]), file, hint)
  else:
    tree = ckpt.load_params(path, hint)
  return tree, file, hint


def load(init_params: Mapping[str, Any], init_files: Any, model_cfg: Optional[Mapping] = None,
         img_load_kw: Optional[Mapping] = None, txt_load_kw: Optional[Mapping] = None,
         dont_load: Sequence[str] = ()) -> dict:
  """Loads SigLIP / SigLIP 2 weights onto `init_params`.

  `init_files`: one file (big_vision `.npz`, with or without `params/`, scanned or unrolled,
  bfloat16 or not; an HF `model.safetensors`; or a release name such as "siglip2_b16_224",
  looked up in $FI_JAX_CHECKPOINT_DIR), or a dict {"img": file, "txt": file[, "t": file, "b": file]}
  as in big_vision. Towers are converted to the init's scan layout and the image posemb is
  resampled to the init resolution. `dont_load` (and `img_load_kw` / `txt_load_kw`
  "dont_load" lists, relative to their tower) name params kept from init.
  """
  del model_cfg
  img_kw, txt_kw = dict(img_load_kw or {}), dict(txt_load_kw or {})
  skip = list(dont_load) + [f"img/{p}" for p in img_kw.pop("dont_load", ())] + [
      f"txt/{p}" for p in txt_kw.pop("dont_load", ())]
  if img_kw or txt_kw:
    raise ValueError(f"Unsupported load kwargs {sorted(img_kw) + sorted(txt_kw)}; only 'dont_load'.")
  if isinstance(init_files, str):
    tree, source, hint = _load_tree(init_files, init_params)
  else:
    files = dict(init_files)
    unknown = set(files) - {"img", "txt", "t", "b"}
    if unknown:
      raise ValueError(f"init_files keys must be among img, txt, t, b; got {sorted(unknown)}.")
    tree, source, hint = {}, ", ".join(f"{k}={v}" for k, v in files.items()), ""
    for part, path in files.items():
      sub, _, hint = _load_tree(path, init_params)
      if isinstance(sub, dict) and part in sub and ("img" in sub or "txt" in sub):
        sub = sub[part]  # a whole two-tower file given for one part
      tree[part] = sub
  tree = dict(tree)
  if "img" in tree and "img" in init_params:
    tree["img"] = vit.prepare(dict(tree["img"]), init_params["img"])
  if "txt" in tree and "txt" in init_params:
    tree["txt"] = text_transformer.prepare(dict(tree["txt"]), init_params["txt"])
  for k in ("t", "b"):
    if k in tree:
      tree[k] = np.asarray(tree[k]).reshape(-1)
  return ckpt.merge_params(tree, init_params, skip, source=source, hint=hint)


# --------------------------------------------------------------------------- text / zero-shot

def text_embedder(model: Model, params: Mapping[str, Any], tokenizer: Callable[[Sequence[str]], np.ndarray],
                  batch_size: int = 256) -> Callable[[Sequence[str]], np.ndarray]:
  """texts -> [N, D] normalised text embeddings (jitted text tower, fixed batch shape)."""
  txt_params = {k: v for k, v in params.items() if k != "img"}

  @jax.jit
  def embed(p, tokens):
    return model.apply({"params": p}, None, tokens)[1]

  def fn(texts: Sequence[str]) -> np.ndarray:
    outs = []
    for i in range(0, len(texts), batch_size):
      chunk = list(texts[i:i + batch_size])
      tokens = tokenizer(chunk)
      # Pad to batch_size (or the next power of two below it) so few shapes get compiled.
      size = min(batch_size, 1 << max(0, (len(chunk) - 1).bit_length()))
      tokens = np.pad(tokens, [(0, size - len(chunk)), (0, 0)])
      outs.append(np.asarray(embed(txt_params, tokens))[:len(chunk)])
    return np.concatenate(outs).astype(np.float32)
  return fn


def predictor(model: Model, params: Mapping[str, Any], config) -> tuple[Callable, Any]:
  """The pipeline's predictor: images -> (zero-shot logits, normalised image embedding).

  Reads `config.zero_shot` = dict(tokenizer=<sentencepiece .model path>, tokenizer_kind=
  "siglip" | "siglip_i18n" | "siglip2", templates="clip_paper", class_names=None (ImageNet-1k),
  batch_size=256). The head is `exp(t) * class_embeddings.T` with bias `b`, i.e. SigLIP's own
  logits; detectors get `(logits, out["pre_logits"])`.
  """
  from fi_jax.models import tokenizers, zero_shot  # pylint: disable=g-import-not-at-top
  zs = dict(config.get("zero_shot") or {})
  if not zs.get("tokenizer"):
    raise ValueError(
        "Two-tower models need config.zero_shot.tokenizer: the SentencePiece model file "
        "(SigLIP: gs://t5-data/vocabs/cc_en.32000/sentencepiece.model, i18n: "
        "gs://t5-data/vocabs/mc4.250000.100extra/sentencepiece.model, SigLIP 2: "
        "gs://big_vision/gemma_tokenizer.model), downloaded to a local path.")
  seq_len = int(np.shape(params["txt"]["pos_embedding"])[1])
  tok = tokenizers.get_tokenizer(zs.get("tokenizer_kind", "siglip"), zs["tokenizer"], max_len=seq_len)
  embed_fn = text_embedder(model, params, tok, int(zs.get("batch_size", 256)))
  scale = float(np.exp(np.asarray(params["t"]).reshape(-1)[0]))
  bias = float(np.asarray(params["b"]).reshape(-1)[0]) if "b" in params else 0.0
  head = zero_shot.zero_shot_head(embed_fn, zs.get("class_names"), zs.get("templates", "clip_paper"),
                                  scale=scale, bias=bias)
  w, b = jnp.asarray(head.w, jnp.float32), jnp.asarray(head.b, jnp.float32)

  def predict(p, images):
    zimg, _, out = model.apply({"params": p}, images)
    return zimg @ w + b, out["pre_logits"]
  return predict, head
