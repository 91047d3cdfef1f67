"""Zero-shot classifier heads of image-text models (SigLIP two towers, CLIP), as big_vision's
evaluator builds them, and the predictor `fi_jax.run` uses for such models.

Every (class name, template) text is embedded (`text_embedder`), the L2-normalised embeddings
of a class are averaged and re-normalised; the head is `w = scale * E.T` ([D, C]), `b = bias`
([C]), so for a normalised image embedding z the logits are `z @ w + b` (SigLIP: scale =
exp(t), bias = b; CLIP: scale = exp(logit_scale), bias = 0). Class names / templates are
canonicalised like big_vision's prompt_engineering (lower case, '_' -> ' ', punctuation
removed except ',' in names and '{}' in templates, whitespace collapsed).
"""
from __future__ import annotations

import re
import string
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.common import progress
from fi_jax.common.outputs import Head
from fi_jax.data import class_names
from fi_jax.models import _predictor, vit
from fi_jax.models.text import clip_tokenizer, tokenizers

EmbedFn = Callable[[list[str]], np.ndarray]
_PUNCT = str.maketrans("", "", string.punctuation)


def canonicalize(text: str, keep: str = "") -> str:
  """big_vision's _canonicalize: '_'->' ', punctuation removed (the exact string `keep`
  survives), lower case, whitespace collapsed and stripped."""
  text = text.replace("_", " ")
  parts = text.split(keep) if keep else [text]
  text = keep.join(p.translate(_PUNCT) for p in parts)
  return re.sub(r"\s+", " ", text.lower()).strip()


def templates_by_name(name: Union[str, Sequence[str]]) -> list[str]:
  """'clip_paper' (81), 'clip_best' (8), 'class_name_only' (1), or a list of templates."""
  if not isinstance(name, str):
    return list(name)
  if name not in class_names.PROMPT_TEMPLATES:
    raise ValueError(f"Unknown prompt templates {name!r}; known: {sorted(class_names.PROMPT_TEMPLATES)} "
                     "or pass a list of '{}' templates.")
  return list(class_names.PROMPT_TEMPLATES[name])


def openai_templates() -> list[str]:
  """The 80 prompt templates of OpenAI's ImageNet notebook (big_vision's 'clip_paper' less
  its extra bare '{}')."""
  return [t for t in templates_by_name("clip_paper") if t != "{}"]


def class_prompts(class_names: Optional[Sequence[str]] = None,
                  templates: Union[str, Sequence[str]] = "clip_paper", *,
                  canonicalize_text: bool = True, first_class_name_only: bool = False) -> list[list[str]]:
  """[C][T] prompt texts (ImageNet-1k CLIP names by default)."""
  names = list(class_names.IMAGENET_CLASS_NAMES if class_names is None else class_names)
  temps = templates_by_name(templates)
  if canonicalize_text:
    names = [canonicalize(n, keep=",") for n in names]
    temps = [canonicalize(t, keep="{}") for t in temps]
  if first_class_name_only:
    names = [n.split(",")[0] for n in names]
  bad = [t for t in temps if "{}" not in t]
  if bad:
    raise ValueError(f"Prompt template {bad[0]!r} has no '{{}}' for the class name.")
  return [[t.format(n) for t in temps] for n in names]


def class_embeddings(embed_fn: EmbedFn, class_names: Optional[Sequence[str]] = None,
                     templates: Union[str, Sequence[str]] = "clip_paper", *, batch_size: int = 1024,
                     **prompt_kw) -> np.ndarray:
  """[C, D] float32: per class, the re-normalised mean of its normalised prompt embeddings."""
  prompts = class_prompts(class_names, templates, **prompt_kw)
  flat = [p for ps in prompts for p in ps]
  bar, chunks = progress.bar(len(flat), "zero-shot head", unit="prompt"), []
  for i in range(0, len(flat), batch_size):
    chunks.append(np.asarray(embed_fn(flat[i:i + batch_size]), np.float64))
    bar.update(len(flat[i:i + batch_size]))
  bar.close()
  emb = vit.l2_normalize(np.concatenate(chunks)).reshape(len(prompts), len(prompts[0]), -1)
  return vit.l2_normalize(emb.mean(axis=1)).astype(np.float32)


def head_arrays(embed_fn: EmbedFn, class_names: Optional[Sequence[str]] = None,
                templates: Union[str, Sequence[str]] = "clip_paper", *, scale: float = 1.0,
                bias: float = 0.0, **kw) -> tuple[np.ndarray, np.ndarray]:
  """(w [D, C], b [C]) float32 numpy arrays of the zero-shot head."""
  emb = class_embeddings(embed_fn, class_names, templates, **kw)
  w = (scale * emb.T).astype(np.float32)
  return w, np.full((emb.shape[0],), bias, np.float32)


def accuracy(zimg: np.ndarray, head: Any, labels: np.ndarray) -> float:
  """Top-1 accuracy of argmax(zimg @ w + b); `head` is a Head, a (w, b) pair or w [D, C].
  `labels`: [N] ints, or multi-hot [N, C] (a hit if the argmax is any positive, like ReaL)."""
  if hasattr(head, "w"):
    w, b = head.w, head.b
  elif isinstance(head, tuple):
    w, b = head
  else:
    w, b = head, 0.0
  pred = np.argmax(np.asarray(zimg, np.float64) @ np.asarray(w, np.float64) + np.asarray(b), axis=-1)
  labels = np.asarray(labels)
  if labels.ndim == 2:
    return float(np.mean(labels[np.arange(len(pred)), pred] > 0))
  return float(np.mean(pred == labels))


# ----------------------------------------------------------------------------- text towers

def text_embedder(model, params: Mapping[str, Any], tokenizer: Callable[[Sequence[str]], np.ndarray],
                  batch_size: int = 256, pad: str = "pow2") -> Callable[[Sequence[str]], np.ndarray]:
  """texts -> [N, E] float32 normalised text embeddings of a two-tower model (SigLIP, CLIP:
  `model.apply({'params': p}, None, tokens)[1]`), jitted in batches of `batch_size` texts.

  A short last batch is padded to `batch_size` (pad="batch") or to the next power of two
  below it (pad="pow2": fewer rows, still few compiled shapes). XLA:CPU's results for a row
  can differ in the last bit with the batch's row count, so each family keeps the padding its
  numbers were validated with (CLIP "batch", SigLIP "pow2").
  """
  if pad not in ("batch", "pow2"):
    raise ValueError(f"pad must be 'batch' or 'pow2', got {pad!r}.")
  txt_params = {k: v for k, v in params.items() if k != "img"}

  @jax.jit
  def embed(p, tokens):
    return model.apply({"params": p}, None, tokens)[1]

  def fn(texts: Sequence[str]) -> np.ndarray:
    outs = []
    for i in range(0, len(texts), batch_size):
      chunk = list(texts[i:i + batch_size])
      tokens = tokenizer(chunk)
      size = batch_size if pad == "batch" else min(batch_size, 1 << max(0, (len(chunk) - 1).bit_length()))
      tokens = np.pad(tokens, [(0, size - len(chunk)), (0, 0)])
      outs.append(np.asarray(embed(txt_params, tokens))[:len(chunk)])
    return np.concatenate(outs).astype(np.float32)
  return fn


_SIGLIP_TOKENIZER_HELP = (
    "Two-tower models need config.zero_shot.tokenizer: the SentencePiece model file "
    "(SigLIP: gs://t5-data/vocabs/cc_en.32000/sentencepiece.model, i18n: "
    "gs://t5-data/vocabs/mc4.250000.100extra/sentencepiece.model, SigLIP 2: "
    "gs://big_vision/gemma_tokenizer.model), downloaded to a local path.")


def predictor(model, params: Mapping[str, Any], config, family: str) -> tuple[Callable, Head]:
  """The pipeline's predictor of a two-tower model: images -> (zero-shot logits, normalised
  image embedding), and its `Head`: w = exp(t) * class_embeddings.T, b = the model's bias `b`
  (0 without one), i.e. the model's own image-text logits.

  `config.zero_shot` (all optional unless said): class_names (default ImageNet-1k CLIP names),
  templates, batch_size (256), canonicalize_text, first_class_name_only, and per family:
    "siglip": tokenizer (required: SentencePiece model path), tokenizer_kind ("siglip" |
      "siglip_i18n" | "siglip2"); templates default "clip_paper", canonicalize_text True.
    "clip": vocab_path (CLIP BPE file; default: open_clip's copy); templates default OpenAI's
      80, canonicalize_text False (CLIP's own protocol keeps prompts verbatim).
  """
  zs = dict(config.get("zero_shot", None) or {})
  if family == "siglip":
    path, kind = zs.pop("tokenizer", None), zs.pop("tokenizer_kind", "siglip")
    if not path:
      raise ValueError(_SIGLIP_TOKENIZER_HELP)
    seq_len = int(np.shape(params["txt"]["pos_embedding"])[1])
    tok, pad = tokenizers.get_tokenizer(kind, path, max_len=seq_len), "pow2"
    templates = zs.pop("templates", None) or "clip_paper"
    precision = None
  elif family == "clip":
    tok, pad = clip_tokenizer.Tokenizer(zs.pop("vocab_path", None)), "batch"
    zs.setdefault("canonicalize_text", False)
    templates = zs.pop("templates", None) or openai_templates()
    precision = jax.lax.Precision.HIGHEST
  else:
    raise ValueError(f"Unknown zero-shot family {family!r}; use 'siglip' or 'clip'.")
  embed = text_embedder(model, params, tok, int(zs.pop("batch_size", 256)), pad)
  scale = float(np.exp(np.asarray(jax.device_get(params["t"])).reshape(-1)[0]))
  bias = float(np.asarray(params["b"]).reshape(-1)[0]) if "b" in params else 0.0
  w, b = head_arrays(embed, zs.pop("class_names", None), templates, scale=scale, bias=bias, **zs)
  w, b = jnp.asarray(w, jnp.float32), jnp.asarray(b, jnp.float32)

  def predict(p, images):
    zimg, _, _ = model.apply({"params": p}, images)
    return jnp.dot(zimg, w, precision=precision) + b, zimg

  def predict_out(p, images):   # for layer detectors (fi_jax.extract.layer_columns): also the model's out
    zimg, _, out = model.apply({"params": p}, images)
    return jnp.dot(zimg, w, precision=precision) + b, zimg, out
  return _predictor.with_out(predict, predict_out), Head(w, b)
