"""fi_imagenet_1k: list parsing, every bad-input error, the CLI and the fake-data helper.

Builds use array_record (no TensorFlow import) except where tfds.load must read the result.
"""
import os
import shutil
import subprocess
import sys

import pytest
import tensorflow_datasets as tfds

import tfds_fi_imagenet
from tfds_fi_imagenet import errors, imagenet_val, ood_classes, testing
from tfds_fi_imagenet.fi_imagenet_1k import fi_imagenet_1k_dataset_builder as fi

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DUMMY = os.path.join(REPO, "tfds_fi_imagenet", "fi_imagenet_1k", "dummy_data")
SMALL = {"ood": 2, "ambiguous": 1, "id": 2}


def _manual(tmp_path, ood=None, ambiguous="ILSVRC2012_val_00000003.JPEG\n", n=5,
            corrupt=(), extra=None):
  """A manual dir: val tar with ids 1..n, the two lists (ood default: ids 1, 2)."""
  manual = tmp_path / "manual"
  manual.mkdir()
  files = {f"ILSVRC2012_val_{i:08d}.JPEG": testing.jpeg_bytes(16, seed=i) for i in range(1, n + 1)}
  for i in corrupt:
    files[f"ILSVRC2012_val_{i:08d}.JPEG"] = files[f"ILSVRC2012_val_{i:08d}.JPEG"][:300]
  files.update(extra or {})
  testing.write_tar(manual / fi.VAL_TAR, files)
  if ood is None:
    ood = "ILSVRC2012_val_00000001.JPEG,okapi\nILSVRC2012_val_00000002.JPEG,kiwi\n"
  (manual / fi.OOD_LIST).write_text(ood)
  (manual / fi.AMBIGUOUS_LIST).write_text(ambiguous)
  return manual


def _prepare(tmp_path, manual, expected=SMALL):
  builder = fi.Builder(data_dir=str(tmp_path / "data"), expected=expected,
                       file_format="array_record")
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=str(manual)))
  return builder


# ----------------------------------------------------------------------------- list parsing

def test_parse_list_accepts_all_line_forms(tmp_path):
  path = tmp_path / "l.txt"
  path.write_bytes(
      "\ufeffimage\tclass\r\n# comment\r\n\r\n"
      "ILSVRC2012_val_00000002.JPEG,hot  air balloon \r\n"
      "/x/val/n01/ILSVRC2012_val_00000003.JPEG\tokapi\r\n"
      '7,ILSVRC2012_val_00000007.JPEG,"kiwi, ""fruit"""\r\n'
      "ILSVRC2012_val_00000009\r\n"
      "ILSVRC2012_val_00000010.JPEG,\r\n".encode())
  got = [(e.val_id, e.line, e.ood_class) for e in imagenet_val.parse_list(path, True)]
  assert got == [(2, 4, "hot air balloon"), (3, 5, "okapi"), (7, 6, 'kiwi, "fruit"'),
                 (9, 7, ""), (10, 8, "")]
  assert [e.ood_class for e in imagenet_val.parse_list(path, False)] == [""] * 5


def test_class_ids_are_sorted_names_and_minus_one():
  names, lookup = ood_classes.class_ids(["okapi", "", "hot air balloon", "okapi"])
  assert names == ["hot air balloon", "okapi"]
  assert [lookup[n] for n in ["okapi", "", "hot air balloon"]] == [1, -1, 0]


def test_validation_labels_come_from_installed_tfds():
  wnids = imagenet_val.validation_wnids()
  labels = imagenet_val.label_names_file().read_text().split()
  assert len(wnids) == 50_000 and len(labels) == 1000
  assert [labels.index(w) for w in wnids[:5]] == [65, 970, 230, 809, 516]


# ----------------------------------------------------------------------------- bad inputs

def test_duplicate_in_a_list(tmp_path):
  manual = _manual(tmp_path, ood="ILSVRC2012_val_00000002.JPEG,a\nval/ILSVRC2012_val_00000002.JPEG,b\n")
  with pytest.raises(ValueError, match=r"fi_imagenet_1k_ood.txt line 2: duplicate image "
                     r"ILSVRC2012_val_00000002.JPEG \(first on line 1\)"):
    _prepare(tmp_path, manual)


def test_overlap_between_lists(tmp_path):
  manual = _manual(tmp_path, ambiguous="ILSVRC2012_val_00000004.JPEG\nILSVRC2012_val_00000002.JPEG\n")
  with pytest.raises(ValueError, match=r"ILSVRC2012_val_00000002.JPEG is in both "
                     r"fi_imagenet_1k_ood.txt \(line 2\) and fi_imagenet_1k_ambiguous.txt "
                     r"\(line 2\)"):
    _prepare(tmp_path, manual)


@pytest.mark.parametrize("bad", ["ILSVRC2012_val_00050001.JPEG", "ILSVRC2012_val_00000000",
                                 "ILSVRC2012_val_0000002.JPEG"])
def test_unknown_id(tmp_path, bad):
  manual = _manual(tmp_path, ood=f"ILSVRC2012_val_00000001.JPEG,a\n{bad},b\n")
  with pytest.raises(ValueError, match=r"fi_imagenet_1k_ood.txt line 2: unknown image id "):
    _prepare(tmp_path, manual)


def test_line_without_image(tmp_path):
  manual = _manual(tmp_path, ood="ILSVRC2012_val_00000001.JPEG,a\nokapi\n")
  with pytest.raises(ValueError, match=r"line 2: no ILSVRC2012_val_<8 digits> image name"):
    _prepare(tmp_path, manual)


def test_missing_image(tmp_path):
  manual = _manual(tmp_path, ood="ILSVRC2012_val_00000001.JPEG,a\nILSVRC2012_val_00000011.JPEG,b\n")
  with pytest.raises(FileNotFoundError, match=r"1 listed image\(s\) are missing from .*"
                     r"ILSVRC2012_val_00000011.JPEG \(fi_imagenet_1k_ood.txt line 2\)"):
    _prepare(tmp_path, manual)


def test_corrupt_jpeg(tmp_path):
  manual = _manual(tmp_path, corrupt=[4])
  with pytest.raises(ValueError, match=r"Corrupt or unreadable image "
                     r"ILSVRC2012_val_00000004.JPEG in .*ILSVRC2012_img_val.tar"):
    _prepare(tmp_path, manual)


def test_wrong_counts(tmp_path):
  manual = _manual(tmp_path)
  with pytest.raises(ValueError, match=r"fi_imagenet_1k_ood.txt has 2 images, expected 655\."):
    _prepare(tmp_path, manual, expected=None)
  with pytest.raises(ValueError, match=r"ILSVRC2012_img_val.tar minus both lists has 2 images, "
                     r"expected 3\. Is the validation tar complete"):
    _prepare(tmp_path, manual, expected={"ood": 2, "ambiguous": 1, "id": 3})


def test_missing_manual_files(tmp_path):
  manual = _manual(tmp_path)
  (manual / fi.AMBIGUOUS_LIST).unlink()
  with pytest.raises(FileNotFoundError, match=r"the list fi_imagenet_1k_ambiguous.txt is "
                     r"missing from the manual dir"):
    _prepare(tmp_path, manual)
  (manual / fi.VAL_TAR).unlink()
  with pytest.raises(FileNotFoundError, match=r"neither ILSVRC2012_img_val.tar nor "
                     r"ILSVRC2012_img_val/ is in the manual dir"):
    _prepare(tmp_path, manual)


def test_non_validation_member_and_unknown_count_key(tmp_path):
  manual = _manual(tmp_path, extra={"ILSVRC2012_val_00050001.JPEG": b"x"})
  with pytest.raises(ValueError, match=r"'ILSVRC2012_val_00050001.JPEG' is not an ImageNet-1k "
                     "validation image"):
    _prepare(tmp_path, manual)
  with pytest.raises(errors.UsageError, match=r"unknown count key\(s\) \['train'\]"):
    fi.Builder(data_dir=str(tmp_path), expected={"train": 3})


def test_extracted_folder_with_subfolders(tmp_path):
  manual = _manual(tmp_path)
  (manual / fi.VAL_TAR).unlink()
  val = manual / fi.VAL_DIR
  testing.write_files(val, {f"n0{i % 2}/ILSVRC2012_val_{i:08d}.JPEG": testing.jpeg_bytes(16, i)
                            for i in range(1, 6)})
  testing.write_files(val, {"n01/ILSVRC2012_val_00000001.xml": b"<annotation/>"})  # ignored
  builder = _prepare(tmp_path, manual)
  assert {k: v.num_examples for k, v in builder.info.splits.items()} == SMALL
  src = tfds.data_source("fi_imagenet_1k", split="ood", data_dir=str(tmp_path / "data"),
                         download=False)
  assert [src[i]["file_name"] for i in range(2)] == [b"ILSVRC2012_val_00000001.JPEG",
                                                      b"ILSVRC2012_val_00000002.JPEG"]
  assert [src[i]["ood_class_id"] for i in range(2)] == [1, 0]  # kiwi 0, okapi 1
  # the same image twice in the folder is an error
  testing.write_files(val, {"extra/ILSVRC2012_val_00000005.JPEG": testing.jpeg_bytes(16, 5)})
  shutil.rmtree(tmp_path / "data")
  with pytest.raises(ValueError, match=r"holds the same image twice: .*ILSVRC2012_val_00000005"):
    _prepare(tmp_path, manual)


# ----------------------------------------------------------------------------- CLI

def _cli(*args):
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.run([sys.executable, "-m", "tfds_fi_imagenet", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_build_then_tfds_load(tmp_path):
  data_dir = str(tmp_path / "data")
  r = _cli("build", "fi_imagenet_1k", f"--manual_dir={DUMMY}", f"--data_dir={data_dir}",
           "--expect", "ood=5", "--expect", "ambiguous=2", "--expect", "id=3")
  assert r.returncode == 0, r.stderr[-2000:]
  assert "Built fi_imagenet_1k/1.0.0" in r.stdout
  ds = tfds.load("fi_imagenet_1k", split="ood", data_dir=data_dir, download=False)
  exs = list(tfds.as_numpy(ds))
  assert [ex["file_name"] for ex in exs][0] == b"ILSVRC2012_val_00000002.JPEG"
  assert [int(ex["ood_class_id"]) for ex in exs] == [0, 0, 2, 1, -1]
  assert exs[0]["image"].shape == (16, 16, 3)
  assert tfds.builder("fi_imagenet_1k", data_dir=data_dir).info.splits["id"].num_examples == 3


@pytest.mark.parametrize("args,code,message", [
    (["build", "fi_imagenet", "--manual_dir=/x", "--data_dir=/tmp/x"], 2,
     "Unknown dataset 'fi_imagenet'; this package builds: fi_imagenet_1k, imagenet2012, imagenet_es, imagenet_o, inaturalist_ood"),
    (["build", "fi_imagenet_1k", "--manual_dir=/nonexistent/m", "--data_dir=/tmp/x"], 2,
     "Manual dir /nonexistent/m does not exist"),
    (["build", "fi_imagenet_1k", "--data_dir=/tmp/x"], 2, "fi_imagenet_1k needs --manual_dir"),
    (["build", "ninco", "--config=nope", "--data_dir=/tmp/x"], 2, "ninco has no config 'nope'"),
    (["build", "fi_imagenet_1k", "--expect", "ood", "--manual_dir=/x", "--data_dir=/x"], 2,
     "--expect takes SPLIT=COUNT"),
    (["build"], 2, "the following arguments are required: name, --data_dir"),
])
def test_cli_errors_are_one_line(args, code, message):
  r = _cli(*args)
  assert r.returncode == code
  assert message in r.stderr
  assert len(r.stderr.strip().splitlines()) == 1, r.stderr
  assert "Traceback" not in r.stderr


def test_cli_invalid_data_exits_1(tmp_path):
  r = _cli("build", "fi_imagenet_1k", f"--manual_dir={DUMMY}", f"--data_dir={tmp_path}",
           "--file_format=array_record")
  assert r.returncode == 1
  assert "fi_imagenet_1k_ood.txt has 5 images, expected 655" in r.stderr.strip().splitlines()[-1]
  assert "Traceback" not in r.stderr


# ----------------------------------------------------------------------------- fake helper

def test_make_fake_fi_imagenet(tmp_path):
  data_dir = testing.make_fake_fi_imagenet(tmp_path, n_id=6, n_ood=4, n_ambiguous=2,
                                           image_size=24)
  builder = tfds.builder("fi_imagenet_1k", data_dir=data_dir)
  assert {k: v.num_examples for k, v in builder.info.splits.items()} == {
      "ood": 4, "ambiguous": 2, "id": 6}
  assert builder.info.metadata["ood_class_names"] == sorted(testing.FAKE_OOD_CLASSES)
  exs = list(tfds.as_numpy(tfds.load("fi_imagenet_1k", split="ood", data_dir=data_dir,
                                     download=False)))
  ids = [int(ex["ood_class_id"]) for ex in exs]
  assert sorted(ids) == [-1, 0, 1, 2] and exs[0]["image"].shape == (24, 24, 3)
  wnids = imagenet_val.validation_wnids()
  names = builder.info.features["label"].names
  for ex in exs:  # labels are the real ImageNet labels of the fake ids
    assert names[int(ex["label"])] == wnids[int(ex["file_name"][15:23]) - 1]


def test_package_registers_every_builder():
  registered = set(tfds.list_builders(with_community_datasets=False))
  assert set(tfds_fi_imagenet.DATASETS) <= registered
