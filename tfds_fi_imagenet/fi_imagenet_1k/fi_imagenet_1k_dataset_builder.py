"""fi_imagenet_1k: the Fi-ImageNet-1k OOD, ambiguous and remaining ID ImageNet val images."""
from __future__ import annotations

from typing import Iterator, Optional

import tensorflow_datasets as tfds
from etils import epath

from tfds_fi_imagenet import archives, builder, imagenet_val, members, ood_classes

VAL_TAR = "ILSVRC2012_img_val.tar"
VAL_DIR = "ILSVRC2012_img_val"
OOD_LIST = "fi_imagenet_1k_ood.txt"
AMBIGUOUS_LIST = "fi_imagenet_1k_ambiguous.txt"
NUM_OOD = 655
NUM_AMBIGUOUS = 980


class Builder(builder.OodBuilder):
  """Fi-ImageNet-1k from the ImageNet validation tar and the two image lists.

  Builder kwargs: `expected` (counts, see builder.OodBuilder; keys 'ood', 'ambiguous',
  'id'), `ood_list` and `ambiguous_list` (file names inside the manual dir).
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release (lists supplied in the manual dir)."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = f"""\
  The manual dir must hold:
    * the ImageNet-1k validation images: `{VAL_TAR}` (from image-net.org), or the folder
      `{VAL_DIR}/` with the extracted `ILSVRC2012_val_<8 digits>.JPEG` files (sub-folders ok);
    * `{OOD_LIST}`: one OOD image per line, `<image>,<OOD class name>` (comma or tab; the
      image may be a bare name, a path or the first CSV column; the class may be missing);
    * `{AMBIGUOUS_LIST}`: one ambiguous image per line.
  """

  def __init__(self, *, ood_list: str = OOD_LIST, ambiguous_list: str = AMBIGUOUS_LIST,
               **kwargs):
    super().__init__(**kwargs)
    self._original_state.update(ood_list=ood_list, ambiguous_list=ambiguous_list)
    self.ood_list = ood_list
    self.ambiguous_list = ambiguous_list

  def default_expected(self) -> dict[str, int]:
    return {"ood": NUM_OOD, "ambiguous": NUM_AMBIGUOUS,
            "id": imagenet_val.NUM_VAL - NUM_OOD - NUM_AMBIGUOUS}

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=builder.ood_features(
            label=tfds.features.ClassLabel(names_file=imagenet_val.label_names_file())),
        supervised_keys=("image", "label"),
        homepage="https://arxiv.org/abs/2609.01027",
        disable_shuffling=True,  # stored in ILSVRC2012_val_<8 digits> order
        metadata=tfds.core.MetadataDict(),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    root = epath.Path(dl_manager.manual_dir)
    source = archives.find_first(root, [VAL_TAR, VAL_DIR])
    if source is None:
      raise FileNotFoundError(
          f"fi_imagenet_1k: neither {VAL_TAR} nor {VAL_DIR}/ is in the manual dir {root}. "
          f"Put ImageNet's validation tar there.")
    lists = {}
    for split, fname, with_class in (("ood", self.ood_list, True),
                                     ("ambiguous", self.ambiguous_list, False)):
      path = root / fname
      if not path.exists():
        raise FileNotFoundError(f"fi_imagenet_1k: the list {fname} is missing from the "
                                f"manual dir {root}.")
      lists[split] = imagenet_val.parse_list(path, with_class=with_class)
    imagenet_val.check_disjoint(lists["ood"], self.ood_list,
                                lists["ambiguous"], self.ambiguous_list)
    self.check_count("ood", len(lists["ood"]), self.ood_list)
    self.check_count("ambiguous", len(lists["ambiguous"]), self.ambiguous_list)

    archive = archives.ImageArchive(source)
    index = members.index_members(archive.names(), imagenet_val.val_id_of_member, str(source))
    line_of = {e.val_id: f"{self.ood_list} line {e.line}" for e in lists["ood"]}
    line_of.update({e.val_id: f"{self.ambiguous_list} line {e.line}"
                    for e in lists["ambiguous"]})
    for entries in lists.values():
      members.raise_if_missing(
          [e.val_id for e in entries], index,
          lambda i: f"{imagenet_val.val_file_name(i)} ({line_of[i]})", str(source))
    listed = set(line_of)
    id_ids = sorted(i for i in index if i not in listed)
    self.check_count("id", len(id_ids), f"{source.name} minus both lists",
                     "Is the validation tar complete (50,000 images)?")

    classes, lookup = ood_classes.class_ids(e.ood_class for e in lists["ood"])
    self.info.metadata["ood_class_names"] = classes
    ood_class = {e.val_id: e.ood_class for e in lists["ood"]}
    return {
        split: self._generate_examples(archive, index, ids, ood_class, lookup)
        for split, ids in (("ood", sorted(e.val_id for e in lists["ood"])),
                           ("ambiguous", sorted(e.val_id for e in lists["ambiguous"])),
                           ("id", id_ids))
    }

  def _generate_examples(self, archive: archives.ImageArchive, index: dict, ids: list[int],
                         ood_class: dict[int, str], lookup: dict[str, int],
                         ) -> Iterator[tuple[int, dict]]:
    wnids = imagenet_val.validation_wnids()
    for val_id, _, data in members.iter_wanted(
        archive, imagenet_val.val_id_of_member, ids,
        imagenet_val.val_file_name, index=index):
      name: Optional[str] = ood_class.get(val_id, "")
      yield val_id, {
          "image": data,
          "file_name": imagenet_val.val_file_name(val_id),
          "label": wnids[val_id - 1],
          "ood_class": name,
          "ood_class_id": lookup[name],
      }
