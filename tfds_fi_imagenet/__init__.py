"""TFDS builders for Fi-ImageNet-1k and the other ImageNet-1k OOD test sets.

Importing this package registers the builders `fi_imagenet_1k`, `ninco`, `ssb_hard`,
`inaturalist_ood`, `openimage_o`, `textures_ood`, `imagenet_o`, `sun_ood`, `places_ood`,
`reimagenet_noclass` and `imagenet_es` with TFDS, so that
`tfds.builder(name, data_dir=...)` finds them. It imports tensorflow_datasets (about
0.6 s) but not TensorFlow, and importing it again, or importing a builder module
directly, never registers a name twice (Python caches the modules).

Build: `python -m tfds_fi_imagenet build NAME --manual_dir=DIR --data_dir=DIR`
(see README.md); read: `tfds.load(NAME, data_dir=DIR, download=False)`.
"""
import os as _os

_os.environ.setdefault("NO_GCE_CHECK", "true")

# importing the builders registers them with TFDS
from tfds_fi_imagenet.build import DATASETS, build_dataset
from tfds_fi_imagenet.fi_imagenet_1k import fi_imagenet_1k_dataset_builder  # noqa: F401
from tfds_fi_imagenet.imagenet_es import imagenet_es_dataset_builder  # noqa: F401
from tfds_fi_imagenet.imagenet_o import imagenet_o_dataset_builder  # noqa: F401
from tfds_fi_imagenet.inaturalist_ood import inaturalist_ood_dataset_builder  # noqa: F401
from tfds_fi_imagenet.ninco import ninco_dataset_builder  # noqa: F401
from tfds_fi_imagenet.openimage_o import openimage_o_dataset_builder  # noqa: F401
from tfds_fi_imagenet.places_ood import places_ood_dataset_builder  # noqa: F401
from tfds_fi_imagenet.reimagenet_noclass import reimagenet_noclass_dataset_builder  # noqa: F401
from tfds_fi_imagenet.ssb_hard import ssb_hard_dataset_builder  # noqa: F401
from tfds_fi_imagenet.subsets import (
  per_class_available,
  per_class_subset,
  per_class_subset_counts,
)
from tfds_fi_imagenet.sun_ood import sun_ood_dataset_builder  # noqa: F401
from tfds_fi_imagenet.textures_ood import textures_ood_dataset_builder  # noqa: F401

__all__ = ["DATASETS", "build_dataset", "per_class_available", "per_class_subset",
           "per_class_subset_counts"]
