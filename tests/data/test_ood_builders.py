"""The other OOD builders' bad inputs, the shared archive / image helpers, per_class_subset."""
import numpy as np
import pytest
import tensorflow_datasets as tfds

from tfds_fi_imagenet import archives, images, members, subsets, testing
from tfds_fi_imagenet.inaturalist_ood import inaturalist_ood_dataset_builder as inat
from tfds_fi_imagenet.ninco import ninco_dataset_builder as ninco
from tfds_fi_imagenet.openimage_o import openimage_o_dataset_builder as oio
from tfds_fi_imagenet.ssb_hard import ssb_hard_dataset_builder as ssb

SSB = ["n01/n01_1.JPEG", "n01/n01_2.JPEG", "n02/n02_1.JPEG"]


def _tf():
  import tensorflow as tf
  return tf


# ----------------------------------------------------------------------------- images

def test_checked_image_keeps_jpeg_png_and_reencodes_gif():
  tf = _tf()
  for fmt in ("JPEG", "PNG"):
    data = testing.image_bytes(fmt, 8, 1)
    assert images.checked_image(data, "x") == data
  gif = testing.image_bytes("GIF", 8, 1)
  out = images.checked_image(gif, "x.gif")
  assert out.startswith(b"\x89PNG")
  assert tf.io.decode_image(out, channels=3).shape == (8, 8, 3)


@pytest.mark.parametrize("data", [testing.jpeg_bytes(64, 3)[:400], b"not an image",
                                  testing.image_bytes("PNG", 64, 3)[:200]])
def test_checked_image_rejects_corrupt_files(data):
  with pytest.raises(ValueError, match=r"Corrupt or unreadable image a/b.jpg in t.zip"):
    images.checked_image(data, "a/b.jpg in t.zip")


def test_verify_md5_names_file_and_escape_hatch(tmp_path):
  path = tmp_path / "NINCO_all.tar.gz"
  path.write_bytes(b"abc")
  images.verify_md5(path, "900150983cd24fb0d6963f7d28e17f72", "abc")
  with pytest.raises(ValueError, match=r"NINCO_all.tar.gz: MD5 of .* is 9001.*published MD5 is "
                     r"b9ff.*--skip_md5"):
    images.verify_md5(path, ninco.MD5, "NINCO_all.tar.gz")


# ----------------------------------------------------------------------------- archives

FILES = {"wrap/ssb_hard/n01/n01_1.JPEG": b"1", "wrap/ssb_hard/n01/n01_2.JPEG": b"2",
         "wrap/ssb_hard/n02/n02_1.JPEG": b"3", "__MACOSX/wrap/._x.JPEG": b"junk",
         "wrap/.DS_Store": b"junk"}


@pytest.mark.parametrize("kind", ["dir", "zip", "tar", "tar.gz"])
def test_archive_reads_every_kind_and_skips_hidden(tmp_path, kind):
  if kind == "dir":
    path = tmp_path / "d"
    testing.write_files(path, FILES)
  elif kind == "zip":
    path = testing.write_zip(tmp_path / "a.zip", FILES)
  else:
    path = testing.write_tar(tmp_path / f"a.{kind}", FILES)
  archive = archives.ImageArchive(path)
  got = dict(archive.iter_files())
  assert got == {k: v for k, v in FILES.items() if "._" not in k and "DS_" not in k}
  assert archive.random_access == (kind != "tar.gz")
  key_of = members.suffix_key(SSB)
  assert [key_of(n) for n in sorted(got)] == SSB
  archive.close()


def test_iter_wanted_missing_and_duplicate(tmp_path):
  files = {f"ssb_hard/{n}": testing.jpeg_bytes(8, i) for i, n in enumerate(SSB[:2])}
  for path in (testing.write_zip(tmp_path / "a.zip", files),
               testing.write_tar(tmp_path / "a.tar.gz", files)):
    archive = archives.ImageArchive(path)
    with pytest.raises(FileNotFoundError, match=r"1 listed image\(s\) are missing from .*: "
                       r"<n02/n02_1.JPEG>"):
      list(members.iter_wanted(archive, members.suffix_key(SSB), SSB, lambda k: f"<{k}>"))
  files["copy/ssb_hard/n01/n01_1.JPEG"] = files["ssb_hard/n01/n01_1.JPEG"]
  archive = archives.ImageArchive(testing.write_zip(tmp_path / "b.zip", files))
  with pytest.raises(ValueError, match=r"holds the same image twice: .*n01_1.JPEG"):
    list(members.iter_wanted(archive, members.suffix_key(SSB), SSB[:2], str))


# ----------------------------------------------------------------------------- OpenOOD sets

def _ssb_manual(tmp_path, lines=None, images=SSB, archive="zip"):
  manual = tmp_path / "manual"
  manual.mkdir(exist_ok=True)
  files = {f"ssb_hard/{n}": testing.jpeg_bytes(8, i) for i, n in enumerate(images)}
  if archive == "zip":
    testing.write_zip(manual / "ssb_hard.zip", files)
  elif archive == "dir":
    testing.write_files(manual / "images_largescale", files)
  if lines is None:
    lines = [f"ssb_hard/{n} -1" for n in SSB]
  (manual / "test_ssb_hard.txt").write_text("\n".join(lines) + "\n")
  return manual


def _prepare(cls, tmp_path, manual, expected):
  builder = cls(data_dir=str(tmp_path / "data"), expected=expected, file_format="array_record")
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=str(manual)))
  return builder


def test_ssb_hard_from_openood_folder_layout(tmp_path):
  manual = _ssb_manual(tmp_path, archive="dir")
  builder = _prepare(ssb.Builder, tmp_path, manual, {"test": 3, "classes": 2})
  assert builder.info.splits["test"].num_examples == 3
  assert builder.info.metadata["ood_class_names"] == ["n01", "n02"]


@pytest.mark.parametrize("lines,error,message", [
    (["ssb_hard/n01/n01_1.JPEG -1", "ninco/x.jpg -1"], ValueError,
     r"test_ssb_hard.txt line 2: 'ninco/x.jpg' is not a path under ssb_hard/"),
    (["ssb_hard/n01/n01_1.JPEG -1", "ssb_hard/n01/n01_1.JPEG -1"], ValueError,
     r"test_ssb_hard.txt line 2: duplicate image ssb_hard/n01/n01_1.JPEG \(first on line 1\)"),
    (["ssb_hard/n01/n01_1.JPEG -1", "ssb_hard/n09/n09_1.JPEG -1"], FileNotFoundError,
     r"missing from .*ssb_hard.zip: ssb_hard/n09/n09_1.JPEG \(test_ssb_hard.txt line 2\)"),
    (["ssb_hard/n01/n01_1.JPEG -1"], ValueError,
     r"test_ssb_hard.txt has 1 images, expected 3\..*--expect test=1"),
])
def test_ssb_hard_bad_lists(tmp_path, lines, error, message):
  manual = _ssb_manual(tmp_path, lines)
  with pytest.raises(error, match=message):
    _prepare(ssb.Builder, tmp_path, manual, {"test": 3 if len(lines) == 1 else 2})


def test_ssb_hard_missing_files_and_corrupt_image(tmp_path):
  manual = _ssb_manual(tmp_path)
  (manual / "test_ssb_hard.txt").unlink()
  with pytest.raises(FileNotFoundError, match=r"ssb_hard: the list test_ssb_hard.txt is missing"):
    _prepare(ssb.Builder, tmp_path, manual, {"test": 3})
  manual = _ssb_manual(tmp_path)
  (manual / "ssb_hard.zip").unlink()
  with pytest.raises(FileNotFoundError, match=r"ssb_hard: no ssb_hard.zip, ssb_hard.tar\[.gz\] "
                     r"or ssb_hard/ folder in the manual dir"):
    _prepare(ssb.Builder, tmp_path, manual, {"test": 3})
  manual = _ssb_manual(tmp_path)
  files = {f"ssb_hard/{n}": testing.jpeg_bytes(8, i) for i, n in enumerate(SSB)}
  files["ssb_hard/n02/n02_1.JPEG"] = b"\xff\xd8garbage"
  testing.write_zip(manual / "ssb_hard.zip", files)
  with pytest.raises(ValueError, match=r"Corrupt or unreadable image ssb_hard/n02/n02_1.JPEG in .*ssb_hard.zip: not a recognised image format"):
    _prepare(ssb.Builder, tmp_path, manual, {"test": 3})


def test_openimage_o_lists_must_be_disjoint(tmp_path):
  manual = tmp_path / "manual"
  names = [f"openimage_o/images/{i:016x}.jpg" for i in range(3)]
  testing.write_files(manual, {n: testing.jpeg_bytes(8, i) for i, n in enumerate(names)})
  (manual / "test_openimage_o.txt").write_text(f"{names[0]} -1\n{names[1]} -1\n")
  (manual / "val_openimage_o.txt").write_text(f"{names[2]} -1\n{names[1]} -1\n")
  with pytest.raises(ValueError, match=r"openimage_o/images/0000000000000001.jpg is in both "
                     r"test_openimage_o.txt \(line 2\) and val_openimage_o.txt \(line 2\)"):
    _prepare(oio.Builder, tmp_path, manual, {"test": 2, "validation": 2})


class _FakeDl:
  """download() returns a local file, extract() a local folder (no network)."""

  def __init__(self, archive, extracted):
    self.archive, self.extracted = archive, extracted

  def download(self, url):
    del url
    return self.archive

  def extract(self, resource):
    del resource
    return self.extracted


def test_download_builders_check_md5_and_layout(tmp_path):
  archive = tmp_path / "dl.tar.gz"
  archive.write_bytes(b"not the real archive")
  extracted = tmp_path / "x"
  extracted.mkdir()
  with pytest.raises(ValueError, match=r"NINCO_all.tar.gz: MD5 of .* published MD5"):
    ninco.Builder(data_dir=str(tmp_path))._split_generators(_FakeDl(archive, extracted))
  with pytest.raises(ValueError, match=r"iNaturalist.tar.gz: MD5 of .* published MD5"):
    inat.Builder(data_dir=str(tmp_path))._split_generators(_FakeDl(archive, extracted))
  b = ninco.Builder(data_dir=str(tmp_path), config="unit_tests", verify_md5=False)
  with pytest.raises(FileNotFoundError, match=r"ninco: no folder NINCO_OOD_unit_tests/ in the "
                     "extracted archive"):
    b._split_generators(_FakeDl(archive, extracted))
  testing.write_files(extracted, {"iNaturalist/images/a.jpg": b"", "other/a.jpg": b""})
  with pytest.raises(ValueError, match=r"inaturalist_ood: a.jpg appears twice"):
    inat.Builder(data_dir=str(tmp_path), verify_md5=False)._split_generators(
        _FakeDl(archive, extracted))


# ----------------------------------------------------------------------------- per-class subset

def _labelled(labels):
  tf = _tf()
  return tf.data.Dataset.from_tensor_slices(
      {"label": np.asarray(labels, np.int64), "idx": np.arange(len(labels))})


def test_per_class_subset_keeps_first_n_per_class_and_stops_reading():
  tf = _tf()
  labels = [0, 0, 1, -1, 0, 2, 1, 1, 2] + [0, 2, 1] * 1000  # all classes have 2 at index 8

  def guard(ex):  # reading on past index 9 (take_while's look-ahead) would trip this
    with tf.control_dependencies([tf.debugging.assert_less_equal(ex["idx"],
                                                                 tf.constant(9, tf.int64))]):
      return dict(ex)
  options = tf.data.Options()
  options.experimental_optimization.map_parallelization = False  # no read-ahead
  ds = _labelled(labels).map(guard).with_options(options)
  got = [int(ex["idx"]) for ex in subsets.per_class_subset(ds, 2, 3).as_numpy_iterator()]
  assert got == [0, 1, 2, 5, 6, 8]


def test_per_class_subset_shards_across_processes():
  labels = np.random.default_rng(0).integers(0, 5, 400)
  full = [int(ex["idx"]) for ex in
          subsets.per_class_subset(_labelled(labels), 7, 5).as_numpy_iterator()]
  assert len(full) == 35
  assert np.bincount(labels[full], minlength=5).tolist() == [7] * 5
  parts = [[int(ex["idx"]) for ex in subsets.per_class_subset(
      _labelled(labels), 7, 5, process_index=p, process_count=3).as_numpy_iterator()]
           for p in range(3)]
  assert sorted(sum(parts, [])) == sorted(full)
  assert [len(p) for p in parts] == subsets.per_class_subset_counts(7, 5, 3) == [12, 12, 11]
  with pytest.raises(ValueError, match="process_index 3 is not in"):
    subsets.per_class_subset(_labelled(labels), 7, 5, process_index=3, process_count=3)
