"""sun_ood: the MOS SUN OOD subset (10,000 scene images of 50 ImageNet-disjoint concepts)."""
from __future__ import annotations

import tensorflow_datasets as tfds

from tfds_fi_imagenet import downloads, mos

ARCHIVE = downloads.Archive(url=mos.BASE_URL + "SUN.tar.gz", filename="SUN.tar.gz",
                            md5="8469c3ada62211477954ec1be53b12d0")


class Builder(mos.MosBuilder):
  """SUN OOD set of Huang & Li (MOS, CVPR 2021): SUN397 images of 50 nature concepts that
  do not overlap ImageNet-1k, archive layout `SUN/images/sun_<id>.jpg`.

  `file_name` is `sun/images/<file>`. The archive's file names carry no SUN397 category:
  `ood_class` is '' (`ood_class_id` -1) unless the manual dir also holds MOS's
  `sun_selected_list.txt` (deeplearning-wisc/large_scale_ood, data_lists/; lines
  `<letter>/<category>/<file> <index>`), whose category (e.g. `waterfall/block`) then becomes
  the class of each listed file. Builder kwargs: `expected` (key 'test'), `verify_md5`
  (default True).
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  ARCHIVE = ARCHIVE
  LIST_DIR = "sun"
  CLASS_LIST = "sun_selected_list.txt"
  COUNTS = {"test": 10_000}
  MANUAL_DOWNLOAD_INSTRUCTIONS = mos.manual_note(ARCHIVE)
