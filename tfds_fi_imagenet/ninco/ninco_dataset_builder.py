"""ninco: NINCO OOD classes, OOD unit tests and popular-dataset subsamples (Zenodo)."""
from __future__ import annotations

import dataclasses
from typing import Iterator

import tensorflow_datasets as tfds
from etils import epath

from tfds_fi_imagenet import archives, builder, downloads, images, mos, ood_classes

# Published MD5 of NINCO_all.tar.gz (as used by the pytorch-ood NINCO loader); TFDS's
# checksums.tsv needs a SHA-256 that is not published: record it with --register_checksums.
ARCHIVE = downloads.Archive(url="https://zenodo.org/record/8013288/files/NINCO_all.tar.gz",
                            filename="NINCO_all.tar.gz", md5="b9ffae324363cd900a81ce3c367cd834")
URL, MD5 = ARCHIVE.url, ARCHIVE.md5


@dataclasses.dataclass
class NincoConfig(tfds.core.BuilderConfig):
  folder: str = ""          # top-level folder of the archive
  num_images: int = 0       # published count
  num_classes: int = 0


class Builder(builder.OodBuilder):
  """NINCO (Bitterwolf et al., ICML 2023); one config per top-level folder.

  Builder kwargs: `expected` (keys 'test', 'classes'), `verify_md5` (default True).
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = [
      NincoConfig(name="ood_classes", folder="NINCO_OOD_classes", num_images=5879,
                  num_classes=64,
                  description="The 64 hand-cleaned NINCO OOD classes (5,879 images)."),
      NincoConfig(name="unit_tests", folder="NINCO_OOD_unit_tests", num_images=6800,
                  num_classes=17,
                  description="17 synthetic OOD unit tests x 400 images."),
      NincoConfig(name="popular_subsamples", folder="NINCO_popular_datasets_subsamples",
                  num_images=2715, num_classes=11,
                  description="Cleaned subsamples of 11 popular OOD test sets."),
  ]
  DEFAULT_BUILDER_CONFIG_NAME = "ood_classes"
  MANUAL_DOWNLOAD_INSTRUCTIONS = mos.manual_note(ARCHIVE)

  def __init__(self, *, verify_md5: bool = True, **kwargs):
    super().__init__(**kwargs)
    self._original_state["verify_md5"] = verify_md5
    self.verify_md5 = verify_md5

  def archives(self) -> list[downloads.Archive]:
    return [ARCHIVE]

  def default_expected(self) -> dict[str, int]:
    return {"test": self.builder_config.num_images,
            "classes": self.builder_config.num_classes}

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=builder.ood_features(),
        homepage="https://github.com/j-cb/NINCO",
        disable_shuffling=True,  # stored in sorted file_name order
        metadata=tfds.core.MetadataDict(),
        license="MIT (annotations); images keep their source datasets' terms",
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    archive = downloads.fetch(self, dl_manager, ARCHIVE, verify_md5=self.verify_md5)
    extracted = epath.Path(dl_manager.extract(
        tfds.download.Resource(path=archive, extract_method=tfds.download.ExtractMethod.TAR_GZ)))
    folder = self.builder_config.folder
    root = archives.find_dir(extracted, folder)
    if root is None:
      raise FileNotFoundError(f"ninco: no folder {folder}/ in the extracted archive "
                              f"{extracted}; is it NINCO_all.tar.gz?")
    reader = archives.ImageArchive(root)
    names = [n for n in reader.names() if "/" in n]  # <class>/<file>
    classes, lookup = ood_classes.class_ids(n.split("/", 1)[0] for n in names)
    self.check_count("test", len(names), f"{folder}/")
    self.check_count("classes", len(classes), f"{folder}/")
    self.info.metadata["ood_class_names"] = classes
    return {"test": self._generate_examples(reader, names, lookup)}

  def _generate_examples(self, reader: archives.ImageArchive, names: list[str],
                         lookup: dict[str, int]) -> Iterator[tuple[int, dict]]:
    folder = self.builder_config.folder
    for key, name in enumerate(names):
      cls = name.split("/", 1)[0]
      yield key, {
          "image": images.checked_image(reader.read(name), f"{folder}/{name}"),
          "file_name": f"{folder}/{name}",
          "ood_class": cls,
          "ood_class_id": lookup[cls],
      }
