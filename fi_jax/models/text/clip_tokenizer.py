"""CLIP's byte-level BPE tokenizer (OpenAI CLIP / OpenCLIP), without torch.

`Tokenizer(vocab_path)(texts)` -> int32 array [N, 77]: `<start_of_text>` (49406), the BPE ids
of the cleaned, lower-cased text, `<end_of_text>` (49407), zero padding. Texts longer than the
context are cut and their last id forced to EOT (open_clip's behaviour). The CLIP text tower
pools the EOT position via argmax over ids, so this layout matters.

The vocabulary is OpenAI's `bpe_simple_vocab_16e6.txt.gz` (merge list, ~1.3 MB), which fi_jax
does not ship: pass its path, or let `default_vocab_path` find the copy bundled with an
installed `open_clip` package. Download:
https://github.com/openai/CLIP/raw/main/clip/bpe_simple_vocab_16e6.txt.gz

Text cleaning follows open_clip's default ('lower'): `ftfy.fix_text` when ftfy is installed
(it fixes mojibake, curly quotes, ligatures, full-width forms; without it only NFC
normalisation is applied, so such texts may tokenise differently), HTML unescape twice,
whitespace collapsed, lower-cased. Pre-tokenisation reproduces open_clip's regex
(special tokens | 's 't 're 've 'm 'll 'd | letter runs | one digit | runs of other
non-space characters) with `unicodedata` categories, so the `regex` package is not needed.
"""
from __future__ import annotations

import functools
import gzip
import html
import importlib.util
import os
import unicodedata
import warnings
from typing import Iterable, Optional, Sequence, Union

import numpy as np

VOCAB_FILE = "bpe_simple_vocab_16e6.txt.gz"
VOCAB_URL = "https://github.com/openai/CLIP/raw/main/clip/bpe_simple_vocab_16e6.txt.gz"
CONTEXT_LENGTH = 77
SOT, EOT = "<start_of_text>", "<end_of_text>"
_NUM_MERGES = 49152 - 256 - 2          # merge lines used by CLIP (the file has a header line)
_CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")   # order of the reference regex


def default_vocab_path() -> str:
  """Vocab from $FI_JAX_CLIP_BPE, else the copy inside an installed open_clip package."""
  env = os.environ.get("FI_JAX_CLIP_BPE")
  if env:
    return env
  spec = importlib.util.find_spec("open_clip")
  if spec is not None and spec.origin:
    path = os.path.join(os.path.dirname(spec.origin), VOCAB_FILE)
    if os.path.exists(path):
      return path
  raise FileNotFoundError(
      f"No CLIP BPE vocabulary found. Download {VOCAB_URL} and pass its path "
      "(Tokenizer(vocab_path=...), or set FI_JAX_CLIP_BPE).")


@functools.lru_cache(maxsize=None)
def byte_to_unicode() -> dict[int, str]:
  """GPT-2/CLIP reversible map bytes -> printable unicode characters.

  Printable Latin-1 bytes map to themselves; the other 68 bytes map to chr(256 + n) in
  increasing byte order, so no byte becomes whitespace or a control character.
  """
  keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
  table = {b: chr(b) for b in keep}
  extra = [b for b in range(256) if b not in table]
  table.update({b: chr(256 + n) for n, b in enumerate(extra)})
  return table


def _fix_text(text: str) -> str:
  try:
    import ftfy
  except ImportError:
    _warn_no_ftfy()
    return unicodedata.normalize("NFC", text)
  return ftfy.fix_text(text)


@functools.lru_cache(maxsize=None)
def _warn_no_ftfy() -> None:
  warnings.warn("ftfy is not installed: CLIP texts are only NFC-normalised, so mojibake, curly "
                "quotes or ligatures may tokenise differently from open_clip.")


def clean(text: str, lower: bool = True) -> str:
  """open_clip's 'lower' cleaning: ftfy, HTML unescape (twice), collapse whitespace, lower."""
  text = html.unescape(html.unescape(_fix_text(text))).strip()
  text = " ".join(text.split())
  return text.lower() if lower else text


def _kind(ch: str) -> str:
  """'L' letter, 'N' number, ' ' white space, 'P' anything else (as regex \\p{L}, \\p{N}, \\s)."""
  if ch.isspace():
    return " "
  cat = unicodedata.category(ch)[0]
  return cat if cat in ("L", "N") else "P"


def pre_tokenize(text: str, specials: Sequence[str] = (SOT, EOT)) -> list[str]:
  """Splits cleaned text into the pieces the BPE runs on (CLIP's regex, first match wins)."""
  pieces, i, n = [], 0, len(text)
  while i < n:
    special = next((s for s in specials if text.startswith(s, i)), None)
    if special is not None:
      pieces.append(special)
      i += len(special)
      continue
    contraction = next((c for c in _CONTRACTIONS if text[i:i + len(c)].lower() == c), None)
    if contraction is not None:
      pieces.append(text[i:i + len(contraction)])
      i += len(contraction)
      continue
    kind = _kind(text[i])
    if kind == " ":
      i += 1
      continue
    if kind == "N":   # digits are single pieces
      pieces.append(text[i])
      i += 1
      continue
    j = i + 1
    while j < n and _kind(text[j]) == kind:
      j += 1
    pieces.append(text[i:j])
    i = j
  return pieces


def _merge_pair(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
  """Replaces every non-overlapping occurrence of `pair` (left to right) by its concatenation."""
  out, i = [], 0
  while i < len(word):
    if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
      out.append(word[i] + word[i + 1])
      i += 2
    else:
      out.append(word[i])
      i += 1
  return tuple(out)


class Tokenizer:
  """CLIP BPE tokenizer; `tok(texts)` -> int32 [N, context_length] (see module docstring)."""

  def __init__(self, vocab_path: Optional[str] = None, context_length: int = CONTEXT_LENGTH,
               lower: bool = True):
    vocab_path = vocab_path or default_vocab_path()
    if not os.path.exists(vocab_path):
      raise FileNotFoundError(f"CLIP BPE vocabulary {vocab_path!r} does not exist; download "
                              f"{VOCAB_URL}.")
    try:
      with gzip.open(vocab_path, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    except (OSError, UnicodeDecodeError) as e:
      raise ValueError(f"{vocab_path!r} is not CLIP's gzipped BPE merge list ({e}); download "
                       f"{VOCAB_URL}.") from None
    merges = [tuple(line.split()) for line in lines[1:_NUM_MERGES + 1]]
    if len(merges) != _NUM_MERGES or any(len(m) != 2 for m in merges):
      raise ValueError(f"{vocab_path!r} is not CLIP's BPE merge list (expected {_NUM_MERGES} "
                       f"merge pairs); download {VOCAB_URL}.")
    chars = list(byte_to_unicode().values())
    vocab = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges] + [SOT, EOT]
    self.encoder = {t: i for i, t in enumerate(vocab)}
    self.decoder = dict(enumerate(vocab))
    self.ranks = {m: i for i, m in enumerate(merges)}
    self.sot_id, self.eot_id = self.encoder[SOT], self.encoder[EOT]
    self.vocab_size = len(vocab)
    self.context_length = context_length
    self.lower = lower
    self._cache: dict[str, tuple[str, ...]] = {SOT: (SOT,), EOT: (EOT,)}

  def bpe(self, piece: str) -> tuple[str, ...]:
    """Byte-unicode piece -> BPE symbols; the last symbol carries the '</w>' end marker."""
    if piece in self._cache:
      return self._cache[piece]
    word = (*piece[:-1], piece[-1] + "</w>")
    while len(word) > 1:
      pairs = set(zip(word[:-1], word[1:]))
      best = min(pairs, key=lambda p: self.ranks.get(p, np.inf))
      if best not in self.ranks:
        break
      word = _merge_pair(word, best)
    self._cache[piece] = word
    return word

  def encode(self, text: str) -> list[int]:
    """Ids of one text, without SOT/EOT and without truncation."""
    b2u = byte_to_unicode()
    ids = []
    for piece in pre_tokenize(clean(text, self.lower)):
      if piece not in (SOT, EOT):
        piece = "".join(b2u[b] for b in piece.encode("utf-8"))
      ids.extend(self.encoder[s] for s in self.bpe(piece))
    return ids

  def decode(self, ids: Iterable[int]) -> str:
    """Ids -> text: stops at the first EOT, skips SOT; word ends become spaces."""
    u2b = {u: b for b, u in byte_to_unicode().items()}
    data = bytearray()
    for i in map(int, ids):
      if i == self.eot_id:
        break
      if i == self.sot_id:
        continue
      sym = self.decoder[i]
      end = sym.endswith("</w>")
      data.extend(u2b[c] for c in (sym[:-4] if end else sym))
      if end:
        data.extend(b" ")
    return data.decode("utf-8", errors="replace").strip()

  def __call__(self, texts: Union[str, Sequence[str]],
               context_length: Optional[int] = None) -> np.ndarray:
    """Texts -> int32 [N, context_length]; too long texts are cut and end with EOT."""
    if isinstance(texts, str):
      texts = [texts]
    length = context_length or self.context_length
    out = np.zeros((len(texts), length), np.int32)
    for row, text in enumerate(texts):
      ids = [self.sot_id, *self.encode(text), self.eot_id]
      if len(ids) > length:
        ids = ids[:length]
        ids[-1] = self.eot_id
      out[row, :len(ids)] = ids
    return out
