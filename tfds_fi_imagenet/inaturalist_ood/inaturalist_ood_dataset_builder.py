"""inaturalist_ood: the MOS iNaturalist OOD subset (10,000 plant images), OpenOOD far-OOD."""
from __future__ import annotations

import tensorflow_datasets as tfds

from tfds_fi_imagenet import downloads, mos

ARCHIVE = downloads.Archive(url=mos.BASE_URL + "iNaturalist.tar.gz",
                            filename="iNaturalist.tar.gz",
                            md5="5be6ea8aa027d7b631916427b32cb335")
URL, MD5 = ARCHIVE.url, ARCHIVE.md5
NUM_IMAGES = 10_000


class Builder(mos.MosBuilder):
  """iNaturalist OOD set of Huang & Li (MOS, CVPR 2021), used as is by OpenOOD v1.5.

  `file_name` is OpenOOD's list path `inaturalist/images/<name>.jpg`. The archive carries
  no species names, so `ood_class` is '' and `ood_class_id` -1.
  Builder kwargs: `expected` (key 'test'), `verify_md5` (default True).
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  ARCHIVE = ARCHIVE
  LIST_DIR = "inaturalist"
  COUNTS = {"test": NUM_IMAGES}
  MANUAL_DOWNLOAD_INSTRUCTIONS = mos.manual_note(ARCHIVE)
