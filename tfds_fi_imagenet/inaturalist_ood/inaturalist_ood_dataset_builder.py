"""inaturalist_ood: the MOS iNaturalist OOD subset (10,000 plant images), OpenOOD far-OOD."""
from __future__ import annotations

from typing import Iterator

import tensorflow_datasets as tfds
from etils import epath

from tfds_fi_imagenet import archives, builder, images

URL = "http://pages.cs.wisc.edu/~huangrui/imagenet_ood_dataset/iNaturalist.tar.gz"
# Published MD5 of iNaturalist.tar.gz (as used by the pytorch-ood MOS loader); the SHA-256
# for checksums.tsv is not published: record it with --register_checksums.
MD5 = "5be6ea8aa027d7b631916427b32cb335"
NUM_IMAGES = 10_000


class Builder(builder.OodBuilder):
  """iNaturalist OOD set of Huang & Li (MOS, CVPR 2021), used as is by OpenOOD v1.5.

  `file_name` is OpenOOD's list path `inaturalist/images/<name>.jpg`. The archive carries
  no species names, so `ood_class` is '' and `ood_class_id` -1.
  Builder kwargs: `expected` (key 'test'), `verify_md5` (default True).
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}

  def __init__(self, *, verify_md5: bool = True, **kwargs):
    super().__init__(**kwargs)
    self._original_state["verify_md5"] = verify_md5
    self.verify_md5 = verify_md5

  def default_expected(self) -> dict[str, int]:
    return {"test": NUM_IMAGES}

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=builder.ood_features(),
        homepage="https://github.com/deeplearning-wisc/large_scale_ood",
        disable_shuffling=True,  # stored in sorted file_name order
        metadata=tfds.core.MetadataDict(),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    archive = epath.Path(dl_manager.download(URL))
    if self.verify_md5:
      images.verify_md5(archive, MD5, "iNaturalist.tar.gz")
    extracted = epath.Path(dl_manager.extract(
        tfds.download.Resource(path=archive, extract_method=tfds.download.ExtractMethod.TAR_GZ)))
    reader = archives.ImageArchive(extracted)
    by_base: dict[str, str] = {}
    for name in reader.names():
      if not name.lower().endswith((".jpg", ".jpeg", ".png")):
        continue
      base = name.rsplit("/", 1)[-1]
      if base in by_base:
        raise ValueError(f"inaturalist_ood: {base} appears twice in {extracted}: "
                         f"{by_base[base]} and {name}.")
      by_base[base] = name
    self.check_count("test", len(by_base), f"the images of {extracted}")
    self.info.metadata["ood_class_names"] = []
    return {"test": self._generate_examples(reader, by_base)}

  def _generate_examples(self, reader: archives.ImageArchive, by_base: dict[str, str],
                         ) -> Iterator[tuple[int, dict]]:
    for key, base in enumerate(sorted(by_base)):
      name = by_base[base]
      yield key, {
          "image": images.checked_image(reader.read(name), name),
          "file_name": f"inaturalist/images/{base}",
          "ood_class": "",
          "ood_class_id": -1,
      }
