"""Tiny stand-ins of the real configs' datasets, for trying them without the real data.

  python -m tfds_fi_imagenet.standin --data_dir=DIR [--classes=20] [--per_class=10]
      [--fi_id=40] [--fi_ood=20] [--fi_ambiguous=4] [--image_size=32]

builds into the TFDS data_dir DIR, through this package's own builders and from generated noise
JPEGs in the real file layouts (nothing is downloaded; the manual files go to DIR/standin_manual):

  imagenet2012    train: the first CLASSES ImageNet classes x PER_CLASS images, from an
                  ILSVRC2012_img_train.tar of per-class tars (the builder's counts checked with
                  --expect train=CLASSES*PER_CLASS --expect classes=CLASSES)
  fi_imagenet_1k  id / ood / ambiguous: FI_ID / FI_OOD / FI_AMBIGUOUS images of a fake
                  ILSVRC2012_img_val.tar and the two lists

The real configs then run on them with `data_dir=DIR,ood=fi_imagenet_1k` and `random_init=True`
(or a checkpoint), e.g. (README.md, "From a fresh clone"):

  python main.py --config=configs/vit.py:random_init=True,data_dir=DIR,ood=fi_imagenet_1k,fit_per_class=5,variant=Ti/16,res=64 --workdir=runs/try

`fit_per_class=N` takes N images of each of the CLASSES classes the stand-in has (preflight says
so, with the numbers). The images are noise: the metrics say nothing about any model; the route
(preflight, set sizes, extraction, cache, detectors, report, compare) is the real one.
Exit codes as `python -m tfds_fi_imagenet`: 0 built, 2 bad usage, 1 a build failed.
"""
from __future__ import annotations

import argparse
import io
import sys
import tarfile
from typing import Optional, Sequence

from etils import epath

from tfds_fi_imagenet import testing

PROG = "python -m tfds_fi_imagenet.standin"


def _tar_bytes(files: dict[str, bytes]) -> bytes:
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
    for name, payload in files.items():
      info = tarfile.TarInfo(name)
      info.size, info.mtime, info.mode = len(payload), 0, 0o644
      tar.addfile(info, io.BytesIO(payload))
  return buf.getvalue()


def imagenet2012(data_dir: str, manual_dir: str, classes: int, per_class: int,
                 image_size: int = 16) -> None:
  """imagenet2012 `train` with the first `classes` classes x `per_class` generated JPEGs, built
  by `python -m tfds_fi_imagenet build imagenet2012` from a train tar in the real layout."""
  from tensorflow_datasets.datasets.imagenet2012 import imagenet_common

  from tfds_fi_imagenet import __main__ as cli
  with open(imagenet_common.label_names_file()) as f:
    wnids = f.read().split()[:classes]
  inner = {f"{w}.tar": _tar_bytes({f"{w}_{i}.JPEG": testing.jpeg_bytes(image_size, seed=10 * c + i)
                                   for i in range(per_class)})
           for c, w in enumerate(wnids)}
  testing.write_tar(epath.Path(manual_dir) / "ILSVRC2012_img_train.tar", inner)
  rc = cli.main(["build", "imagenet2012", f"--manual_dir={manual_dir}", f"--data_dir={data_dir}",
                 f"--expect=train={classes * per_class}", f"--expect=classes={classes}"])
  if rc:
    raise RuntimeError(f"building the imagenet2012 stand-in failed (exit {rc}).")


def fi_imagenet_1k(data_dir: str, manual_dir: str, n_id: int, n_ood: int, n_ambiguous: int,
                   image_size: int = 16) -> None:
  """fi_imagenet_1k from a fake val tar of n_id + n_ood + n_ambiguous JPEGs and the two lists
  (`testing.make_fake_fi_imagenet`'s files), built into `data_dir`."""
  from tfds_fi_imagenet import build
  n = n_id + n_ood + n_ambiguous
  ood_ids = list(range(1, n_ood + 1))
  ood = {i: testing.FAKE_OOD_CLASSES[k % len(testing.FAKE_OOD_CLASSES)]
         for k, i in enumerate(ood_ids)}
  testing.write_val_tar(epath.Path(manual_dir) / "ILSVRC2012_img_val.tar", range(1, n + 1),
                        size=image_size)
  testing.write_lists(manual_dir, ood, range(n_ood + 1, n_ood + n_ambiguous + 1))
  build.build_dataset("fi_imagenet_1k", data_dir=data_dir, manual_dir=manual_dir,
                      expected={"id": n_id, "ood": n_ood, "ambiguous": n_ambiguous})


def _count(low: int):
  def parse(text: str) -> int:
    if not text.isdigit() or int(text) < low:
      raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
    return int(text)
  return parse


class _Parser(argparse.ArgumentParser):
  def error(self, message):
    self.exit(2, f"{PROG}: error: {message} (see {PROG} --help)\n")


def parser() -> argparse.ArgumentParser:
  """The command line's parser (its defaults are the stand-ins' sizes)."""
  p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
              epilog="See the module docstring (tfds_fi_imagenet/standin.py) and README.md.")
  p.add_argument("--data_dir", required=True, help="the TFDS data_dir the stand-ins go into")
  p.add_argument("--classes", type=_count(1), default=20,
                 help="ImageNet classes of the imagenet2012 stand-in (default 20, at most 1000)")
  p.add_argument("--per_class", type=_count(1), default=10,
                 help="images per class of the imagenet2012 stand-in (default 10)")
  p.add_argument("--fi_id", type=_count(1), default=40, help="fi_imagenet_1k id images (40)")
  p.add_argument("--fi_ood", type=_count(1), default=20, help="fi_imagenet_1k ood images (20)")
  p.add_argument("--fi_ambiguous", type=_count(0), default=4,
                 help="fi_imagenet_1k ambiguous images (4)")
  p.add_argument("--image_size", type=_count(8), default=32, help="the JPEGs' side in pixels (32)")
  return p


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = parser()
  args = p.parse_args(argv)
  if args.classes > 1000:
    p.error(f"--classes: ImageNet has 1000 classes, got {args.classes}")
  data_dir = epath.Path(args.data_dir)
  manual = data_dir / "standin_manual"
  try:
    imagenet2012(str(data_dir), str(manual / "imagenet2012"), args.classes, args.per_class,
                 args.image_size)
    fi_imagenet_1k(str(data_dir), str(manual / "fi_imagenet_1k"), args.fi_id, args.fi_ood,
                   args.fi_ambiguous, args.image_size)
  except (ValueError, RuntimeError, OSError) as e:
    print(f"{PROG}: error: {' '.join(str(e).split())}", file=sys.stderr)
    return 1
  print(f"Stand-ins in {data_dir}: imagenet2012 train ({args.classes} classes x "
        f"{args.per_class}), fi_imagenet_1k (id {args.fi_id}, ood {args.fi_ood}, ambiguous "
        f"{args.fi_ambiguous}). Noise images: for trying the configs, not for results.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
