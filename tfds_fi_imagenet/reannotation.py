"""ReImageNet's `reannotation.jsonl` (Hugging Face `vrg-prague/ReImageNet`, Volkov et al.):
the multi-label reannotation of the 50,000 ImageNet-1k validation images.

The file is gated and its licence forbids redistribution: it is never bundled; the user puts
their copy in a manual dir (or names its path). What is known publicly (the dataset card): JSON
Lines, one record per validation image, matched to the image by `file_path`
(`n01440764/ILSVRC2012_val_00000293.JPEG`: the original class folder and the file name), with
per-image bounding boxes, their class labels and annotation attributes; some images get no
ImageNet-1k class. The names of the label and attribute fields are NOT public (the file is
gated), so this reader ASSUMES the following and says so in its errors:

- an image's labels are the first of: a top-level list `labels` / `classes` / `class_labels`
  / `label`, else the `label` / `class` / `class_id` / `wnid` / `category` of every entry of a
  top-level list `boxes` / `bboxes` / `objects` / `annotations`;
- a label is an ImageNet-1k WordNet id (`n01440764`), an ImageNet-1k label index 0..999 (TFDS
  `imagenet2012` order, an int or a digit string), or anything else (a class outside
  ImageNet-1k: kept as text in `other_labels`, not an ImageNet label);
- an image is ambiguous when the record has a truthy top-level `ambiguous` / `is_ambiguous`,
  or a box entry has a truthy `ambiguous` / `is_ambiguous` or lists "ambiguous" in its
  `attributes` (a list, or a dict with a truthy "ambiguous").

`label_field` ("labels", or "boxes.label" for a field of the box entries) and
`ambiguous_field` (same forms) override the guesses once the real names are known. Every
problem (a line that is not a JSON object, a missing or malformed `file_path`, a duplicate
image, a `file_path` whose class folder is not the image's ImageNet label, no label field
anywhere) is a `ReannotationError` naming the file and the line.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Iterable, Mapping, Optional

from etils import epath

from tfds_fi_imagenet import imagenet_val

FILE_NAME = "reannotation.jsonl"
_FILE_PATH_RE = re.compile(r"^(?:.*/)?(n\d{8})/(ILSVRC2012_val_(\d{8})\.JPEG)$")
_LABEL_LISTS = ("labels", "classes", "class_labels", "label")
_BOX_LISTS = ("boxes", "bboxes", "objects", "annotations")
_BOX_LABELS = ("label", "class", "class_id", "wnid", "category")
_AMBIGUOUS = ("ambiguous", "is_ambiguous")
_WNID_RE = re.compile(r"^n\d{8}$")


class ReannotationError(ValueError):
  """A reannotation.jsonl that cannot be read as this module assumes (see the module doc)."""


@dataclasses.dataclass(frozen=True)
class Reannotation:
  """One validation image's reannotation."""
  val_id: int                   # 1..50,000 (ILSVRC2012_val_<8 digits>)
  labels: tuple[int, ...]       # ImageNet-1k label indices, ascending, distinct; () = no class
  other_labels: tuple[str, ...]  # labels outside ImageNet-1k, as given
  ambiguous: bool


def _truthy_attr(entry: Mapping) -> bool:
  if any(entry.get(k) for k in _AMBIGUOUS):
    return True
  attrs = entry.get("attributes")
  if isinstance(attrs, Mapping):
    return bool(attrs.get("ambiguous"))
  if isinstance(attrs, (list, tuple)):
    return "ambiguous" in attrs
  return False


def _field(record: Mapping, path: str) -> Optional[list]:
  """The values at `path` ("name" or "list.name") of a record, or None when absent."""
  head, _, tail = path.partition(".")
  if head not in record:
    return None
  value = record[head]
  if not tail:
    return value if isinstance(value, list) else [value]
  if not isinstance(value, list):
    return None
  return [e.get(tail) for e in value if isinstance(e, Mapping) and e.get(tail) is not None]


def _raw_labels(record: Mapping, label_field: Optional[str]) -> Optional[list]:
  if label_field:
    return _field(record, label_field)
  for key in _LABEL_LISTS:
    if key in record and (isinstance(record[key], list) or key == "label"):
      return _field(record, key)
  for key in _BOX_LISTS:
    if isinstance(record.get(key), list):
      return [e.get(k) for e in record[key] if isinstance(e, Mapping)
              for k in _BOX_LABELS if e.get(k) is not None][:10_000]
  return None


def _ambiguous(record: Mapping, ambiguous_field: Optional[str]) -> bool:
  if ambiguous_field:
    return any(bool(v) for v in (_field(record, ambiguous_field) or []))
  if any(record.get(k) for k in _AMBIGUOUS):
    return True
  return any(_truthy_attr(e) for key in _BOX_LISTS if isinstance(record.get(key), list)
             for e in record[key] if isinstance(e, Mapping))


def read(path: epath.PathLike, *, label_field: Optional[str] = None,
         ambiguous_field: Optional[str] = None) -> dict[int, Reannotation]:
  """{validation id: Reannotation} of every record of `path` (checked; module doc)."""
  path = epath.Path(path)
  if not path.exists():
    raise FileNotFoundError(f"{path}: no such file. Download reannotation.jsonl from Hugging "
                            "Face vrg-prague/ReImageNet (gated: accept its terms) and put it "
                            "there; it may not be redistributed, so fi_jax does not ship it.")
  index = {w: i for i, w in enumerate(imagenet_val.label_names_file().read_text().split())}
  val_wnids = imagenet_val.validation_wnids()
  out: dict[int, Reannotation] = {}
  any_labels = False
  first_keys: list[str] = []
  with path.open("r", encoding="utf-8") as f:
    for line_no, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path} line {line_no}"
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ReannotationError(f"{where}: not JSON ({e.msg}); reannotation.jsonl has one JSON "
                                "object per line.") from None
      if not isinstance(record, dict):
        raise ReannotationError(f"{where}: a JSON {type(record).__name__}, not an object.")
      first_keys = first_keys or sorted(record)
      fp = record.get("file_path")
      m = _FILE_PATH_RE.match(fp) if isinstance(fp, str) else None
      if m is None:
        raise ReannotationError(f"{where}: 'file_path' is {fp!r}, not "
                                "'<wnid>/ILSVRC2012_val_<8 digits>.JPEG'.")
      val_id = int(m.group(3))
      if not 1 <= val_id <= imagenet_val.NUM_VAL:
        raise ReannotationError(f"{where}: {m.group(2)} is not an ImageNet validation image.")
      if val_wnids[val_id - 1] != m.group(1):
        raise ReannotationError(
            f"{where}: {fp} puts {m.group(2)} in class folder {m.group(1)}, but its ImageNet "
            f"label is {val_wnids[val_id - 1]}: this is not ReImageNet's reannotation.jsonl.")
      if val_id in out:
        raise ReannotationError(f"{where}: {m.group(2)} appears twice.")
      raw = _raw_labels(record, label_field)
      any_labels |= raw is not None
      labels, other = set(), []
      for v in raw or []:
        if isinstance(v, bool):
          other.append(str(v))
        elif isinstance(v, int) or (isinstance(v, str) and v.isdigit()):
          if not 0 <= int(v) < 1000:
            raise ReannotationError(f"{where}: label {v!r} is outside 0..999.")
          labels.add(int(v))
        elif isinstance(v, str) and _WNID_RE.match(v) and v in index:
          labels.add(index[v])
        else:
          other.append(str(v))
      out[val_id] = Reannotation(val_id, tuple(sorted(labels)), tuple(other),
                                 _ambiguous(record, ambiguous_field))
  if not out:
    raise ReannotationError(f"{path}: no records.")
  if not any_labels:
    raise ReannotationError(
        f"{path}: no record has a label field this reader knows ({'/'.join(_LABEL_LISTS)}, or "
        f"{'/'.join(_BOX_LABELS)} in {'/'.join(_BOX_LISTS)}); the first record's fields are "
        f"{first_keys}. Name the field with label_field='<name>' or '<list>.<name>'.")
  return out


def label_sets(reannotations: Mapping[int, Reannotation],
               file_names: Iterable[str]) -> list[tuple[int, ...]]:
  """The ImageNet-1k label set of each image named in `file_names` (any string holding
  `ILSVRC2012_val_<8 digits>`), in that order; every image must have a record."""
  out, missing = [], []
  for name in file_names:
    m = imagenet_val.VAL_ID_RE.search(name)
    rec = reannotations.get(int(m.group(1))) if m else None
    if rec is None:
      missing.append(name)
      out.append(())
    else:
      out.append(rec.labels)
  if missing:
    raise ReannotationError(f"{len(missing)} image(s) have no reannotation record (first: "
                            f"{missing[:3]}); the file must cover the whole validation set.")
  return out

