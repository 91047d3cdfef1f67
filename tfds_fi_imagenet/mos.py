"""Base of the MOS benchmark's OOD sets (Huang & Li, CVPR 2021): iNaturalist, SUN and Places.

The MOS authors publish each set as one `.tar.gz` (http://pages.cs.wisc.edu/~huangrui/
imagenet_ood_dataset/, linked from the README of deeplearning-wisc/large_scale_ood) holding
`<Set>/images/<file>.jpg`, 10,000 images of concepts disjoint from ImageNet-1k, with no label
files. The MD5s are those pytorch-ood checks (kkirchheim/pytorch-ood, its MOS loaders). The
archive may be placed in the manual dir instead of downloaded (`downloads.fetch`).
"""
from __future__ import annotations

from typing import ClassVar, Iterator, Optional

import tensorflow_datasets as tfds
from etils import epath

from tfds_fi_imagenet import archives, builder, downloads, images, ood_classes

BASE_URL = "http://pages.cs.wisc.edu/~huangrui/imagenet_ood_dataset/"
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def manual_note(archive: downloads.Archive) -> str:
  """MANUAL_DOWNLOAD_INSTRUCTIONS of a builder that downloads one archive."""
  return (f"Optional (to build without network): put {archive.filename} (from {archive.url}) "
          f"in the manual dir; it is checked against {archive.checksum_note()}.")


class MosBuilder(builder.OodBuilder, skip_registration=True):
  """One MOS OOD set: every image of the archive, in sorted file-name order, split `test`.

  `file_name` is `<LIST_DIR>/images/<file>` (OpenOOD's list path for iNaturalist). Builder
  kwargs: `expected` (key 'test', and 'classes' where the file names carry classes),
  `verify_md5` (default True).
  """

  ARCHIVE: ClassVar[downloads.Archive]
  LIST_DIR: ClassVar[str]          # first component of `file_name`
  COUNTS: ClassVar[dict[str, int]]
  # optional list in the manual dir giving each file's category (MOS's data_lists/ file)
  CLASS_LIST: ClassVar[Optional[str]] = None
  HOMEPAGE = "https://github.com/deeplearning-wisc/large_scale_ood"

  def __init__(self, *, verify_md5: bool = True, **kwargs):
    super().__init__(**kwargs)
    self._original_state["verify_md5"] = verify_md5
    self.verify_md5 = verify_md5

  def default_expected(self) -> dict[str, int]:
    return dict(self.COUNTS)

  def archives(self) -> list[downloads.Archive]:
    return [self.ARCHIVE]

  def class_of(self, base: str) -> str:
    """The OOD class of an image: from the CLASS_LIST when the manual dir has it, else ''
    (subclasses read it from the file name)."""
    return self.__dict__.get("_listed_classes", {}).get(base, "")

  def _read_class_list(self, dl_manager) -> None:
    """Reads CLASS_LIST from the manual dir, when there: lines '<letter>/<category path>/
    <file> <index>' (MOS's data_lists/sun_selected_list.txt) -> {file: category path}."""
    manual = downloads.manual_dir_of(dl_manager)
    path = manual / self.CLASS_LIST if manual is not None and self.CLASS_LIST else None
    if path is None or not path.exists():
      return
    listed = {}
    for no, raw in enumerate(path.read_text().splitlines(), start=1):
      line = raw.strip()
      if not line or line.startswith("#"):
        continue
      parts = line.split()[0].split("/")
      if len(parts) < 3:
        raise ValueError(f"{path.name} line {no}: {line!r} is not '<letter>/<category>/<file> "
                         "<index>'; is this MOS's list?")
      listed[parts[-1]] = "/".join(parts[1:-1])
    self._listed_classes = listed

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=builder.ood_features(),
        homepage=self.HOMEPAGE,
        disable_shuffling=True,  # stored in sorted file_name order
        metadata=tfds.core.MetadataDict(),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    archive = downloads.fetch(self, dl_manager, self.ARCHIVE, verify_md5=self.verify_md5)
    self._read_class_list(dl_manager)
    extracted = epath.Path(dl_manager.extract(
        tfds.download.Resource(path=archive, extract_method=tfds.download.ExtractMethod.TAR_GZ)))
    reader = archives.ImageArchive(extracted)
    by_base: dict[str, str] = {}
    for name in reader.names():
      if not name.lower().endswith(_IMAGE_SUFFIXES):
        continue
      base = name.rsplit("/", 1)[-1]
      if base in by_base:
        raise ValueError(f"{self.name}: {base} appears twice in {extracted}: "
                         f"{by_base[base]} and {name}.")
      by_base[base] = name
    self.check_count("test", len(by_base), f"the images of {extracted}")
    classes, lookup = ood_classes.class_ids(self.class_of(b) for b in by_base)
    if "classes" in self.COUNTS:
      self.check_count("classes", len(classes), f"the file names of {extracted}")
    self.info.metadata["ood_class_names"] = classes
    return {"test": self._generate_examples(reader, by_base, lookup)}

  def _generate_examples(self, reader: archives.ImageArchive, by_base: dict[str, str],
                         lookup: dict[str, int]) -> Iterator[tuple[int, dict]]:
    for key, base in enumerate(sorted(by_base)):
      name = by_base[base]
      cls = self.class_of(base)
      yield key, {
          "image": images.checked_image(reader.read(name), name),
          "file_name": f"{self.LIST_DIR}/images/{base}",
          "ood_class": cls,
          "ood_class_id": lookup[cls],
      }
