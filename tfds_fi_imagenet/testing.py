"""Fake Fi-ImageNet-1k inputs in the real formats, for tests and end-to-end checks.

`make_fake_fi_imagenet(root, ...)` writes a small `ILSVRC2012_img_val.tar` of generated
JPEGs plus the two lists under `root/manual/`, builds `fi_imagenet_1k` into `root/data/`
with the matching expected counts, and returns that data_dir:

  data_dir = make_fake_fi_imagenet(tmp_path, n_id=8, n_ood=4, n_ambiguous=2)
  ds = tfds.load("fi_imagenet_1k", split="ood", data_dir=data_dir, download=False)
"""
from __future__ import annotations

import gzip
import io
import tarfile
import zipfile
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np
from etils import epath

# OOD class names like the real list's (free text, spaces, one image without a class).
FAKE_OOD_CLASSES = ("hot air balloon", "okapi", "kiwi fruit")


def image_bytes(fmt: str = "JPEG", size: int = 16, seed: int = 0) -> bytes:
  """A deterministic RGB noise image of size x size pixels ('JPEG', 'PNG' or 'GIF')."""
  from PIL import Image
  rng = np.random.default_rng(seed)
  arr = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
  buf = io.BytesIO()
  Image.fromarray(arr).save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
  return buf.getvalue()


def jpeg_bytes(size: int = 16, seed: int = 0) -> bytes:
  return image_bytes("JPEG", size, seed)


def write_tar(path: epath.PathLike, files: Mapping[str, bytes]) -> epath.Path:
  """A tar (gzip-compressed when the name ends in .gz) of {member name: bytes}.

  Metadata is fixed (mtime 0, no owner), so the same files give the same bytes.
  """
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
    for name, data in files.items():
      info = tarfile.TarInfo(name)
      info.size, info.mtime, info.mode = len(data), 0, 0o644
      tar.addfile(info, io.BytesIO(data))
  data = buf.getvalue()
  if path.name.endswith(".gz"):
    data = gzip.compress(data, mtime=0)
  path.write_bytes(data)
  return path


def write_zip(path: epath.PathLike, files: Mapping[str, bytes]) -> epath.Path:
  """A zip of {member name: bytes} with fixed timestamps."""
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w") as zf:
    for name, data in files.items():
      zf.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
  path.write_bytes(buf.getvalue())
  return path


def write_files(root: epath.PathLike, files: Mapping[str, bytes]) -> None:
  """Writes {relative path: bytes} under root."""
  root = epath.Path(root)
  for name, data in files.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(data)


def write_val_tar(path: epath.PathLike, val_ids: Iterable[int], *, size: int = 16,
                  corrupt: Sequence[int] = ()) -> epath.Path:
  """A flat ImageNet-style val tar; ids in `corrupt` get truncated JPEG bytes."""
  files = {}
  for i in val_ids:
    data = jpeg_bytes(size, seed=i)
    files[f"ILSVRC2012_val_{i:08d}.JPEG"] = data[:len(data) // 2] if i in corrupt else data
  return write_tar(path, files)


def write_lists(manual_dir: epath.PathLike, ood: Mapping[int, str],
                ambiguous: Iterable[int]) -> None:
  """The two Fi-ImageNet-1k lists: `<image>,<class>` (no class: bare name) / bare names."""
  manual_dir = epath.Path(manual_dir)
  manual_dir.mkdir(parents=True, exist_ok=True)
  lines = [f"ILSVRC2012_val_{i:08d}.JPEG,{c}" if c else f"ILSVRC2012_val_{i:08d}.JPEG"
           for i, c in ood.items()]
  (manual_dir / "fi_imagenet_1k_ood.txt").write_text("\n".join(lines) + "\n")
  (manual_dir / "fi_imagenet_1k_ambiguous.txt").write_text(
      "".join(f"ILSVRC2012_val_{i:08d}.JPEG\n" for i in ambiguous))


def make_fake_fi_imagenet(root: epath.PathLike, n_id: int = 8, n_ood: int = 4,
                          n_ambiguous: int = 2, *, image_size: int = 16, seed: int = 0,
                          ood_classes: Sequence[str] = FAKE_OOD_CLASSES,
                          file_format: Optional[str] = None) -> str:
  """Writes fake manual files under root/manual, builds fi_imagenet_1k into root/data.

  The images are ILSVRC2012_val_00000001 ... _{N} (N = n_id + n_ood + n_ambiguous), so
  their `label`s are the real ImageNet labels of those ids. A seeded permutation picks the
  OOD and ambiguous ids; OOD image k gets class ood_classes[k % len] except the last one,
  which has no class (ood_class '' / ood_class_id -1) when n_ood > 1.

  Returns:
    The data_dir to pass to tfds.load / tfds.builder (with download=False).
  """
  from tfds_fi_imagenet import build
  root = epath.Path(root)
  n = n_id + n_ood + n_ambiguous
  if n < 1 or min(n_id, n_ood, n_ambiguous) < 0:
    raise ValueError(f"Counts must be >= 0 and not all 0, got {n_id}, {n_ood}, {n_ambiguous}.")
  perm = np.random.default_rng(seed).permutation(np.arange(1, n + 1))
  ood_ids = sorted(int(i) for i in perm[:n_ood])
  amb_ids = sorted(int(i) for i in perm[n_ood:n_ood + n_ambiguous])
  ood = {i: ood_classes[k % len(ood_classes)] for k, i in enumerate(ood_ids)}
  if n_ood > 1:
    ood[ood_ids[-1]] = ""
  manual = root / "manual"
  write_val_tar(manual / "ILSVRC2012_img_val.tar", range(1, n + 1), size=image_size)
  write_lists(manual, ood, amb_ids)
  data_dir = root / "data"
  build.build_dataset("fi_imagenet_1k", data_dir=str(data_dir), manual_dir=str(manual),
                      expected={"ood": n_ood, "ambiguous": n_ambiguous, "id": n_id},
                      file_format=file_format)
  return str(data_dir)
