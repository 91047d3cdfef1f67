"""ssb_hard: Semantic Shift Benchmark ImageNet 'Hard' split, OpenOOD v1.5 near-OOD."""
from __future__ import annotations

import tensorflow_datasets as tfds

from tfds_fi_imagenet import openood


class Builder(openood.OpenOodBuilder):
  """SSB-hard (Vaze et al., ICLR 2022): 980 ImageNet-21K-P classes x 50 images.

  `file_name` is OpenOOD's list path `ssb_hard/<wnid>/<wnid>_<n>.JPEG`; `ood_class` the
  WordNet id. Builder kwarg: `expected` (keys 'test', 'classes').
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  SET_DIR = "ssb_hard"
  LISTS = {"test": "test_ssb_hard.txt"}
  COUNTS = {"test": 49_000, "classes": 980}
  CLASS_FROM_FOLDER = True
  MANUAL_DOWNLOAD_INSTRUCTIONS = openood.manual_instructions(SET_DIR, LISTS)
