"""A truncated or corrupt archive is one error naming the file, from the API and the CLI."""
import gzip
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from tfds_fi_imagenet import archives, errors, testing

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DUMMY = os.path.join(REPO, "tfds_fi_imagenet", "fi_imagenet_1k", "dummy_data")
VAL_TAR = "ILSVRC2012_img_val.tar"


def _truncated_copy(tmp_path, cut_from_end: int):
  manual = tmp_path / "manual"
  shutil.copytree(DUMMY, manual)
  tar = manual / VAL_TAR
  data = tar.read_bytes()
  # a tar ends with two 512-byte zero blocks (padded to 10 KiB); cut into the last member
  end = len(data.rstrip(b"\0"))
  tar.write_bytes(data[:end - cut_from_end])
  return manual


def test_truncated_tar_cli_is_one_line_naming_the_file(tmp_path):
  manual = _truncated_copy(tmp_path, 100)
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
  r = subprocess.run([sys.executable, "-m", "tfds_fi_imagenet", "build", "fi_imagenet_1k",
                      f"--manual_dir={manual}", f"--data_dir={tmp_path / 'data'}",
                      "--file_format=array_record", "--expect", "ood=5", "--expect",
                      "ambiguous=2", "--expect", "id=3"],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 2, r.stderr[-2000:]
  assert "Traceback" not in r.stderr
  last = r.stderr.strip().splitlines()[-1]
  assert f"{manual / VAL_TAR}" in last and "truncated or corrupt" in last, r.stderr


@pytest.mark.parametrize("kind", ["tar", "zip", "tar.gz"])
def test_truncated_archives_raise_usage_error(tmp_path, kind):
  files = {f"img_{i}.jpg": testing.jpeg_bytes(32, seed=i) for i in range(3)}
  path = tmp_path / f"images.{kind}"
  if kind == "zip":

    with zipfile.ZipFile(path, "w") as z:
      for k, v in files.items():
        z.writestr(k, v)
  else:
    testing.write_tar(tmp_path / "images.tar", files)
    if kind == "tar.gz":

      path.write_bytes(gzip.compress((tmp_path / "images.tar").read_bytes()))
  data = path.read_bytes()
  path.write_bytes(data[:len(data) * 2 // 3])
  archive = archives.ImageArchive(path)
  with pytest.raises(errors.UsageError, match=r"Cannot read .*images\." + kind.replace(".", r"\.")
                     + r".*truncated or corrupt"):
    for name in (archive.names() if archive.random_access else []):
      archive.read(name)
    list(archive.iter_files())


def test_every_mismatching_count_is_listed_at_once(tmp_path):
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
  r = subprocess.run([sys.executable, "-m", "tfds_fi_imagenet", "build", "fi_imagenet_1k",
                      f"--manual_dir={DUMMY}", f"--data_dir={tmp_path / 'data'}",
                      "--file_format=array_record", "--expect", "ood=6", "--expect",
                      "ambiguous=9", "--expect", "id=4"],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 1, r.stderr[-2000:]
  last = r.stderr.strip().splitlines()[-1]
  assert "3 count(s) differ" in last, last
  for part in ("has 5 images, expected 6", "has 2 images, expected 9", "has 3 images, expected 4",
               "--expect ood=5 --expect ambiguous=2 --expect id=3"):
    assert part in last, (part, last)
