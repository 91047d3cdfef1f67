"""SentencePiece tokenizers with big_vision's text conventions (SigLIP, SigLIP 2).

big_vision tokenises SigLIP text with `tokenize(max_len, model="c4_en"|"mc4", eos="sticky",
pad_value=1)` and SigLIP 2 text with `lower|tok(length=64, model="gemma", bos="no",
eos="sticky")`. Both lower-case with `tf.strings.lower`, which only maps ASCII A-Z (so "É"
stays "É"); we do the same. "sticky" EOS: append EOS; a sequence that is too long keeps its
first max_len-1 tokens and ends in EOS; shorter ones are padded with `pad_value` (SigLIP: 1 =
T5's EOS, so "last" pooling always reads an EOS; SigLIP 2: the tokenizer's pad id, 0 for Gemma).

The model files are downloaded by the user (nothing is fetched here); see `KNOWN_MODELS`.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence, Union

import numpy as np

KNOWN_MODELS = {  # big_vision's names for the SentencePiece model files (facts).
    "c4_en": "gs://t5-data/vocabs/cc_en.32000/sentencepiece.model",
    "mc4": "gs://t5-data/vocabs/mc4.250000.100extra/sentencepiece.model",
    "gemma": "gs://big_vision/gemma_tokenizer.model",
}

# kind: (big_vision model name, pad value: int, or None for the tokenizer's own pad id)
KINDS = {
    "siglip": ("c4_en", 1),
    "siglip_i18n": ("mc4", 1),
    "siglip2": ("gemma", None),
}

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(text: str) -> str:
  """tf.strings.lower semantics: only ASCII letters are lower-cased."""
  return text.translate(_ASCII_LOWER)


def _download_hint(model: Optional[str]) -> str:
  if model in KNOWN_MODELS:
    url = KNOWN_MODELS[model]
    return f"Download it with `gsutil cp {url} .` and pass the local path."
  return "Known models: " + ", ".join(f"{k}: {v}" for k, v in KNOWN_MODELS.items()) + "."


class SentencePieceTokenizer:
  """texts -> int32 [N, max_len] token ids, big_vision style (see module docstring)."""

  def __init__(self, model_file: str, *, max_len: int, lower: bool = True, eos: str = "sticky",
               add_bos: bool = False, pad_value: Optional[int] = None, model_name: Optional[str] = None):
    import sentencepiece
    if eos not in ("none", "yes", "sticky"):
      raise ValueError(f"eos must be 'none', 'yes' or 'sticky', got {eos!r}.")
    if max_len < 1:
      raise ValueError(f"max_len must be positive, got {max_len}.")
    if not os.path.isfile(model_file):
      raise FileNotFoundError(f"SentencePiece model {model_file!r} does not exist. {_download_hint(model_name)}")
    self.sp = sentencepiece.SentencePieceProcessor()
    try:
      self.sp.Load(model_file)
    except (OSError, RuntimeError) as e:
      raise ValueError(f"{model_file!r} is not a SentencePiece model ({e}). {_download_hint(model_name)}") from e
    self.max_len, self.lower, self.eos, self.add_bos = max_len, lower, eos, add_bos
    self.pad_value = self.sp.pad_id() if pad_value is None else int(pad_value)
    if self.pad_value < 0:
      raise ValueError(f"{model_file!r} defines no pad id; pass pad_value explicitly.")
    if eos != "none" and self.sp.eos_id() < 0:
      raise ValueError(f"{model_file!r} defines no EOS id but eos={eos!r} needs one.")

  @property
  def vocab_size(self) -> int:
    return self.sp.GetPieceSize()

  @property
  def eos_id(self) -> int:
    return self.sp.eos_id()

  def encode(self, text: str) -> list[int]:
    """Token ids of one text, before truncation / padding (EOS / BOS added per config)."""
    if self.lower:
      text = ascii_lower(text)
    ids = list(self.sp.EncodeAsIds(text))
    if self.add_bos:
      ids = [self.sp.bos_id()] + ids
    if self.eos != "none":
      ids.append(self.sp.eos_id())
    return ids

  def fit(self, ids: Sequence[int]) -> list[int]:
    """Truncate (keeping the final EOS when sticky) or pad to max_len."""
    n = self.max_len
    if len(ids) >= n:
      return list(ids[:n - 1]) + [ids[-1]] if self.eos == "sticky" else list(ids[:n])
    return list(ids) + [self.pad_value] * (n - len(ids))

  def __call__(self, texts: Union[str, Sequence[str]]) -> np.ndarray:
    if isinstance(texts, str):
      texts = [texts]
    return np.asarray([self.fit(self.encode(t)) for t in texts], np.int32).reshape(-1, self.max_len)


def get_tokenizer(kind: str, model_file: str, max_len: int = 64) -> SentencePieceTokenizer:
  """The tokenizer of a model family: 'siglip' (c4_en, pad 1), 'siglip_i18n' (mc4, pad 1),
  'siglip2' (Gemma, pad 0); all lower-case, no BOS, sticky EOS."""
  if kind not in KINDS:
    raise ValueError(f"Unknown tokenizer kind {kind!r}; known: {sorted(KINDS)}.")
  model_name, pad = KINDS[kind]
  return SentencePieceTokenizer(model_file, max_len=max_len, lower=True, eos="sticky",
                                pad_value=pad, model_name=model_name)
