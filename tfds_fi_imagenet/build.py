"""Building the datasets of this package through TFDS's Python API (no apache-beam)."""
from __future__ import annotations

import inspect
import os
from typing import Mapping, Optional

os.environ.setdefault("NO_GCE_CHECK", "true")  # TF's GCS auth: never probe the GCE metadata server

import tensorflow_datasets as tfds

from tfds_fi_imagenet import builder as builder_lib
from tfds_fi_imagenet import downloads, errors, imagenet2012_train

# name -> whether the builder reads a manual dir (False: it downloads with checksums).
DATASETS = {
    "fi_imagenet_1k": True,
    "ninco": False,
    "ssb_hard": True,
    "inaturalist_ood": False,
    "openimage_o": True,
    "textures_ood": False,
    "imagenet_o": False,
    "sun_ood": False,
    "places_ood": False,
    "reimagenet_noclass": True,   # val tar + the user's ReImageNet reannotation.jsonl
    "imagenet_es": True,   # the authors' ImageNet-ES archive (TFDS has no builder for it)
    "imagenet2012": True,   # train split only, from ILSVRC2012_img_train.tar (imagenet2012_train.py)
}


def builder_class(name: str) -> type:
  """The registered builder class of one of DATASETS (the package's __init__, which runs
  before this module is imported, registers them)."""
  if name not in DATASETS:
    raise errors.UsageError(f"Unknown dataset {name!r}; this package builds: "
                            f"{', '.join(sorted(DATASETS))}.")
  if name == "imagenet2012":   # TFDS's own dataset, prepared from the train tar alone
    return imagenet2012_train.ImagenetTrainBuilder
  return tfds.builder_cls(name)


def build_dataset(name: str, *, data_dir: str, manual_dir: Optional[str] = None,
                  config: Optional[str] = None, download_dir: Optional[str] = None,
                  expected: Optional[Mapping[str, int]] = None,
                  file_format: Optional[str] = None, register_checksums: bool = False,
                  verify_md5: bool = True) -> tfds.core.DatasetBuilder:
  """Prepares `name` (optionally `config`) into data_dir and returns its builder.

  A downloading builder takes its archive from `manual_dir` when it is there (checked against
  the recorded checksum); when it must download and the host does not answer within seconds,
  FileNotFoundError names the files to fetch (downloads.require_network).
  After this, `tfds.load(name, data_dir=data_dir, download=False)` reads it. `expected`
  overrides the published split sizes (see OodBuilder in builder.py); `verify_md5` applies to
  the builders that check a published MD5 of their download (ninco, inaturalist_ood).
  """
  cls = builder_class(name)
  needs_manual = DATASETS[name]
  if needs_manual:
    if not manual_dir:
      raise FileNotFoundError(f"{name} needs --manual_dir: {cls.MANUAL_DOWNLOAD_INSTRUCTIONS}")
    if not os.path.isdir(manual_dir):
      raise FileNotFoundError(f"Manual dir {manual_dir} does not exist; it must hold the "
                              f"files of {name}.")
  kwargs = {}
  if expected is not None:
    kwargs["expected"] = dict(expected)
  if not verify_md5:
    if "verify_md5" not in inspect.signature(cls.__init__).parameters:
      raise errors.UsageError(f"{name} has no MD5 check to skip.")
    kwargs["verify_md5"] = False
  if config is not None and config not in cls.builder_configs:
    raise errors.UsageError(f"{name} has no config {config!r}; configs: "
                            f"{', '.join(cls.builder_configs) or 'none'}.")
  builder = cls(data_dir=data_dir, config=config, file_format=file_format, **kwargs)
  if isinstance(builder, builder_lib.OodBuilder) and not builder.is_prepared():
    # without network, one line naming the files to fetch instead of minutes of retries
    downloads.require_network(
        builder, builder.archives(), manual_dir=manual_dir,
        download_dir=download_dir or os.path.join(str(builder.data_dir_root), "downloads"))
  download_config = tfds.download.DownloadConfig(
      manual_dir=manual_dir, register_checksums=register_checksums, try_download_gcs=False)
  builder.download_and_prepare(download_dir=download_dir, download_config=download_config)
  return builder
