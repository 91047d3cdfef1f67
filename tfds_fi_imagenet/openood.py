"""Base of the builders that read an OpenOOD v1.5 image zip plus its image lists.

OpenOOD ships each ImageNet OOD set as `<set>.zip` (Google Drive) and the lists in
`benchmark_imglist.zip` (`benchmark_imglist/imagenet/test_<set>.txt`, lines
`<set>/<relative path> -1`). Neither is a direct URL, so these builders read a manual dir
holding the list(s) (at the top or under `benchmark_imglist/imagenet/`) and the images as
`<set>.zip`, `<set>.tar`, a compressed tar, or the extracted folder `<set>/` (also
`images_largescale/<set>/`, OpenOOD's own data layout). Members are matched by their path
relative to `<set>/`, whatever folders the archive wraps them in.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Iterator, Optional

import tensorflow_datasets as tfds
from etils import epath

from tfds_fi_imagenet import archives, builder, members, ood_classes


@dataclasses.dataclass(frozen=True)
class Entry:
  rel: str      # path relative to the set folder, e.g. 'n01/n01_1.JPEG'
  line: int
  list_name: str


def parse_imglist(path: epath.Path, set_dir: str) -> list[Entry]:
  """Entries of an OpenOOD list; ValueError naming the line for foreign or repeated paths."""
  entries, first = [], {}
  prefix = set_dir + "/"
  for no, raw in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), start=1):
    line = raw.strip()
    if not line or line.startswith("#"):
      continue
    image = line.split(" ", 1)[0]
    if not image.startswith(prefix) or len(image) == len(prefix):
      raise ValueError(f"{path.name} line {no}: {image!r} is not a path under {prefix}; is "
                       f"this the OpenOOD list of {set_dir}?")
    rel = image[len(prefix):]
    if rel in first:
      raise ValueError(f"{path.name} line {no}: duplicate image {image} (first on line "
                       f"{first[rel]}).")
    first[rel] = no
    entries.append(Entry(rel, no, path.name))
  return entries


def manual_instructions(set_dir: str, lists: dict[str, str]) -> str:
  """MANUAL_DOWNLOAD_INSTRUCTIONS of an OpenOOD-list builder."""
  names = ", ".join(lists.values())
  return (f"The manual dir must hold OpenOOD v1.5's list(s) {names} (from "
          "benchmark_imglist.zip, at the top or under benchmark_imglist/imagenet/) and the "
          f"images: {set_dir}.zip as downloaded by OpenOOD, or {set_dir}.tar[.gz], or the "
          f"extracted folder {set_dir}/ (or images_largescale/{set_dir}/).")


class OpenOodBuilder(builder.OodBuilder, skip_registration=True):
  """Splits from OpenOOD lists, images from the set's zip / tar / folder (manual dir)."""

  SET_DIR: ClassVar[str]                  # first component of the list paths
  LISTS: ClassVar[dict[str, str]]         # split -> list file name
  COUNTS: ClassVar[dict[str, int]]        # split (and 'classes') -> published count
  CLASS_FROM_FOLDER: ClassVar[bool] = False  # ood_class = the image's parent folder

  def default_expected(self) -> dict[str, int]:
    return dict(self.COUNTS)

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=builder.ood_features(),
        homepage="https://github.com/Jingkang50/OpenOOD",
        disable_shuffling=True,  # stored in list order
        metadata=tfds.core.MetadataDict(),
    )

  def _find_list(self, root: epath.Path, name: str) -> epath.Path:
    path = archives.find_first(root, [name, f"benchmark_imglist/imagenet/{name}"])
    if path is None:
      raise FileNotFoundError(f"{self.name}: the list {name} is missing from the manual dir "
                              f"{root} (looked at the top and in benchmark_imglist/imagenet/).")
    return path

  def _find_images(self, root: epath.Path) -> epath.Path:
    d = self.SET_DIR
    path = archives.find_first(root, [f"{d}.zip", f"{d}.tar", f"{d}.tar.gz", f"{d}.tgz", d,
                                     f"images_largescale/{d}"])
    if path is None:
      raise FileNotFoundError(f"{self.name}: no {d}.zip, {d}.tar[.gz] or {d}/ folder in the "
                              f"manual dir {root}.")
    return path

  def _class_of(self, rel: str) -> str:
    if self.CLASS_FROM_FOLDER and "/" in rel:
      return rel.rsplit("/", 2)[-2]
    return ""

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    root = epath.Path(dl_manager.manual_dir)
    lists = {split: parse_imglist(self._find_list(root, name), self.SET_DIR)
             for split, name in self.LISTS.items()}
    splits = list(lists)
    for i, a in enumerate(splits):
      for b in splits[i + 1:]:
        line_b = {e.rel: e.line for e in lists[b]}
        for e in lists[a]:
          if e.rel in line_b:
            raise ValueError(f"{self.SET_DIR}/{e.rel} is in both {e.list_name} (line "
                             f"{e.line}) and {self.LISTS[b]} (line {line_b[e.rel]}).")
    for split, entries in lists.items():
      self.check_count(split, len(entries), self.LISTS[split])
    classes, lookup = ood_classes.class_ids(
        self._class_of(e.rel) for entries in lists.values() for e in entries)
    if "classes" in self.COUNTS:
      self.check_count("classes", len(classes), ", ".join(self.LISTS.values()))
    self.info.metadata["ood_class_names"] = classes

    source = self._find_images(root)
    reader = archives.ImageArchive(source)
    all_entries = {e.rel: e for entries in lists.values() for e in entries}
    key_of = members.suffix_key(all_entries)
    index: Optional[dict] = None
    if reader.random_access:  # fail before generating anything
      index = members.index_members(reader.names(), key_of, str(source))
      members.raise_if_missing(all_entries, index, lambda r: self._describe(all_entries[r]),
                              str(source))
    return {split: self._generate_examples(reader, index, key_of, entries, lookup)
            for split, entries in lists.items()}

  def _describe(self, e: Entry) -> str:
    return f"{self.SET_DIR}/{e.rel} ({e.list_name} line {e.line})"

  def _generate_examples(self, reader: archives.ImageArchive, index: Optional[dict], key_of,
                         entries: list[Entry], lookup: dict[str, int],
                         ) -> Iterator[tuple[int, dict]]:
    position = {e.rel: k for k, e in enumerate(entries)}
    by_rel = {e.rel: e for e in entries}
    for rel, _, data in members.iter_wanted(reader, key_of, list(position),
                                           lambda r: self._describe(by_rel[r]), index=index):
      cls = self._class_of(rel)
      yield position[rel], {
          "image": data,
          "file_name": f"{self.SET_DIR}/{rel}",
          "ood_class": cls,
          "ood_class_id": lookup[cls],
      }
