"""Overlap hygiene: exact and near duplicates between OOD sets and ImageNet-1k, and between
OOD sets (`python -m tfds_fi_imagenet overlap --data_dir=D SET...`).

Two hashes per image, both of the decoded pixels (PIL, RGB), so re-encoded copies match:
- exact: BLAKE2b-128 of the pixel array and its shape. Equal digests = the same pixels.
- near: a 64-bit DCT perceptual hash (pHash): grey (PIL's ITU-R 601 luma) resized to 32x32
  (Lanczos), the 2-D DCT-II (unnormalised, as scipy computes it, as a matrix product), its
  8x8 lowest frequencies (DC included), one bit per coefficient: above the median of the 64. Two images are near
  duplicates when their hashes differ in at most `threshold` bits (default 4; unrelated
  images differ in about 32). Resized, re-encoded or lightly cropped copies stay within a
  few bits. These are the steps of the `imagehash` library's `phash` (hash_size=8,
  highfreq_factor=4), implemented in numpy (no new dependency).

Pairs within the threshold are found without comparing all pairs: the 64 bits are cut into
threshold+1 chunks, and two hashes within the threshold agree exactly on at least one chunk
(pigeonhole), so only hashes sharing a chunk value are compared.

A set is `NAME[/CONFIG][:SPLIT]` (all splits when SPLIT is left out). Hashes are cached per
split under `<data_dir>/overlap_hashes/` (the reference splits of ImageNet-1k are hashed once;
`workers` processes decode in parallel). Sets made of a reference split's own images
(fi_imagenet_1k: ImageNet-1k validation images) are not compared with it (the report's
`skipped`). The report (JSON) lists every overlap and, per set, the file names a set spec's
`drop_overlaps=<report>` removes: an OOD image with a duplicate in a reference split, and of
two duplicate OOD images the one in the set named later (so the union keeps one copy).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np

DEFAULT_THRESHOLD = 4
DEFAULT_REFERENCES = ("imagenet2012:train", "imagenet2012:validation")
_N, _LOW = 32, 8
# reference split -> the sets made of its images (every image would be an exact duplicate)
_SUBSETS_OF = {"imagenet2012:validation": ("fi_imagenet_1k",)}


def _dct_matrix() -> np.ndarray:
  """Rows 0.._LOW-1 of the unnormalised DCT-II matrix of size _N (scipy.fft.dct's default:
  y[k] = 2 sum_n x[n] cos(pi k (2n + 1) / (2N)))."""
  k = np.arange(_LOW)[:, None]
  n = np.arange(_N)[None, :]
  return 2.0 * np.cos(np.pi * (2 * n + 1) * k / (2 * _N))


_DCT = _dct_matrix()


def phash_grey32(grey: np.ndarray) -> np.ndarray:
  """uint64 [B] perceptual hashes of grey images float [B, 32, 32] (vectorised)."""
  grey = np.asarray(grey, np.float64)
  low = np.einsum("kn,bnm,lm->bkl", _DCT, grey, _DCT).reshape(len(grey), _LOW * _LOW)
  bits = low > np.median(low, axis=1, keepdims=True)
  return np.packbits(bits, axis=1).view(">u8").ravel().astype(np.uint64)


def image_hashes(data: bytes) -> tuple[bytes, np.ndarray]:
  """(16-byte pixel digest, grey 32x32 float array) of encoded image bytes."""
  from PIL import Image
  with Image.open(io.BytesIO(data)) as img:
    rgb = img.convert("RGB")
  arr = np.asarray(rgb)
  digest = hashlib.blake2b(np.asarray(arr.shape, np.int64).tobytes() + arr.tobytes(),
                           digest_size=16).digest()
  grey = np.asarray(rgb.convert("L").resize((_N, _N), Image.Resampling.LANCZOS), np.float64)
  return digest, grey


def _hash_chunk(datas: list[bytes]) -> tuple[list[bytes], np.ndarray]:
  """(pixel digests, phashes) of a list of encoded images."""
  digests, greys = [], []
  for data in datas:
    digest, grey = image_hashes(data)
    digests.append(digest)
    greys.append(grey)
  return digests, (phash_grey32(np.stack(greys)) if greys else np.zeros(0, np.uint64))


def _chunked(items: Iterable[tuple[str, bytes]], size: int) -> Iterator[tuple[list, list]]:
  names, datas = [], []
  for name, data in items:
    names.append(name)
    datas.append(data)
    if len(datas) == size:
      yield names, datas
      names, datas = [], []
  if datas:
    yield names, datas


def hash_images(items: Iterable[tuple[str, bytes]], *, workers: int = 1, chunk: int = 512
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(file names [N] str, pixel digests [N] S16, phashes [N] uint64) of (name, bytes), in
  order. `workers` > 1 decodes in that many processes (a few chunks in flight at a time)."""
  names, digests, hashes = [], [], []

  def collect(chunk_names, result):
    names.extend(chunk_names)
    digests.extend(result[0])
    hashes.append(result[1])

  if workers <= 1:
    for chunk_names, datas in _chunked(items, chunk):
      collect(chunk_names, _hash_chunk(datas))
  else:
    import collections
    import concurrent.futures
    import multiprocessing
    # spawn: the parent may run TensorFlow's threads, which fork would copy mid-flight
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn")) as pool:
      pending = collections.deque()
      for chunk_names, datas in _chunked(items, chunk):
        pending.append((chunk_names, pool.submit(_hash_chunk, datas)))
        if len(pending) >= 2 * workers:
          done_names, future = pending.popleft()
          collect(done_names, future.result())
      while pending:
        done_names, future = pending.popleft()
        collect(done_names, future.result())
  return (np.asarray(names, dtype=str), np.asarray(digests, dtype="S16"),
          np.concatenate(hashes) if hashes else np.zeros(0, np.uint64))


# ----------------------------------------------------------------------------- pair search

def _chunks(threshold: int) -> list[tuple[int, int]]:
  """(shift, bits) of threshold+1 near-equal chunks of 64 bits."""
  n = threshold + 1
  sizes = [64 // n + (1 if i < 64 % n else 0) for i in range(n)]
  out, shift = [], 0
  for s in sizes:
    out.append((shift, s))
    shift += s
  return out


def near_pairs(a: np.ndarray, b: np.ndarray, threshold: int, *, same: bool = False,
               block: int = 8192) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(i, j, distance) of every pair with Hamming(a[i], b[j]) <= threshold, sorted by (i, j).

  With `same` (a is b) only pairs i < j. Exact for any threshold < 64.
  """
  a, b = np.asarray(a, np.uint64), np.asarray(b, np.uint64)
  if not 0 <= threshold < 64:
    raise ValueError(f"threshold must be in [0, 63] bits, got {threshold}.")
  found = []
  for shift, bits in _chunks(threshold):
    mask = np.uint64((1 << bits) - 1)
    kb = (b >> np.uint64(shift)) & mask
    order = np.argsort(kb, kind="stable")
    kb_sorted = kb[order]
    for start in range(0, len(a), block):
      ka = (a[start:start + block] >> np.uint64(shift)) & mask
      lo = np.searchsorted(kb_sorted, ka, "left")
      counts = np.searchsorted(kb_sorted, ka, "right") - lo
      total = int(counts.sum())
      if not total:
        continue
      ia = np.repeat(np.arange(start, start + len(ka)), counts)
      offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
      jb = order[np.repeat(lo, counts) + offsets]
      dist = np.bitwise_count(a[ia] ^ b[jb])
      keep = dist <= threshold
      if same:
        keep &= ia < jb
      found.append(np.stack([ia[keep], jb[keep], dist[keep]], axis=1))
  if not found:
    return (np.zeros(0, np.int64),) * 3
  pairs = np.unique(np.concatenate(found).astype(np.int64), axis=0)
  return pairs[:, 0], pairs[:, 1], pairs[:, 2]


def exact_pairs(a: np.ndarray, b: np.ndarray, *, same: bool = False
                ) -> tuple[np.ndarray, np.ndarray]:
  """(i, j) of every pair with equal pixel digests (i < j with `same`), sorted."""
  index: dict[bytes, list[int]] = {}
  for j, d in enumerate(b.tolist()):
    index.setdefault(d, []).append(j)
  ii, jj = [], []
  for i, d in enumerate(a.tolist()):
    for j in index.get(d, ()):
      if not same or i < j:
        ii.append(i)
        jj.append(j)
  return np.asarray(ii, np.int64), np.asarray(jj, np.int64)


# ----------------------------------------------------------------------------- sets

def parse_set(text: str) -> tuple[str, Optional[str]]:
  """'NAME[/CONFIG][:SPLIT]' -> ('NAME[/CONFIG]', SPLIT or None)."""
  name, _, split = text.partition(":")
  if not name:
    raise ValueError(f"A set is NAME[/CONFIG][:SPLIT], got {text!r}.")
  return name, split or None


def set_key(builder, split: str) -> str:
  """Canonical '<name>[/<config>]:<split>' of a split (the default config made explicit)."""
  config = builder.builder_config.name if builder.builder_config else None
  return f"{builder.name}{'/' + config if config else ''}:{split}"


def _builder(name: str, data_dir: str):
  import tensorflow_datasets as tfds

  import tfds_fi_imagenet  # noqa: F401  registers the builders
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except Exception as e:  # unknown name / config
    raise FileNotFoundError(f"Cannot open {name!r} in {data_dir} ({type(e).__name__}: "
                            f"{' '.join(str(e).split())[:200]}).") from None
  if not builder.is_prepared():
    raise FileNotFoundError(f"{name} is not prepared in {data_dir}: build it first "
                            f"(python -m tfds_fi_imagenet build {name.split('/')[0]} ...).")
  return builder


def _examples(builder, split: str) -> Iterator[tuple[str, bytes]]:
  import tensorflow_datasets as tfds
  features = builder.info.features
  ds = builder.as_dataset(split=split, shuffle_files=False,
                          decoders={"image": tfds.decode.SkipDecoding()},
                          read_config=tfds.ReadConfig(interleave_cycle_length=1))
  for k, ex in enumerate(tfds.as_numpy(ds)):
    name = ex["file_name"].decode() if "file_name" in features else str(k)
    yield name, ex["image"]


def split_hashes(builder, split: str, data_dir: str, log=print, workers: int = 1):
  """(file names, pixel digests, phashes) of a prepared split, cached under data_dir."""
  cfg = builder.builder_config.name if builder.builder_config else "_"
  path = os.path.join(data_dir, "overlap_hashes", builder.name, cfg, str(builder.version),
                      f"{split}.npz")
  n = builder.info.splits[split].num_examples
  if os.path.exists(path):
    with np.load(path, allow_pickle=False) as z:
      if len(z["phash"]) == n:
        return z["file_name"], z["pixel"], z["phash"]
  log(f"hashing {set_key(builder, split)} ({n} images)")
  names, digests, hashes = hash_images(_examples(builder, split), workers=workers)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + ".tmp.npz"
  np.savez(tmp, file_name=names, pixel=digests, phash=hashes)
  os.replace(tmp, path)
  return names, digests, hashes


def _resolve(specs: Sequence[str], data_dir: str) -> list[tuple[str, object, str]]:
  out = []
  for text in specs:
    name, split = parse_set(text)
    builder = _builder(name, data_dir)
    splits = [split] if split else sorted(builder.info.splits)
    for s in splits:
      if s not in builder.info.splits:
        raise ValueError(f"{name} has no split {s!r}; it has {sorted(builder.info.splits)}.")
      out.append((set_key(builder, s), builder, s))
  return out


def comparable(set_key: str, reference_key: str) -> bool:
  """False when the set is made of the reference split's own images (fi_imagenet_1k and
  imagenet2012:validation), where every image would be reported."""
  return set_key.split("/")[0].split(":")[0] not in _SUBSETS_OF.get(reference_key, ())


def find_overlaps(sets: Sequence[str], data_dir: str, *,
                  references: Sequence[str] = DEFAULT_REFERENCES,
                  threshold: int = DEFAULT_THRESHOLD, log=print, workers: int = 1) -> dict:
  """The overlap report of OOD `sets` against `references` and against each other."""
  ood = _resolve(sets, data_dir)
  refs = _resolve(references, data_dir)
  hashed = {key: split_hashes(b, s, data_dir, log, workers) for key, b, s in ood + refs}
  overlaps = []

  def add(key_a, key_b, same=False):
    na, da, ha = hashed[key_a]
    nb, db, hb = hashed[key_b]
    ei, ej = exact_pairs(da, db, same=same)
    exact = set(zip(ei.tolist(), ej.tolist()))
    for i, j in sorted(exact):
      overlaps.append({"set": key_a, "file_name": str(na[i]), "kind": "exact", "distance": 0,
                       "with_set": key_b, "with_file_name": str(nb[j])})
    for i, j, d in zip(*(x.tolist() for x in near_pairs(ha, hb, threshold, same=same))):
      if (i, j) not in exact:
        overlaps.append({"set": key_a, "file_name": str(na[i]), "kind": "near",
                         "distance": int(d), "with_set": key_b, "with_file_name": str(nb[j])})

  keys = [k for k, _, _ in ood]
  skipped = []
  for key in keys:
    for ref, _, _ in refs:
      if not comparable(key, ref):
        skipped.append({"set": key, "with_set": ref,
                        "reason": "its images are taken from this split"})
        continue
      add(key, ref)
  for x, key_a in enumerate(keys):
    for key_b in keys[x + 1:]:
      add(key_a, key_b)
  ref_keys = {k for k, _, _ in refs}
  drop: dict[str, set] = {k: set() for k in keys}
  for o in overlaps:
    if o["with_set"] in ref_keys:
      drop[o["set"]].add(o["file_name"])
    else:   # two OOD sets: the later one gives its copy up
      drop[o["with_set"]].add(o["with_file_name"])
  return {
      "threshold": threshold,
      "hashes": "exact: BLAKE2b-128 of the decoded RGB pixels; near: 64-bit DCT pHash of the "
                "32x32 grey image, Hamming distance <= threshold",
      "sets": {k: int(len(hashed[k][0])) for k in keys},
      "references": {k: int(len(hashed[k][0])) for k in sorted(ref_keys)},
      "overlaps": overlaps,
      "drop": {k: sorted(v) for k, v in drop.items()},
      "skipped": skipped,
  }


def summary(report: dict) -> str:
  lines = []
  for key, n in report["sets"].items():
    rows = [o for o in report["overlaps"] if key in (o["set"], o["with_set"])]
    exact = sum(o["kind"] == "exact" for o in rows)
    lines.append(f"{key}: {n} images, {exact} exact and {len(rows) - exact} near duplicate "
                 f"pair(s); drop_overlaps removes {len(report['drop'][key])}")
  return "\n".join(lines)


def dropped_file_names(report_path: str, key: str) -> list[str]:
  """The file names the report says a set (canonical key '<name>[/<config>]:<split>') drops."""
  try:
    with open(report_path) as f:
      report = json.load(f)
  except (OSError, ValueError) as e:
    raise FileNotFoundError(f"drop_overlaps: cannot read the overlap report {report_path} "
                            f"({type(e).__name__}: {e}); write it with python -m "
                            f"tfds_fi_imagenet overlap --data_dir=D SET... --output FILE.") from None
  drop = report.get("drop") if isinstance(report, dict) else None
  if not isinstance(drop, dict) or key not in drop:
    known = ", ".join(sorted(drop)) if isinstance(drop, dict) else "none"
    raise ValueError(f"drop_overlaps: the report {report_path} does not cover {key} (it covers "
                     f"{known}); rerun the overlap command with this set.")
  return [str(n) for n in drop[key]]
