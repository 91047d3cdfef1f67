"""The overlap tool: every planted exact and resized duplicate found, no false positive among
1,000 distinct images; the pHash's DCT equals scipy's; drop_overlaps removes what the report
lists and the loader renumbers the rest."""
import dataclasses
import io
import json
import socket

import numpy as np
import pytest
from PIL import Image

from tfds_fi_imagenet import build, images, overlap, testing
from tfds_fi_imagenet.places_ood import places_ood_dataset_builder as places
from tfds_fi_imagenet.sun_ood import sun_ood_dataset_builder as sun


def _smooth_image(rng, size=32) -> Image.Image:
  """A distinct natural-looking image: a random 6x6 colour grid, bicubic-upsampled, with noise."""
  grid = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
  img = np.asarray(Image.fromarray(grid).resize((size, size), Image.Resampling.BICUBIC), np.int16)
  img = img + rng.integers(-6, 7, img.shape)
  return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def _encode(img: Image.Image, fmt="PNG", **kw) -> bytes:
  buf = io.BytesIO()
  img.save(buf, format=fmt, **kw)
  return buf.getvalue()


def test_dct_matrix_is_scipys_dct_ii():
  from scipy import fft
  x = np.random.default_rng(0).normal(size=(3, 32, 32))
  want = fft.dct(fft.dct(x, axis=1), axis=2)[:, :8, :8]
  got = np.einsum("kn,bnm,lm->bkl", overlap._DCT, x, overlap._DCT)
  np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)


def test_planted_duplicates_found_and_no_false_positive_among_1000():
  rng = np.random.default_rng(0)
  distinct = [_smooth_image(rng) for _ in range(1000)]
  ref, ood = distinct[:600], distinct[600:]
  exact_src, resized_src = list(range(0, 20, 2)), list(range(1, 20, 2))
  ood_items = [(f"ood_{k}", _encode(img)) for k, img in enumerate(ood)]
  planted_exact = {}
  for k, r in enumerate(exact_src):   # same pixels, another encoding (optimised PNG)
    planted_exact[len(ood_items)] = r
    ood_items.append((f"exact_{k}", _encode(ref[r], optimize=True)))
  planted_near = {}
  for k, r in enumerate(resized_src):  # resized up or down, JPEG re-encoded
    size = (48, 48) if k % 2 else (25, 25)
    planted_near[len(ood_items)] = r
    ood_items.append((f"resized_{k}", _encode(ref[r].resize(size, Image.Resampling.BILINEAR),
                                              "JPEG", quality=90)))
  _, rd, rh = overlap.hash_images((f"ref_{k}", _encode(img)) for k, img in enumerate(ref))
  _, od, oh = overlap.hash_images(ood_items)
  ei, ej = overlap.exact_pairs(od, rd)
  assert dict(zip(ei.tolist(), ej.tolist())) == planted_exact
  ni, nj, dist = overlap.near_pairs(oh, rh, overlap.DEFAULT_THRESHOLD)
  near = dict(zip(ni.tolist(), nj.tolist()))
  assert near == {**planted_exact, **planted_near}, (near, dist)
  # no false positive among the 1,000 distinct images, in one set with itself
  all_h = np.concatenate([rh, oh[:400]])
  assert len(overlap.near_pairs(all_h, all_h, overlap.DEFAULT_THRESHOLD, same=True)[0]) == 0
  assert len(overlap.exact_pairs(np.concatenate([rd, od[:400]]),
                                 np.concatenate([rd, od[:400]]), same=True)[0]) == 0


@pytest.mark.slow
def test_hashing_in_worker_processes_keeps_order_and_values():
  rng = np.random.default_rng(2)
  items = [(f"im_{k}", _encode(_smooth_image(rng, 16))) for k in range(10)]
  one = overlap.hash_images(items, chunk=3)
  two = overlap.hash_images(items, chunk=3, workers=2)
  for a, b in zip(one, two):
    np.testing.assert_array_equal(a, b)


def test_sets_made_of_a_reference_are_not_compared_with_it():
  assert not overlap.comparable("fi_imagenet_1k:ood", "imagenet2012:validation")
  assert overlap.comparable("fi_imagenet_1k:ood", "imagenet2012:train")
  assert overlap.comparable("ninco/ood_classes:test", "imagenet2012:validation")


def test_near_pairs_equals_brute_force():
  rng = np.random.default_rng(1)
  a = rng.integers(0, 2**63, 300, dtype=np.uint64)
  b = np.concatenate([a[:50] ^ (np.uint64(1) << rng.integers(0, 64, 50).astype(np.uint64)),
                      rng.integers(0, 2**63, 200, dtype=np.uint64)])
  for t in (0, 3, 9):
    d = np.bitwise_count(a[:, None] ^ b[None, :])
    want = sorted(zip(*np.nonzero(d <= t)))
    i, j, dist = overlap.near_pairs(a, b, t, block=64)
    assert list(zip(i.tolist(), j.tolist())) == [(int(x), int(y)) for x, y in want]
    assert (dist == d[i, j]).all()


@pytest.fixture
def no_network(monkeypatch):
  def unreachable(*args, **kwargs):
    raise socket.gaierror(-3, "Temporary failure in name resolution")
  monkeypatch.setattr(socket, "getaddrinfo", unreachable)


def _build(tmp_path, monkeypatch, module, folder, files):
  manual = tmp_path / f"manual_{folder}"
  tgz = testing.write_tar(manual / module.ARCHIVE.filename,
                          {f"{folder}/images/{n}": d for n, d in files.items()})
  monkeypatch.setattr(module.Builder, "ARCHIVE", dataclasses.replace(
      module.ARCHIVE, md5=images.md5_of(tgz)))
  build.build_dataset(module.Builder.name, data_dir=str(tmp_path / "data"),
                      manual_dir=str(manual), expected={"test": len(files)})


@pytest.mark.slow
def test_overlap_cli_report_and_drop_overlaps_spec(tmp_path, monkeypatch, no_network, capsys):
  from fi_jax.data import loader
  from tfds_fi_imagenet.__main__ import main
  rng = np.random.default_rng(3)
  pics = [_smooth_image(rng) for _ in range(6)]
  # places_ood plays the reference here; sun_ood holds one exact and one resized copy of it
  _build(tmp_path, monkeypatch, places, "Places",
         {"b_badlands_00000001.jpg": _encode(pics[0], "JPEG", quality=95),
          "b_badlands_00000002.jpg": _encode(pics[1], "JPEG", quality=95)})
  places_bytes = {n.decode(): d for n, d in [
      (ex["file_name"], ex["image"]) for ex in _read(tmp_path, "places_ood")]}
  _build(tmp_path, monkeypatch, sun, "SUN", {
      "sun_a.jpg": places_bytes["places/images/b_badlands_00000001.jpg"],   # exact
      "sun_b.jpg": _encode(pics[1].resize((70, 70)), "JPEG", quality=85),   # resized
      "sun_c.jpg": _encode(pics[2], "JPEG"), "sun_d.jpg": _encode(pics[3], "JPEG")})
  data_dir, out = str(tmp_path / "data"), str(tmp_path / "report.json")
  assert main(["overlap", f"--data_dir={data_dir}", "sun_ood", "--reference", "places_ood:test",
               f"--output={out}", "--workers=1"]) == 0
  printed = capsys.readouterr().out
  assert "sun_ood:test: 4 images, 1 exact and 1 near duplicate pair(s); drop_overlaps removes 2" \
      in printed, printed
  report = json.load(open(out))
  assert {(o["file_name"], o["kind"], o["with_file_name"]) for o in report["overlaps"]} == {
      ("sun/images/sun_a.jpg", "exact", "places/images/b_badlands_00000001.jpg"),
      ("sun/images/sun_b.jpg", "near", "places/images/b_badlands_00000002.jpg")}
  assert report["drop"] == {"sun_ood:test": ["sun/images/sun_a.jpg", "sun/images/sun_b.jpg"]}
  assert report["skipped"] == []

  spec = dict(source="tfds", name="sun_ood", split="test", data_dir=data_dir,
              label_key=None, drop_overlaps=out)
  for count in (1, 2):
    ids = []
    for p in range(count):
      ds, info = loader.open_set(spec, p, count)
      ids += [int(ex["_id"]) for ex in ds.as_numpy_iterator()]
      assert info.num_examples == 2
    assert sorted(ids) == [0, 1]
  assert loader.dropped_overlaps(spec) == {"report": out, "file_names": [
      "sun/images/sun_a.jpg", "sun/images/sun_b.jpg"]}
  with pytest.raises(ValueError, match=r"does not cover places_ood:test"):
    loader.open_set(dict(spec, name="places_ood"))
  # the run's preflight names a missing or foreign report; results.json records the drops
  from fi_jax.run import benchmark, preflight
  assert preflight.check_tfds_set("ood/sun", spec) is None
  assert "does not cover places_ood:test" in preflight.check_tfds_set(
      "ood/places", dict(spec, name="places_ood"))
  assert "cannot read the overlap report" in preflight.check_tfds_set(
      "ood/sun", dict(spec, drop_overlaps=str(tmp_path / "missing.json")))
  extras = benchmark.report_extras({"id_test": dict(source="digits", split="test"),
                                    "ood/sun": spec}, {"ood/sun": {"group": None}})
  assert extras["dropped_overlaps"] == {"sun": loader.dropped_overlaps(spec)}


def _read(tmp_path, name):
  import tensorflow_datasets as tfds
  b = tfds.builder(name, data_dir=str(tmp_path / "data"))
  return tfds.as_numpy(b.as_dataset(split="test", decoders={"image": tfds.decode.SkipDecoding()}))


@pytest.mark.slow
def test_overlap_with_imagenet2012_train(tmp_path, monkeypatch, no_network):
  from tests.helpers import imagenet_standin
  data_dir = imagenet_standin.build_imagenet2012(tmp_path, n_classes=2, per_class=2)
  train_image = testing.jpeg_bytes(16, seed=10 * 1 + 1)   # the stand-in's class 1, image 1
  rng = np.random.default_rng(4)
  _build(tmp_path, monkeypatch, sun, "SUN", {"sun_x.jpg": train_image,
                                             "sun_y.jpg": _encode(_smooth_image(rng), "JPEG")})
  report = overlap.find_overlaps(["sun_ood"], data_dir, references=["imagenet2012:train"],
                                 log=lambda m: None)
  assert [(o["file_name"], o["kind"], o["with_set"], o["with_file_name"])
          for o in report["overlaps"]] == [
      ("sun/images/sun_x.jpg", "exact", "imagenet2012:train", "n01443537_1.JPEG")]
  assert report["references"] == {"imagenet2012:train": 4}


def _imagehash_phash_reference(img: Image.Image) -> int:
  """The `imagehash` library's `phash(image)` (defaults hash_size=8, highfreq_factor=4) as an
  int, written from its definition in imagehash 4.3.2 (github.com/JohannesBuchner/imagehash,
  commit 4e289eb, `imagehash/__init__.py`): the image converted to 'L' (from its own mode) and
  resized to 32x32 with Lanczos, the uint8 pixels, scipy.fftpack's DCT-II along axis 0 then
  axis 1, the top-left 8x8 block, bit = coefficient > its median; the hash's hex string reads
  the flattened bits (row-major) as one binary number, first bit most significant."""
  from scipy import fftpack
  grey = np.asarray(img.convert("L").resize((32, 32), Image.Resampling.LANCZOS))
  low = fftpack.dct(fftpack.dct(grey, axis=0), axis=1)[:8, :8]
  bits = (low > np.median(low)).ravel()
  return int("".join("1" if b else "0" for b in bits), 2)


def test_phash_equals_imagehash_bit_for_bit():
  """The overlap tool's pHash = imagehash.phash (imagehash is not a dependency: when it is
  installed the library itself is compared too) on generated images of several sizes, modes
  and encodings."""
  try:
    import imagehash
  except ImportError:
    imagehash = None
  rng = np.random.default_rng(5)
  cases = []
  for k in range(24):
    img = _smooth_image(rng, size=int(rng.integers(20, 90)))
    if k % 4 == 1:
      img = img.resize((int(rng.integers(33, 120)), int(rng.integers(33, 120))),
                       Image.Resampling.BILINEAR)   # not square
    if k % 4 == 2:
      img = img.convert("L")
    fmt, kw = ("JPEG", {"quality": 85}) if k % 3 == 0 else ("PNG", {})
    cases.append(_encode(img, fmt, **kw))
  _, _, got = overlap.hash_images((f"im_{k}", d) for k, d in enumerate(cases))
  for k, data in enumerate(cases):
    with Image.open(io.BytesIO(data)) as img:
      img.load()
      want = _imagehash_phash_reference(img)
      assert int(got[k]) == want, (k, f"{int(got[k]):016x}", f"{want:016x}")
      if imagehash is not None:
        assert f"{int(got[k]):016x}" == str(imagehash.phash(img)), k
