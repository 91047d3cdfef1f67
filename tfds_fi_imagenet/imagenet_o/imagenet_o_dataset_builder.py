"""imagenet_o: ImageNet-O (Hendrycks et al., CVPR 2021), 2,000 adversarially filtered OOD images."""
from __future__ import annotations

import re
from typing import Iterator

import tensorflow_datasets as tfds

from tfds_fi_imagenet import archives, builder, downloads, images, mos, ood_classes

ARCHIVE = downloads.Archive(url="https://people.eecs.berkeley.edu/~hendrycks/imagenet-o.tar",
                            filename="imagenet-o.tar",
                            md5="86bd7a50c1c4074fb18fc5f219d6d50b")
_WNID = re.compile(r"^n\d{8}$")
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class Builder(builder.OodBuilder):
  """ImageNet-O: ImageNet-22K images of classes outside ImageNet-1k that a ResNet-50
  classifies into an ImageNet-1k class with high confidence; 2,000 images in 200 folders.

  The archive (`imagenet-o.tar`, layout `imagenet-o/<wnid>/<file>.JPEG` plus a README) is
  read without extracting it. `file_name` is OpenOOD's list path `imagenet_o/<wnid>/<file>`;
  `ood_class` the folder's WordNet id: the ImageNet-1k class the images were confidently
  (mis)classified as, not their own concept (the file name starts with that). The MD5 is the
  one pytorch-ood checks (kkirchheim/pytorch-ood, src/pytorch_ood/dataset/img/imagenet.py).
  Builder kwargs: `expected` (keys 'test', 'classes'), `verify_md5` (default True).
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = mos.manual_note(ARCHIVE)

  def __init__(self, *, verify_md5: bool = True, **kwargs):
    super().__init__(**kwargs)
    self._original_state["verify_md5"] = verify_md5
    self.verify_md5 = verify_md5

  def default_expected(self) -> dict[str, int]:
    return {"test": 2000, "classes": 200}

  def archives(self) -> list[downloads.Archive]:
    return [ARCHIVE]

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=builder.ood_features(),
        homepage="https://github.com/hendrycks/natural-adv-examples",
        disable_shuffling=True,  # stored in sorted file_name order
        metadata=tfds.core.MetadataDict(),
        license="MIT (code and annotations); images keep their ImageNet terms",
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    path = downloads.fetch(self, dl_manager, ARCHIVE, verify_md5=self.verify_md5)
    reader = archives.ImageArchive(path)
    rel: dict[str, str] = {}   # '<wnid>/<file>' -> member name
    for name in reader.names():
      parts = name.split("/")
      if len(parts) < 2 or not _WNID.match(parts[-2]) or not name.lower().endswith(
          _IMAGE_SUFFIXES):
        continue
      key = "/".join(parts[-2:])
      if key in rel:
        raise ValueError(f"imagenet_o: {key} appears twice in {path}: {rel[key]} and {name}.")
      rel[key] = name
    classes, lookup = ood_classes.class_ids(k.split("/", 1)[0] for k in rel)
    self.check_count("test", len(rel), f"the <wnid>/ folders of {path}")
    self.check_count("classes", len(classes), f"the <wnid>/ folders of {path}")
    self.info.metadata["ood_class_names"] = classes
    return {"test": self._generate_examples(reader, rel, lookup)}

  def _generate_examples(self, reader: archives.ImageArchive, rel: dict[str, str],
                         lookup: dict[str, int]) -> Iterator[tuple[int, dict]]:
    for key, r in enumerate(sorted(rel)):
      wnid = r.split("/", 1)[0]
      yield key, {
          "image": images.checked_image(reader.read(rel[r]), f"{rel[r]} in {reader.path}"),
          "file_name": f"imagenet_o/{r}",
          "ood_class": wnid,
          "ood_class_id": lookup[wnid],
      }
