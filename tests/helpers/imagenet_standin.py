"""A small imagenet2012 built by the project's own builder from a tar in the real layout
(ILSVRC2012_img_train.tar holding one <wnid>.tar of JPEGs per class)."""
import io
import tarfile

from tensorflow_datasets.datasets.imagenet2012 import imagenet_common

from tfds_fi_imagenet import __main__ as cli
from tfds_fi_imagenet import testing


def _tar_bytes(files):
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
    for name, payload in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(payload)
      tar.addfile(info, io.BytesIO(payload))
  return buf.getvalue()


def build_imagenet2012(root, n_classes: int, per_class: int) -> str:
  """The TFDS data_dir of an imagenet2012 with the first `n_classes` classes x `per_class`
  generated 16 px JPEGs, built under `root` with `python -m tfds_fi_imagenet build`."""
  with open(imagenet_common.label_names_file()) as f:
    wnids = f.read().split()[:n_classes]
  inner = {f"{w}.tar": _tar_bytes({f"{w}_{i}.JPEG": testing.jpeg_bytes(16, seed=10 * c + i)
                                   for i in range(per_class)})
           for c, w in enumerate(wnids)}
  testing.write_tar(root / "manual" / "ILSVRC2012_img_train.tar", inner)
  data_dir = str(root / "data")
  rc = cli.main(["build", "imagenet2012", f"--manual_dir={root / 'manual'}",
                 f"--data_dir={data_dir}", f"--expect=train={n_classes * per_class}",
                 f"--expect=classes={n_classes}"])
  assert rc == 0
  return data_dir
