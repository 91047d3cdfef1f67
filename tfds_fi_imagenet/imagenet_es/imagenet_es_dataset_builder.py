"""imagenet_es: ImageNet-ES (Baek et al., CVPR 2024), from the authors' archive in a manual dir."""
from __future__ import annotations

import re
from typing import Iterator, Optional

import tensorflow_datasets as tfds
from etils import epath

from tfds_fi_imagenet import archives, builder, imagenet_val, members

ARCHIVES = ("ImageNet-ES.zip", "ImageNet-ES.tar", "ImageNet-ES.tar.gz", "ImageNet-ES")
# es-<split>/<setting>/l<light>/param_<k>/<wnid>/<file>, anywhere below the archive's root
# (the reference samples, es-*/sampled_tin_no_resize*, are the undistorted originals: left out)
_MEMBER_RE = re.compile(r"(?:^|/)(es-(test|val)/(param_control|auto_exposure)/(l\d+)/"
                        r"(param_\d+)/(n\d{8})/[^/]+\.(?:jpe?g|png))$", re.IGNORECASE)
_SPLITS = {"test": "test", "val": "validation"}


class ImagenetEsConfig(tfds.core.BuilderConfig):
  """One camera setting family of ImageNet-ES."""


class Builder(builder.OodBuilder):
  """ImageNet-ES per camera-setting family (config), splits `test` and `validation`.

  Builder kwargs: `expected` (counts per split; none are published per config, so none are
  checked by default).
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = [
      ImagenetEsConfig(name="param_control", description="manual ISO / shutter / aperture grid"),
      ImagenetEsConfig(name="auto_exposure", description="the camera's auto exposure"),
  ]
  MANUAL_DOWNLOAD_INSTRUCTIONS = """\
  The manual dir must hold ImageNet-ES as the authors distribute it (github.com/Edw2n/ImageNet-ES,
  Google Drive file 1ZCsc4tw_aRNzWii8ahvKV97z3V3xzMDA): `ImageNet-ES.zip` (or .tar, .tar.gz, or
  the extracted folder `ImageNet-ES/`) with `es-test/` and `es-val/`, each holding
  `param_control/` and `auto_exposure/` as `l<light>/param_<k>/<wnid>/<image>`.
  """

  def default_expected(self) -> dict[str, int]:
    return {"test": -1, "validation": -1}   # not published per config: none checked

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.expected = {k: v for k, v in self.expected.items() if v >= 0}

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(None, None, 3)),
            "file_name": tfds.features.Text(),
            "label": tfds.features.ClassLabel(names_file=imagenet_val.label_names_file()),
            "light": tfds.features.Text(),
            "camera_setting": tfds.features.Text(),
        }),
        supervised_keys=("image", "label"),
        homepage="https://github.com/Edw2n/ImageNet-ES",
        disable_shuffling=True,   # stored in sorted path order
    )

  def _key_of(self, name: str) -> Optional[str]:
    m = _MEMBER_RE.search(name)
    return m.group(1) if m and m.group(3) == self.builder_config.name else None

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    root = epath.Path(dl_manager.manual_dir)
    source = archives.find_first(root, ARCHIVES)
    if source is None:
      raise FileNotFoundError(f"imagenet_es: none of {', '.join(ARCHIVES)} is in the manual dir "
                              f"{root}. Download ImageNet-ES from github.com/Edw2n/ImageNet-ES.")
    archive = archives.ImageArchive(source)
    index = members.index_members(archive.names(), self._key_of, str(source))
    wnids = set(imagenet_val.label_names_file().read_text().split())
    unknown = sorted({k.split("/")[4] for k in index} - wnids)
    if unknown:
      raise ValueError(f"imagenet_es: {source} has class folders that are not ImageNet-1k "
                       f"WordNet ids: {unknown[:5]}.")
    keys = {s: sorted(k for k in index if k.split("/")[0] == f"es-{short}")
            for short, s in _SPLITS.items()}
    if not any(keys.values()):
      raise FileNotFoundError(f"imagenet_es: {source} holds no image under "
                              f"es-test/ or es-val/{self.builder_config.name}/"
                              "l<light>/param_<k>/<wnid>/.")
    for split, wanted in keys.items():
      self.check_count(split, len(wanted), f"the {split} split")
    return {split: self._generate_examples(archive, index, wanted)   # a split it has
            for split, wanted in keys.items() if wanted}

  def _generate_examples(self, archive: archives.ImageArchive, index: dict, keys: list[str],
                         ) -> Iterator[tuple[str, dict]]:
    for key, _, data in members.iter_wanted(archive, self._key_of, keys, str, index=index):
      _, _, light, setting, wnid, _ = key.split("/")
      yield key, {"image": data, "file_name": key, "label": wnid, "light": light,
                  "camera_setting": setting}
