"""Zero-shot classifier heads from a text tower, the way big_vision's evaluator builds them.

Every (class name, template) text is embedded, the L2-normalised embeddings of a class are
averaged and re-normalised; the head is `w = scale * E.T` ([D, C]), `b = bias` ([C]), so for a
normalised image embedding z the logits are `z @ w + b` (SigLIP: scale = exp(t), bias = b;
CLIP: scale = exp(logit_scale), bias = 0). Class names / templates are canonicalised like
big_vision's prompt_engineering (lower case, '_' -> ' ', punctuation removed except ',' in
names and '{}' in templates, whitespace collapsed).
"""
from __future__ import annotations

import re
import string
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from fi_jax.models import imagenet_names

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
  if name not in imagenet_names.PROMPT_TEMPLATES:
    raise ValueError(f"Unknown prompt templates {name!r}; known: {sorted(imagenet_names.PROMPT_TEMPLATES)} "
                     "or pass a list of '{}' templates.")
  return list(imagenet_names.PROMPT_TEMPLATES[name])


def class_prompts(class_names: Optional[Sequence[str]] = None,
                  templates: Union[str, Sequence[str]] = "clip_paper", *,
                  canonicalize_text: bool = True, first_class_name_only: bool = False) -> list[list[str]]:
  """[C][T] prompt texts (ImageNet-1k CLIP names by default)."""
  names = list(imagenet_names.IMAGENET_CLASS_NAMES if class_names is None else class_names)
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


def _l2(x: np.ndarray) -> np.ndarray:
  return x / (np.linalg.norm(x, axis=-1, keepdims=True) + 1e-8)


def class_embeddings(embed_fn: EmbedFn, class_names: Optional[Sequence[str]] = None,
                     templates: Union[str, Sequence[str]] = "clip_paper", *, batch_size: int = 1024,
                     **prompt_kw) -> np.ndarray:
  """[C, D] float32: per class, the re-normalised mean of its normalised prompt embeddings."""
  prompts = class_prompts(class_names, templates, **prompt_kw)
  flat = [p for ps in prompts for p in ps]
  chunks = [np.asarray(embed_fn(flat[i:i + batch_size]), np.float64)
            for i in range(0, len(flat), batch_size)]
  emb = _l2(np.concatenate(chunks)).reshape(len(prompts), len(prompts[0]), -1)
  return _l2(emb.mean(axis=1)).astype(np.float32)


def head_arrays(embed_fn: EmbedFn, class_names: Optional[Sequence[str]] = None,
                templates: Union[str, Sequence[str]] = "clip_paper", *, scale: float = 1.0,
                bias: float = 0.0, **kw) -> tuple[np.ndarray, np.ndarray]:
  """(w [D, C], b [C]) float32 numpy arrays of the zero-shot head."""
  emb = class_embeddings(embed_fn, class_names, templates, **kw)
  w = (scale * emb.T).astype(np.float32)
  return w, np.full((emb.shape[0],), bias, np.float32)


def zero_shot_head(embed_fn: EmbedFn, class_names: Optional[Sequence[str]] = None,
                   templates: Union[str, Sequence[str]] = "clip_paper", *, scale: float = 1.0,
                   bias: float = 0.0, **kw) -> Any:
  """The detectors' `fi_jax.detectors.Head(w, b)` of the zero-shot classifier."""
  from fi_jax import detectors  # pylint: disable=g-import-not-at-top
  w, b = head_arrays(embed_fn, class_names, templates, scale=scale, bias=bias, **kw)
  return detectors.Head(w, b)


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
