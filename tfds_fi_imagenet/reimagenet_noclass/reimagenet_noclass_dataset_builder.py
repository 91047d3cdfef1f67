"""reimagenet_noclass: the ImageNet val images ReImageNet assigns to no ImageNet-1k class."""
from __future__ import annotations

from typing import Iterator

import tensorflow_datasets as tfds
from etils import epath

from tfds_fi_imagenet import archives, builder, imagenet_val, members, ood_classes, reannotation

VAL_TAR = "ILSVRC2012_img_val.tar"
VAL_DIR = "ILSVRC2012_img_val"


class Builder(builder.OodBuilder):
  """ImageNet val split by ReImageNet's reannotation: `ood` (no ImageNet-1k class),
  `ambiguous` (ImageNet classes, marked ambiguous) and `id` (the rest).

  Builder kwargs: `expected` (counts per split; none are published, so none are checked by
  default), `reannotation_file` (the file name in the manual dir), `label_field` and
  `ambiguous_field` (tfds_fi_imagenet/reannotation.py: the field names, when they are not
  the ones that module assumes).
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release (reannotation.jsonl supplied in the manual dir)."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = f"""\
  The manual dir must hold:
    * the ImageNet-1k validation images: `{VAL_TAR}` (from image-net.org), or the folder
      `{VAL_DIR}/` with the extracted `ILSVRC2012_val_<8 digits>.JPEG` files;
    * `{reannotation.FILE_NAME}` from Hugging Face `vrg-prague/ReImageNet` (gated; research
      use only; it may not be redistributed).
  """

  def __init__(self, *, reannotation_file: str = reannotation.FILE_NAME,
               label_field: str = "", ambiguous_field: str = "", **kwargs):
    super().__init__(**kwargs)
    self.expected = {k: v for k, v in self.expected.items() if v >= 0}   # -1: not published
    self._original_state.update(reannotation_file=reannotation_file, label_field=label_field,
                                ambiguous_field=ambiguous_field)
    self.reannotation_file = reannotation_file
    self.label_field = label_field or None
    self.ambiguous_field = ambiguous_field or None

  def default_expected(self) -> dict[str, int]:
    return {"ood": -1, "ambiguous": -1, "id": -1}   # no published counts: none checked

  def _info(self) -> tfds.core.DatasetInfo:
    names = imagenet_val.label_names_file()
    return self.dataset_info_from_configs(
        features=builder.ood_features(
            label=tfds.features.ClassLabel(names_file=names),
            labels=tfds.features.Sequence(tfds.features.ClassLabel(names_file=names))),
        supervised_keys=("image", "label"),
        homepage="https://huggingface.co/datasets/vrg-prague/ReImageNet",
        disable_shuffling=True,  # stored in ILSVRC2012_val_<8 digits> order
        metadata=tfds.core.MetadataDict(),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    root = epath.Path(dl_manager.manual_dir)
    source = archives.find_first(root, [VAL_TAR, VAL_DIR])
    if source is None:
      raise FileNotFoundError(f"reimagenet_noclass: neither {VAL_TAR} nor {VAL_DIR}/ is in the "
                              f"manual dir {root}. Put ImageNet's validation tar there.")
    records = reannotation.read(root / self.reannotation_file, label_field=self.label_field,
                                ambiguous_field=self.ambiguous_field)
    archive = archives.ImageArchive(source)
    index = members.index_members(archive.names(), imagenet_val.val_id_of_member, str(source))
    members.raise_if_missing(sorted(records), index, imagenet_val.val_file_name, str(source))
    split_of = {i: ("ood" if not r.labels else "ambiguous" if r.ambiguous else "id")
                for i, r in records.items()}
    ids = {s: sorted(i for i, t in split_of.items() if t == s) for s in ("ood", "ambiguous", "id")}
    for split, wanted in ids.items():
      self.check_count(split, len(wanted), f"the {split} split")
    other = {i: " | ".join(records[i].other_labels) for i in ids["ood"]}
    classes, lookup = ood_classes.class_ids(other.values())
    self.info.metadata["ood_class_names"] = classes
    return {split: self._generate_examples(archive, index, wanted, records, other, lookup)
            for split, wanted in ids.items()}

  def _generate_examples(self, archive: archives.ImageArchive, index: dict, ids: list[int],
                         records: dict, other: dict[int, str], lookup: dict[str, int],
                         ) -> Iterator[tuple[int, dict]]:
    wnids = imagenet_val.validation_wnids()
    for val_id, _, data in members.iter_wanted(
        archive, imagenet_val.val_id_of_member, ids, imagenet_val.val_file_name, index=index):
      name = other.get(val_id, "")
      yield val_id, {
          "image": data,
          "file_name": imagenet_val.val_file_name(val_id),
          "label": wnids[val_id - 1],
          "labels": list(records[val_id].labels),
          "ood_class": name,
          "ood_class_id": lookup[name],
      }
