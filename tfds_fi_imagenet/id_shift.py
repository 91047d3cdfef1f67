"""The covariate-shifted ImageNet sets (full-spectrum evaluation) through TFDS's OWN builders.

TFDS already has builders for ImageNet-V2 (`imagenet_v2`, configs `matched-frequency`,
`threshold-0.7`, `topimages`), ImageNet-R (`imagenet_r`), ImageNet-A (`imagenet_a`),
ImageNet-Sketch (`imagenet_sketch`), ImageNet-C (`imagenet2012_corrupted`, config
`<corruption>_<severity>`, corruptions computed from the ImageNet val tar) and ReaL
(`imagenet2012_real`), so this package writes none: `prepare(name, data_dir=..., manual_dir=...)`
runs TFDS's builder offline. TFDS's download manager takes a registered download from
`manual_dir` when a file there has the name recorded in the builder's `checksums.tsv`, and checks
its size and SHA-256 against that record; the files each builder needs are `FILES` (with the
URLs TFDS would fetch them from). All present: nothing is downloaded. One missing: one line
naming the file(s) and where to get them, before anything else runs.

Labels: every one of these builders stores the ImageNet-1k label index (TFDS `imagenet2012`
order). `imagenet_v2` reads its folders `0`..`999` as class INDICES (`int(folder)`), not as
names sorted as strings, so folder `10` is class 10 (tests/data/test_id_shift.py).

    python -m tfds_fi_imagenet.id_shift imagenet_v2/matched-frequency --manual_dir=M --data_dir=D
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

os.environ.setdefault("NO_GCE_CHECK", "true")

import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import download_manager

# TFDS name (with the config where the files depend on it) -> the files its builder reads
# from manual_dir (registered downloads under their checksums.tsv file names, or manual files)
FILES = {
    "imagenet_v2/matched-frequency": ("imagenetv2-matched-frequency.tar.gz",),
    "imagenet_v2/threshold-0.7": ("imagenetv2-threshold0.7.tar.gz",),
    "imagenet_v2/topimages": ("imagenetv2-top-images.tar.gz",),
    "imagenet_r": ("imagenet-r.tar",),
    "imagenet_a": ("imagenet-a.tar",),
    "imagenet_sketch": ("ImageNet-Sketch.zip",),
    "imagenet2012_real": ("ILSVRC2012_img_val.tar", "real.json"),
    "imagenet2012_corrupted": ("ILSVRC2012_img_val.tar", "frost1.png", "frost2.png",
                               "frost3.png", "frost4.jpg", "frost5.jpg", "frost6.jpg"),
}
# files no URL serves without a login (ImageNet's own tars)
_MANUAL = {"ILSVRC2012_img_val.tar": "image-net.org (after registering), the ILSVRC2012 "
                                     "validation images"}


def files_of(name: str) -> tuple[str, ...]:
  """The manual-dir files of TFDS dataset `name` ("imagenet_v2/topimages", "imagenet_r",
  "imagenet2012_corrupted/fog_3", ...)."""
  base, _, config = name.partition("/")
  if name in FILES:
    return FILES[name]
  if base == "imagenet_v2" and not config:
    raise ValueError("imagenet_v2 has three configs: name one of "
                     + ", ".join(k for k in FILES if k.startswith("imagenet_v2/")) + ".")
  if base in FILES:
    return FILES[base]
  raise ValueError(f"{name!r} is not one of TFDS's ID-shift builders this module prepares: "
                   f"{', '.join(sorted(FILES))} (imagenet2012_corrupted/<corruption>_<severity>).")


def sources(name: str) -> dict[str, str]:
  """{file name: where to get it} for `files_of(name)`: the URL of TFDS's checksums.tsv, or
  the site of a manual-only file."""
  urls = {info.filename: url for url, info in
          (tfds.builder_cls(name.partition("/")[0]).url_infos or {}).items() if info.filename}
  return {f: _MANUAL.get(f) or urls.get(f, "?") for f in files_of(name)}


# imagenet2012_corrupted computes the corruptions with TFDS's corruption code, which imports
# these at build time (tensorflow_datasets/image_classification/corruptions.py): OpenCV always
# (the builder seeds cv2's RNG), scikit-image for some corruptions, and ImageMagick's `convert`
# run as a binary named `imagemagick` for snow and motion_blur.
_SKIMAGE_CORRUPTIONS = ("impulse_noise", "glass_blur", "brightness", "elastic_transform",
                        "gaussian_blur", "saturate", "spatter")
_IMAGEMAGICK_CORRUPTIONS = ("snow", "motion_blur")


def _importable(module: str) -> bool:
  if module in sys.modules:
    return True
  import importlib.util
  return importlib.util.find_spec(module) is not None


def missing_requirements(name: str) -> list[str]:
  """What building TFDS dataset `name` needs besides its files and is not installed here:
  for imagenet2012_corrupted/<corruption>_<severity>, "opencv-python (cv2)" always,
  "scikit-image" for the corruptions that use it, and the `imagemagick` binary for snow and
  motion_blur; [] for the other sets."""
  import shutil
  base, _, config = name.partition("/")
  if base != "imagenet2012_corrupted":
    return []
  corruption = config.rsplit("_", 1)[0]
  out = [] if _importable("cv2") else ["opencv-python (cv2)"]
  if corruption in _SKIMAGE_CORRUPTIONS and not _importable("skimage"):
    out.append("scikit-image")
  if corruption in _IMAGEMAGICK_CORRUPTIONS and shutil.which("imagemagick") is None:
    out.append("ImageMagick's convert as a binary named `imagemagick` on PATH")
  return out


def missing_files(name: str, manual_dir: str) -> list[str]:
  return [f for f in files_of(name) if not os.path.isfile(os.path.join(manual_dir, f))]


def prepare(name: str, *, data_dir: str, manual_dir: str,
            download_dir: Optional[str] = None) -> tfds.core.DatasetBuilder:
  """Prepares TFDS dataset `name` into `data_dir` from the files in `manual_dir` (no network):
  FileNotFoundError naming every missing file and its source, then ModuleNotFoundError
  naming what imagenet2012_corrupted needs and is not installed (`missing_requirements`); a
  file whose size or SHA-256 differs from TFDS's record is a ValueError naming it."""
  missing = missing_files(name, manual_dir)
  if missing:
    where = sources(name)
    raise FileNotFoundError(
        f"{name} needs in --manual_dir={manual_dir}: " + "; ".join(
            f"{f} (from {where[f]})" for f in missing) + ".")
  needs = missing_requirements(name)
  if needs:
    pip = [n.split()[0] for n in needs if "binary" not in n]
    raise ModuleNotFoundError(f"{name} is computed by TFDS's corruption code, which needs "
                              f"{', '.join(needs)}: install "
                              + (f"it (pip install {' '.join(pip)})" if pip else "it")
                              + " and prepare again.")
  builder = tfds.builder(name, data_dir=data_dir)
  config = tfds.download.DownloadConfig(manual_dir=manual_dir, try_download_gcs=False)
  try:
    builder.download_and_prepare(download_dir=download_dir, download_config=config)
  except download_manager.NonMatchingChecksumError as e:
    bad = [f for f in files_of(name) if f in str(e)] or ["a file"]
    raise ValueError(f"{name}: {', '.join(bad)} in {manual_dir} is not the published file "
                     "(size or SHA-256 differs from TFDS's checksums.tsv); download it again "
                     f"from {sources(name).get(bad[0], 'its source')}.") from None
  return builder


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = argparse.ArgumentParser(prog="python -m tfds_fi_imagenet.id_shift",
                              description="Prepare a TFDS ID-shift set from local files.")
  p.add_argument("name", help=f"one of: {', '.join(sorted(FILES))}, "
                              "imagenet2012_corrupted/<corruption>_<severity>")
  p.add_argument("--data_dir", required=True)
  p.add_argument("--manual_dir", required=True)
  p.add_argument("--download_dir")
  args = p.parse_args(argv)
  try:
    prepare(args.name, data_dir=args.data_dir, manual_dir=args.manual_dir,
            download_dir=args.download_dir)
  except (FileNotFoundError, ModuleNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
