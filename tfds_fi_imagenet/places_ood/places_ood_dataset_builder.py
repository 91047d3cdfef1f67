"""places_ood: the MOS Places OOD subset (10,000 Places365 images of 50 concepts)."""
from __future__ import annotations

import re

import tensorflow_datasets as tfds

from tfds_fi_imagenet import downloads, mos

ARCHIVE = downloads.Archive(url=mos.BASE_URL + "Places.tar.gz", filename="Places.tar.gz",
                            md5="b5cb5eba2754ae2a28beea8718db699a")
# '<first letter>_<category>_<8 digits>.jpg', e.g. b_badlands_00000038.jpg (Places365's
# train path b/badlands/00000038.jpg flattened; '/' of sub-categories is written '_')
_NAME = re.compile(r"^([a-z])_([a-z0-9_]+)_(\d{8})\.jpe?g$", re.IGNORECASE)


class Builder(mos.MosBuilder):
  """Places OOD set of Huang & Li (MOS, CVPR 2021): Places365 images of 50 nature concepts
  that do not overlap ImageNet-1k, archive layout `Places/images/<letter>_<category>_<n>.jpg`.

  `file_name` is `places/images/<file>`; `ood_class` the Places365 category the file name
  carries (sub-categories with '_' for '/', e.g. `field_wild`), '' for a name without one;
  `ood_class_id` its index in the sorted category names. Builder kwargs: `expected` (key
  'test'), `verify_md5` (default True).
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  ARCHIVE = ARCHIVE
  LIST_DIR = "places"
  COUNTS = {"test": 10_000}
  MANUAL_DOWNLOAD_INSTRUCTIONS = mos.manual_note(ARCHIVE)

  def class_of(self, base: str) -> str:
    m = _NAME.match(base)
    if m is None or not m.group(2).lower().startswith(m.group(1).lower()):
      return ""
    return m.group(2)
