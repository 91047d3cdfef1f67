"""ImageNet-1k validation conventions and the Fi-ImageNet-1k list parser.

Labels follow TFDS `imagenet2012`: the class index is the position of the WordNet id in
TFDS's packaged `datasets/imagenet2012/labels.txt` (sorted WNIDs) and the label of
`ILSVRC2012_val_{i:08d}.JPEG` is line i of the packaged `validation_labels.txt`. Both are
read from the installed tensorflow_datasets, never copied into this repository.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Optional

import tensorflow_datasets as tfds
from etils import epath

from tfds_fi_imagenet import ood_classes

NUM_VAL = 50_000
VAL_ID_RE = re.compile(r"ILSVRC2012_val_(\d+)")
_SEPARATORS = re.compile(r"[,\t]")
_IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")


def label_names_file() -> epath.Path:
  """TFDS's labels.txt: the 1000 WordNet ids in TFDS imagenet2012 order."""
  return epath.Path(tfds.core.tfds_path("datasets/imagenet2012/labels.txt"))


@functools.lru_cache(maxsize=1)
def validation_wnids() -> tuple[str, ...]:
  """WordNet id of each validation image; entry i-1 belongs to ILSVRC2012_val_{i:08d}."""
  path = epath.Path(tfds.core.tfds_path("datasets/imagenet2012/validation_labels.txt"))
  wnids = tuple(path.read_text().split())
  if len(wnids) != NUM_VAL:
    raise ValueError(f"{path} has {len(wnids)} labels, expected {NUM_VAL}: the installed "
                     "tensorflow_datasets package is damaged.")
  return wnids


def val_file_name(val_id: int) -> str:
  return f"ILSVRC2012_val_{val_id:08d}.JPEG"


def val_id_of_member(name: str) -> Optional[int]:
  """The 1-based id of a val tar / folder image ILSVRC2012_val_<8 digits>.JPEG, else None.

  Other files (e.g. bounding-box XMLs next to the images) are ignored.

  Raises:
    ValueError: for a val-like image name whose number is not a validation image.
  """
  base = name.rsplit("/", 1)[-1]
  m = VAL_ID_RE.match(base)
  if not m or not base.lower().endswith(_IMAGE_SUFFIXES):
    return None
  digits = m.group(1)
  if len(digits) != 8 or not 1 <= int(digits) <= NUM_VAL:
    raise ValueError(f"{name!r} is not an ImageNet-1k validation image (ids run from "
                     "ILSVRC2012_val_00000001 to ILSVRC2012_val_00050000).")
  return int(digits)


@dataclasses.dataclass(frozen=True)
class ListEntry:
  """One image of a Fi-ImageNet list."""
  val_id: int        # 1 .. 50,000
  line: int          # 1-based line number in the list file
  ood_class: str     # '' when the line names no class


def parse_list(path: epath.PathLike, with_class: bool) -> list[ListEntry]:
  """Parses a Fi-ImageNet-1k list file.

  Every non-blank line that is not a `#` comment must contain one
  `ILSVRC2012_val_<8 digits>` (bare name, path or CSV/TSV row); a first line without one is
  a header and skipped. With `with_class`, the OOD class is everything after the first
  comma or tab that follows the image name (spaces and commas allowed, surrounding quotes
  removed, whitespace collapsed); no separator or nothing after it = no class.

  Raises:
    ValueError: naming the line, for a line without an image, an id that is not a
      validation image, two different images on one line, or a repeated image.
  """
  path = epath.Path(path)
  entries: list[ListEntry] = []
  first_line: dict[int, int] = {}
  seen_content = False
  for no, raw in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), start=1):
    line = raw.strip()
    if not line or line.startswith("#"):
      continue
    matches = list(VAL_ID_RE.finditer(line))
    if not matches:
      if not seen_content:  # header row
        seen_content = True
        continue
      raise ValueError(f"{path.name} line {no}: no ILSVRC2012_val_<8 digits> image name in "
                       f"{raw!r}.")
    seen_content = True
    ids = {m.group(1) for m in matches}
    if len(ids) > 1:
      raise ValueError(f"{path.name} line {no}: names {len(ids)} different images in "
                       f"{raw!r}; put one image per line.")
    m = matches[0]
    digits = m.group(1)
    if len(digits) != 8 or not 1 <= int(digits) <= NUM_VAL:
      raise ValueError(f"{path.name} line {no}: unknown image id {m.group(0)!r}; ImageNet-1k "
                       "validation ids run from ILSVRC2012_val_00000001 to "
                       "ILSVRC2012_val_00050000.")
    val_id = int(digits)
    if val_id in first_line:
      raise ValueError(f"{path.name} line {no}: duplicate image {val_file_name(val_id)} "
                       f"(first on line {first_line[val_id]}).")
    first_line[val_id] = no
    ood_class = ""
    if with_class:
      sep = _SEPARATORS.search(line, matches[-1].end())
      if sep:
        ood_class = ood_classes.normalize_class(line[sep.end():])
    entries.append(ListEntry(val_id, no, ood_class))
  return entries


def check_disjoint(a: list[ListEntry], a_name: str, b: list[ListEntry], b_name: str) -> None:
  """ValueError naming the first image (and its lines) that is in both lists."""
  lines_b = {e.val_id: e.line for e in b}
  for e in a:
    if e.val_id in lines_b:
      n = sum(x.val_id in lines_b for x in a)
      raise ValueError(f"{val_file_name(e.val_id)} is in both {a_name} (line {e.line}) and "
                       f"{b_name} (line {lines_b[e.val_id]}); the lists must be disjoint "
                       f"({n} shared image(s) in all).")
