"""The word corpus of the negative-label detectors (NegLabel, CSP): WordNet 3.0's noun and
adjective synsets, one label per synset, shipped as `fi_jax/data/wordnet/wordnet30_labels.txt.xz`
with WordNet's licence beside it (`fi_jax/data/wordnet/LICENSE`); docs/detectors.md#neglabel.

File format (UTF-8 text, xz-compressed): a line `# <lexicographer file>` (`noun.artifact`,
`adj.all`, ...) starts a section; every other line is one label of that section. Sections come
in WordNet's lexicographer-file order (nouns, then adjectives), labels in the order of their
synsets in WordNet's data file.

The recipe (`build`, `python -m fi_jax.data.wordnet_labels DICT_DIR OUT`) reads a WordNet 3.0
`dict` folder (`data.noun`, `data.adj`: Debian's `wordnet-base` package puts them in
/usr/share/wordnet; nltk's `wordnet` corpus holds the same files): for every synset its first
word, `_` -> space, adjective markers `(a)`, `(p)`, `(ip)` removed, lower case (the official
NegLabel word lists are lower case); a label repeated within one section is kept once.
"""
from __future__ import annotations

import lzma
import os
import sys
from typing import Optional, Sequence

WORDS_FILE = os.path.join(os.path.dirname(__file__), "wordnet", "wordnet30_labels.txt.xz")
# bounds on what `load` reads: the shipped file is ~0.4 MB compressed, ~1.6 MB of text
MAX_COMPRESSED_BYTES = 8 << 20
MAX_TEXT_BYTES = 32 << 20

# WordNet's lexicographer files (lexnames(5WN)) by number, nouns and adjectives only
LEXFILES = {0: "adj.all", 1: "adj.pert", 3: "noun.Tops", 4: "noun.act", 5: "noun.animal",
            6: "noun.artifact", 7: "noun.attribute", 8: "noun.body", 9: "noun.cognition",
            10: "noun.communication", 11: "noun.event", 12: "noun.feeling", 13: "noun.food",
            14: "noun.group", 15: "noun.location", 16: "noun.motive", 17: "noun.object",
            18: "noun.person", 19: "noun.phenomenon", 20: "noun.plant", 21: "noun.possession",
            22: "noun.process", 23: "noun.quantity", 24: "noun.relation", 25: "noun.shape",
            26: "noun.state", 27: "noun.substance", 28: "noun.time", 44: "adj.ppl"}
_ADJ_MARKERS = ("(a)", "(p)", "(ip)")


def _order(name: str) -> tuple:
  return (not name.startswith("noun."), next(k for k, v in LEXFILES.items() if v == name))


def build(dict_dir: str) -> list[tuple[str, str]]:
  """[(lexicographer file, label)] of every noun and adjective synset of the WordNet `dict`
  folder `dict_dir`, in the shipped file's order."""
  sections: dict[str, list[str]] = {}
  for pos in ("noun", "adj"):
    with open(os.path.join(dict_dir, f"data.{pos}"), encoding="latin-1") as f:
      for line in f:
        if line.startswith("  "):          # the licence header
          continue
        fields = line.split(" ")
        lex, word = LEXFILES[int(fields[1])], fields[4]
        for m in _ADJ_MARKERS:
          if word.endswith(m):
            word = word[:-len(m)]
        sections.setdefault(lex, []).append(word.replace("_", " ").lower())
  out = []
  for lex in sorted(sections, key=_order):
    seen = set()
    for w in sections[lex]:
      if w not in seen:
        seen.add(w)
        out.append((lex, w))
  return out


def dumps(rows: Sequence[tuple[str, str]]) -> str:
  lines, current = [], None
  for lex, word in rows:
    if lex != current:
      lines.append(f"# {lex}")
      current = lex
    lines.append(word)
  return "\n".join(lines) + "\n"


def parse(text: str, where: str = "word list") -> list[tuple[str, str]]:
  """[(section, label)] of the file format above; a label before any section is an error."""
  rows, current = [], None
  for i, line in enumerate(text.splitlines(), 1):
    if line.startswith("# "):
      current = line[2:].strip()
    elif line.strip():
      if current is None:
        raise ValueError(f"{where}: line {i} ({line!r}) comes before any '# <section>' line.")
      rows.append((current, line.strip()))
  return rows


def load(path: Optional[str] = None) -> list[tuple[str, str]]:
  """[(lexicographer file, label)] of the shipped list (or of `path`, in the same format:
  `.xz` compressed or plain text). Reads at most MAX_COMPRESSED_BYTES of the file and
  MAX_TEXT_BYTES of text; a larger file is an error."""
  path = path or WORDS_FILE
  with open(path, "rb") as f:
    data = f.read(MAX_COMPRESSED_BYTES + 1)
  if len(data) > MAX_COMPRESSED_BYTES:
    raise ValueError(f"{path}: larger than {MAX_COMPRESSED_BYTES} bytes; a word list is a few "
                     "hundred kB.")
  if path.endswith(".xz"):
    dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    try:
      data = dec.decompress(data, max_length=MAX_TEXT_BYTES + 1)
    except lzma.LZMAError as e:
      raise ValueError(f"{path}: not a valid .xz file ({e}).") from None
    if len(data) > MAX_TEXT_BYTES or not dec.eof:
      raise ValueError(f"{path}: decompresses to more than {MAX_TEXT_BYTES} bytes (or is "
                       "truncated); a word list is a few MB of text.")
  elif len(data) > MAX_TEXT_BYTES:
    raise ValueError(f"{path}: larger than {MAX_TEXT_BYTES} bytes of text.")
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError:
    raise ValueError(f"{path}: not UTF-8 text.") from None
  return parse(text, path)


def main(argv: Sequence[str]) -> None:
  if len(argv) != 2:
    raise SystemExit("usage: python -m fi_jax.data.wordnet_labels WORDNET_DICT_DIR OUT.txt.xz")
  rows = build(argv[0])
  with lzma.open(argv[1], "wt", encoding="utf-8", preset=9 | lzma.PRESET_EXTREME) as f:
    f.write(dumps(rows))
  print(f"{len(rows)} labels -> {argv[1]}")


if __name__ == "__main__":
  main(sys.argv[1:])
