"""Downloading builders offline: one line in seconds without network, the archive from
--manual_dir (checked against the recorded checksum); the new OOD sets from archives written
in their real layout."""
import dataclasses
import os
import socket
import subprocess
import sys
import time

import pytest
import tensorflow_datasets as tfds

from tfds_fi_imagenet import build, downloads, images, testing
from tfds_fi_imagenet.imagenet_o import imagenet_o_dataset_builder as imagenet_o
from tfds_fi_imagenet.ninco import ninco_dataset_builder as ninco
from tfds_fi_imagenet.places_ood import places_ood_dataset_builder as places
from tfds_fi_imagenet.sun_ood import sun_ood_dataset_builder as sun

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the network is unreachable: every name lookup fails at once (as without a route / DNS)
NO_NETWORK = """
import socket, sys
def _unreachable(*args, **kwargs):
  raise socket.gaierror(-3, "Temporary failure in name resolution")
socket.getaddrinfo = _unreachable
from tfds_fi_imagenet.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def no_network(monkeypatch):
  def unreachable(*args, **kwargs):
    raise socket.gaierror(-3, "Temporary failure in name resolution")
  monkeypatch.setattr(socket, "getaddrinfo", unreachable)


def _cli_offline(tmp_path, *args):
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
  t = time.time()
  r = subprocess.run([sys.executable, "-c", NO_NETWORK, *args], cwd=REPO, env=env,
                     capture_output=True, text=True, timeout=120)
  return r, time.time() - t


@pytest.mark.slow
def test_ninco_without_network_is_one_line_within_seconds(tmp_path):
  r, seconds = _cli_offline(tmp_path, "build", "ninco", f"--data_dir={tmp_path / 'data'}")
  assert r.returncode == 2, r.stderr[-2000:]
  assert seconds < 10, seconds
  lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
  assert len(lines) == 1, lines
  assert ("ninco: cannot download without network" in lines[0]
          and "NINCO_all.tar.gz from https://zenodo.org/record/8013288/files/NINCO_all.tar.gz"
          in lines[0] and "--manual_dir" in lines[0]), lines[0]


def test_ninco_cli_with_archive_in_manual_dir_builds_without_network(tmp_path, no_network,
                                                                      capsys):
  # the same command with the archive in --manual_dir (in-process: TF is loaded already); the
  # stand-in archive has another MD5, hence --skip_md5 (the MD5 check is tested below)
  from tfds_fi_imagenet.__main__ import main
  archive = _ninco_manual(tmp_path)
  assert main(["build", "ninco", f"--data_dir={tmp_path / 'data'}",
               f"--manual_dir={archive.parent}", "--skip_md5", "--expect", "test=3",
               "--expect", "classes=2"]) == 0
  out = capsys.readouterr().out
  assert "Built ninco/ood_classes/1.0.0" in out and "test: 3" in out, out


NINCO_FILES = {"NINCO/NINCO_OOD_classes/okapi/okapi_1.jpg": 1,
               "NINCO/NINCO_OOD_classes/okapi/okapi_2.jpg": 2,
               "NINCO/NINCO_OOD_classes/kiwi/kiwi_1.png": 3,
               "NINCO/NINCO_OOD_unit_tests/black/black_1.jpg": 4}


def _ninco_manual(tmp_path):
  files = {n: testing.image_bytes("PNG" if n.endswith("png") else "JPEG", 16, s)
           for n, s in NINCO_FILES.items()}
  return testing.write_tar(tmp_path / "manual" / "NINCO_all.tar.gz", files)


def test_ninco_builds_offline_from_manual_dir_after_checking_md5(tmp_path, no_network,
                                                                  monkeypatch):
  archive = _ninco_manual(tmp_path)
  kw = dict(data_dir=str(tmp_path / "data"), manual_dir=str(archive.parent),
            expected={"test": 3, "classes": 2})
  with pytest.raises(ValueError, match=r"ninco: NINCO_all.tar.gz: MD5 of .*manual"
                     r"/NINCO_all.tar.gz is [0-9a-f]{32}, the published MD5 is b9ff"):
    build.build_dataset("ninco", **kw)
  monkeypatch.setattr(ninco, "ARCHIVE", dataclasses.replace(ninco.ARCHIVE,
                                                            md5=images.md5_of(archive)))
  b = build.build_dataset("ninco", **kw)
  exs = list(tfds.as_numpy(b.as_dataset(split="test")))
  assert [e["file_name"].decode() for e in exs] == [
      "NINCO_OOD_classes/kiwi/kiwi_1.png", "NINCO_OOD_classes/okapi/okapi_1.jpg",
      "NINCO_OOD_classes/okapi/okapi_2.jpg"]
  assert [int(e["ood_class_id"]) for e in exs] == [0, 1, 1]


def test_sha256_registered_archive_is_checked_in_manual_dir(tmp_path):
  path = tmp_path / "dtd-r1.0.1.tar.gz"
  path.write_bytes(b"not dtd")
  archive = downloads.Archive(url="https://example.org/dtd-r1.0.1.tar.gz",
                              filename=path.name)
  with pytest.raises(ValueError, match=r"SHA-256 of .*dtd-r1.0.1.tar.gz is [0-9a-f]{64}, the registered one "
                     r"\(checksums.tsv\) is e428"):
    downloads.verify(path, archive, "e42855a52a4950a3b59612834602aa25", "textures_ood")


def test_archive_in_manual_dir_or_cache_needs_no_network(tmp_path, no_network):
  b = ninco.Builder(data_dir=str(tmp_path / "data"))
  _ninco_manual(tmp_path)
  downloads.require_network(b, b.archives(), manual_dir=str(tmp_path / "manual"),
                            download_dir=tmp_path / "dl")           # no error: it is there
  with pytest.raises(FileNotFoundError, match=r"ninco: cannot download without network"):
    downloads.require_network(b, b.archives(), manual_dir=None, download_dir=tmp_path / "dl")


def _md5_matching(monkeypatch, module, path):
  monkeypatch.setattr(module, "ARCHIVE", dataclasses.replace(module.ARCHIVE,
                                                             md5=images.md5_of(path)))
  if hasattr(module.Builder, "ARCHIVE"):
    monkeypatch.setattr(module.Builder, "ARCHIVE", module.ARCHIVE)


IMAGENET_O = ["n01443537/benthos_0.9994893.JPEG", "n01443537/tetra_0.99716717.JPEG",
              "n01704323/tooth_0.9914603.JPEG", "n02074367/dolphin_0.9996773.JPEG"]


def test_imagenet_o_from_real_layout_tar(tmp_path, no_network, monkeypatch):
  files = {"imagenet-o/README.txt": b"readme"}
  files.update({f"imagenet-o/{n}": testing.jpeg_bytes(16, i) for i, n in enumerate(IMAGENET_O)})
  tar = testing.write_tar(tmp_path / "manual" / "imagenet-o.tar", files)
  _md5_matching(monkeypatch, imagenet_o, tar)
  b = build.build_dataset("imagenet_o", data_dir=str(tmp_path / "data"),
                          manual_dir=str(tar.parent), expected={"test": 4, "classes": 3})
  exs = list(tfds.as_numpy(b.as_dataset(split="test")))
  assert [e["file_name"].decode() for e in exs] == [f"imagenet_o/{n}" for n in IMAGENET_O]
  assert [int(e["ood_class_id"]) for e in exs] == [0, 0, 1, 2]
  assert b.info.metadata["ood_class_names"] == ["n01443537", "n01704323", "n02074367"]
  with pytest.raises(ValueError, match=r"imagenet_o: 2 count\(s\) differ.*has 4 images, "
                     r"expected 2000.*has 3 classes, expected 200"):
    build.build_dataset("imagenet_o", data_dir=str(tmp_path / "data2"),
                        manual_dir=str(tar.parent))


@pytest.mark.parametrize("module,folder,names,classes", [
    (sun, "SUN", ["sun_aaaevyiuguntlerb.jpg", "sun_bzuxwqgpzhduudpw.jpg"], ["", ""]),
    (places, "Places", ["b_badlands_00000038.jpg", "f_forest_broadleaf_00001658.jpg",
                        "Places365_val_00012755.jpg"], ["badlands", "forest_broadleaf", ""]),
])
def test_mos_sets_from_real_layout_archives(tmp_path, no_network, monkeypatch, module, folder,
                                            names, classes):
  name = module.Builder.name
  files = {f"{folder}/images/{n}": testing.jpeg_bytes(16, i) for i, n in enumerate(names)}
  tgz = testing.write_tar(tmp_path / "manual" / module.ARCHIVE.filename, files)
  _md5_matching(monkeypatch, module, tgz)
  b = build.build_dataset(name, data_dir=str(tmp_path / "data"), manual_dir=str(tgz.parent),
                          expected={"test": len(names)})
  exs = list(tfds.as_numpy(b.as_dataset(split="test")))
  prefix = folder.lower()
  got = {e["file_name"].decode(): e["ood_class"].decode() for e in exs}
  assert got == {f"{prefix}/images/{n}": c for n, c in zip(names, classes)}
  named = sorted(c for c in classes if c)
  assert b.info.metadata["ood_class_names"] == named
  assert all(int(e["ood_class_id"]) == (named.index(got[e["file_name"].decode()])
                                        if got[e["file_name"].decode()] else -1) for e in exs)


def test_sun_classes_from_mos_selected_list_in_manual_dir(tmp_path, no_network, monkeypatch):
  names = ["sun_aaaevyiuguntlerb.jpg", "sun_bsqlhpesrcwkeozl.jpg", "sun_czzzzzzzzzzzzzzz.jpg"]
  files = {f"SUN/images/{n}": testing.jpeg_bytes(16, i) for i, n in enumerate(names)}
  tgz = testing.write_tar(tmp_path / "manual" / "SUN.tar.gz", files)
  _md5_matching(monkeypatch, sun, tgz)
  (tmp_path / "manual" / "sun_selected_list.txt").write_text(
      "s/ski_slope/sun_aaaevyiuguntlerb.jpg 324\n"
      "w/waterfall/block/sun_bsqlhpesrcwkeozl.jpg 383\n")   # the third file is not listed
  b = build.build_dataset("sun_ood", data_dir=str(tmp_path / "data"),
                          manual_dir=str(tgz.parent), expected={"test": 3})
  got = {e["file_name"].decode(): (e["ood_class"].decode(), int(e["ood_class_id"]))
         for e in tfds.as_numpy(b.as_dataset(split="test"))}
  assert got == {"sun/images/sun_aaaevyiuguntlerb.jpg": ("ski_slope", 0),
                 "sun/images/sun_bsqlhpesrcwkeozl.jpg": ("waterfall/block", 1),
                 "sun/images/sun_czzzzzzzzzzzzzzz.jpg": ("", -1)}
  assert b.info.metadata["ood_class_names"] == ["ski_slope", "waterfall/block"]
