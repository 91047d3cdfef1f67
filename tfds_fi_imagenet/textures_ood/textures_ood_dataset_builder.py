"""textures_ood: OpenOOD v1.5's Textures far-OOD set, 43 DTD classes x 120 images."""
from __future__ import annotations

from typing import Iterator

import tensorflow_datasets as tfds
from etils import epath

from tfds_fi_imagenet import archives, builder, downloads, images, mos, ood_classes

# no published MD5: the SHA-256 TFDS registers for its `dtd` builder is in checksums.tsv
ARCHIVE = downloads.Archive(url="https://www.robots.ox.ac.uk/~vgg/data/dtd/download/dtd-r1.0.1.tar.gz",
                            filename="dtd-r1.0.1.tar.gz")
URL = ARCHIVE.url
# The four DTD classes that coincide with ImageNet-1k classes, left out by ViM/OpenOOD.
EXCLUDED = ("bubbly", "cobwebbed", "honeycombed", "spiralled")
NUM_IMAGES = 5160
NUM_CLASSES = 43


class Builder(builder.OodBuilder):
  """DTD minus bubbly, cobwebbed, honeycombed and spiralled: OpenOOD's test_textures list.

  `file_name` is OpenOOD's list path `texture/<class>/<class>_NNNN.jpg`; `ood_class` the
  DTD class. The DTD archive's URL, size and SHA-256 are in checksums.tsv (the values TFDS
  registers for its `dtd` builder); it may also be placed in the manual dir as
  dtd-r1.0.1.tar.gz. Builder kwargs: `expected` (keys 'test', 'classes').
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = mos.manual_note(ARCHIVE)

  def archives(self) -> list[downloads.Archive]:
    return [ARCHIVE]

  def default_expected(self) -> dict[str, int]:
    return {"test": NUM_IMAGES, "classes": NUM_CLASSES}

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=builder.ood_features(),
        homepage="https://www.robots.ox.ac.uk/~vgg/data/dtd/",
        disable_shuffling=True,  # stored in sorted file_name order
        metadata=tfds.core.MetadataDict(),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    archive = downloads.fetch(self, dl_manager, ARCHIVE)
    extracted = epath.Path(dl_manager.extract(
        tfds.download.Resource(path=archive, extract_method=tfds.download.ExtractMethod.TAR_GZ)))
    image_dir = archives.find_dir(extracted, "images")
    if image_dir is None:
      raise FileNotFoundError(f"textures_ood: no dtd/images/ folder in {extracted}; is it "
                              "dtd-r1.0.1.tar.gz?")
    reader = archives.ImageArchive(image_dir)
    names = [n for n in reader.names()
             if n.count("/") == 1 and n.lower().endswith(".jpg")
             and n.split("/", 1)[0] not in EXCLUDED]
    classes, lookup = ood_classes.class_ids(n.split("/", 1)[0] for n in names)
    self.check_count("test", len(names), f"{image_dir} without {', '.join(EXCLUDED)}")
    self.check_count("classes", len(classes), f"{image_dir} without {', '.join(EXCLUDED)}")
    self.info.metadata["ood_class_names"] = classes
    return {"test": self._generate_examples(reader, names, lookup)}

  def _generate_examples(self, reader: archives.ImageArchive, names: list[str],
                         lookup: dict[str, int]) -> Iterator[tuple[int, dict]]:
    for key, name in enumerate(names):
      cls = name.split("/", 1)[0]
      yield key, {
          "image": images.checked_image(reader.read(name), f"dtd/images/{name}"),
          "file_name": f"texture/{name}",
          "ood_class": cls,
          "ood_class_id": lookup[cls],
      }
