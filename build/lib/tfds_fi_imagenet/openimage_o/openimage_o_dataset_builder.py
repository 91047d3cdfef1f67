"""openimage_o: OpenImage-O (ViM), OpenOOD v1.5's far-OOD test set and its OOD val set."""
from __future__ import annotations

import tensorflow_datasets as tfds

from tfds_fi_imagenet import openood


class Builder(openood.OpenOodBuilder):
  """OpenImage-O (Wang et al., CVPR 2022): 17,632 Open Images test images, split by OpenOOD.

  Splits `test` (test_openimage_o.txt, 15,869) and `validation` (val_openimage_o.txt,
  1,763; OpenOOD's OOD validation set). `file_name` is OpenOOD's list path
  `openimage_o/images/<id>.jpg`; there are no classes (`ood_class` '', `ood_class_id` -1).
  Builder kwarg: `expected` (keys 'test', 'validation').
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  SET_DIR = "openimage_o"
  LISTS = {"test": "test_openimage_o.txt", "validation": "val_openimage_o.txt"}
  COUNTS = {"test": 15_869, "validation": 1_763}
  MANUAL_DOWNLOAD_INSTRUCTIONS = openood.manual_instructions(SET_DIR, LISTS)
