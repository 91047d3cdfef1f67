"""Build-time bench: fi_imagenet_1k vs TFDS's own imagenet2012 on the same fake val tar.

  python -m tfds_fi_imagenet.bench_build [--n 2000] [--size 320]

Both read an uncompressed ILSVRC2012_img_val.tar of N generated JPEGs; imagenet2012
builds its `validation` split (no image checks), fi_imagenet_1k its three splits (lists of
~1.3% / ~2% of the images, every image decoded once by PIL to catch corrupt files). Prints
seconds, images/s and the ratio; extrapolate to 50,000 images for the real tar.
"""
from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
from etils import epath

from tfds_fi_imagenet import build, testing


def _photo_like_jpeg(rng: np.random.Generator, size: int) -> bytes:
  """A smooth gradient plus mild noise: JPEG sizes close to real photos (~20-40 KB)."""
  import io

  from PIL import Image
  h, w = size * 3 // 4, size
  yy, xx = np.mgrid[0:h, 0:w]
  base = np.stack([xx * 255 / w, yy * 255 / h, (xx + yy) * 127 / (w + h)], -1)
  img = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
  buf = io.BytesIO()
  Image.fromarray(img).save(buf, format="JPEG", quality=90)
  return buf.getvalue()


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--n", type=int, default=2000)
  p.add_argument("--size", type=int, default=320)
  args = p.parse_args()
  import tensorflow as tf  # noqa: F401  not timed
  import tensorflow_datasets as tfds
  tfds.disable_progress_bar()
  rng = np.random.default_rng(0)
  with tempfile.TemporaryDirectory() as tmp:
    root = epath.Path(tmp)
    manual = root / "manual"
    files = {f"ILSVRC2012_val_{i:08d}.JPEG": _photo_like_jpeg(rng, args.size)
             for i in range(1, args.n + 1)}
    testing.write_tar(manual / "ILSVRC2012_img_val.tar", files)
    n_ood, n_amb = max(1, args.n * 655 // 50000), max(1, args.n * 980 // 50000)
    ids = rng.permutation(np.arange(1, args.n + 1))
    testing.write_lists(manual, {int(i): "okapi" for i in ids[:n_ood]},
                        [int(i) for i in ids[n_ood:n_ood + n_amb]])
    mb = sum(len(v) for v in files.values()) / 2**20
    print(f"fake val tar: {args.n} JPEGs, {mb:.0f} MiB")

    t = time.perf_counter()
    ref = tfds.builder("imagenet2012", data_dir=str(root / "ref"))
    ref.download_and_prepare(download_config=tfds.download.DownloadConfig(
        manual_dir=str(manual), try_download_gcs=False))
    t_ref = time.perf_counter() - t
    t = time.perf_counter()
    build.build_dataset("fi_imagenet_1k", data_dir=str(root / "fi"), manual_dir=str(manual),
                        expected={"ood": n_ood, "ambiguous": n_amb,
                                  "id": args.n - n_ood - n_amb})
    t_fi = time.perf_counter() - t
  print(f"{'builder':<34}{'seconds':>9}{'images/s':>10}")
  print(f"{'tfds imagenet2012 (validation)':<34}{t_ref:9.1f}{args.n / t_ref:10.0f}")
  print(f"{'fi_imagenet_1k (ood+ambiguous+id)':<34}{t_fi:9.1f}{args.n / t_fi:10.0f}")
  print(f"ratio fi_imagenet_1k / imagenet2012: {t_fi / t_ref:.2f}x; at this rate 50k images "
        f"take ~{50000 / args.n * t_fi:.0f} s vs ~{50000 / args.n * t_ref:.0f} s")


if __name__ == "__main__":
  main()
