"""Input pipeline: a set spec -> padded, per-process batches of numpy arrays.

A *set spec* is a dict naming where the images of one evaluation set come from:

  dict(source="digits", split="train" | "test", classes=[0, 1, ...])   # sklearn's bundled digits
  dict(source="tfds", name="fi_imagenet_1k", split="ood", data_dir=None,
       label_key="label", group_key="ood_class_id", per_class=None, drop_overlaps=None)

`drop_overlaps`: the JSON report of `python -m tfds_fi_imagenet overlap`; the examples it
lists for this set (duplicates of ImageNet-1k images, or of an earlier OOD set's) are left
out and the rest renumbered (`dropped_overlaps(spec)` says which).

Every example becomes ``{"image", "label", "group", "_id", "_mask"}``: `label` is the ID class
(-1 where unknown or OOD), `group` an integer sub-class used for per-class (macro) metrics
(-1 if none), `_id` the example's index in the set and `_mask` False on padding. Like
big_vision's eval pipeline, every process reads its own contiguous part of the set and pads it
to the same number of equal batches, so all processes run the same jitted steps.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
from typing import Any, Callable, Iterator, Optional

import numpy as np

from fi_jax.data import class_names as class_names_lib
from fi_jax.data import preprocess

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # silences TF's oneDNN banner; TF only preprocesses


_tf = preprocess.tf_module   # TF on first use, GPUs hidden from it


@dataclasses.dataclass
class SetInfo:
  """What the pipeline needs to know about one set before reading it."""
  num_examples: int                      # whole set, all processes
  num_examples_per_process: list[int]
  num_classes: Optional[int] = None      # ID classes, when the source knows them


# ----------------------------------------------------------------------------- digits (demo)

@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
  """(images float32 [1797, 8, 8, 1], digits int64 [1797]) of scikit-learn's bundled digits,
  read-only. Read from scikit-learn's own data file without importing scikit-learn (a second
  of imports on a demo's critical path), the same values as `sklearn.datasets.load_digits()`
  (tested); that function where the file is not where it is expected."""
  spec = importlib.util.find_spec("sklearn")
  path = (os.path.join(os.path.dirname(spec.origin), "datasets", "data", "digits.csv.gz")
          if spec is not None and spec.origin else "")
  if os.path.isfile(path):
    table = np.loadtxt(path, delimiter=",")
    images, target = table[:, :-1].reshape(-1, 8, 8), table[:, -1]
  else:
    from sklearn import datasets as skd
    digits = skd.load_digits()
    images, target = digits.images, digits.target
  x, y = images.astype(np.float32)[..., None], target.astype(np.int64)
  x.flags.writeable = y.flags.writeable = False
  return x, y


def load_digits_split(split: str, classes, *, test_fraction: float = 0.3, seed: int = 0,
                      id_classes=None) -> dict[str, np.ndarray]:
  """sklearn's bundled 8x8 digits (no download), a seeded stratified train/test split.

  Keeps the digits in `classes`; `label` is the index of the digit in `id_classes`
  (default: `classes`) or -1 when it is not an ID class; `group` is the digit itself.
  Images are float32 [N, 8, 8, 1] with values in [0, 16].
  """
  if split not in ("train", "test", "all"):
    raise ValueError(f"digits split must be 'train', 'test' or 'all', got {split!r}.")
  x, y = _digits()
  rng = np.random.default_rng(seed)
  is_test = np.zeros(len(y), bool)
  for c in range(10):   # stratified: the same fraction of every digit goes to test
    idx = np.flatnonzero(y == c)
    is_test[rng.permutation(idx)[:int(round(test_fraction * len(idx)))]] = True
  keep = np.isin(y, list(classes))
  if split != "all":
    keep &= is_test if split == "test" else ~is_test
  id_classes = list(classes if id_classes is None else id_classes)
  lookup = {c: i for i, c in enumerate(id_classes)}
  labels = np.array([lookup.get(int(c), -1) for c in y[keep]], np.int64)
  return {"image": x[keep], "label": labels, "group": y[keep]}


# ----------------------------------------------------------------------------- sources

def _split_counts(n: int, count: int) -> list[int]:
  """Sizes of `count` contiguous, near-equal parts of n examples (the first ones larger)."""
  return [len(a) for a in np.array_split(np.arange(n), count)]


def _array_source(arrays: dict[str, np.ndarray], process_index: int, process_count: int):
  tf = _tf()
  n = len(arrays["label"])
  counts = _split_counts(n, process_count)
  start = sum(counts[:process_index])
  part = {k: v[start:start + counts[process_index]] for k, v in arrays.items()}
  part["_id"] = np.arange(start, start + counts[process_index], dtype=np.int64)
  info = SetInfo(n, counts)
  return tf.data.Dataset.from_tensor_slices(part), info


def _tfds_source(spec: dict, process_index: int, process_count: int):
  tf = _tf()
  import tensorflow_datasets as tfds  # heavy; TFDS sets only
  name, split = spec["name"], spec.get("split", "test")
  data_dir = spec.get("data_dir") or None   # "" in configs = TFDS default
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except Exception as e:
    raise FileNotFoundError(
        f"TFDS dataset {name!r} not found in data_dir={data_dir!r} ({type(e).__name__}: {e}). "
        f"Build it first: python -m tfds_fi_imagenet build {name} --manual_dir=DIR "
        f"--data_dir=DIR (or TFDS's own builder for standard datasets).") from None
  if not builder.is_prepared():
    raise FileNotFoundError(
        f"TFDS dataset {name!r} is not prepared in {builder.data_dir}. Build it first: "
        f"python -m tfds_fi_imagenet build {name} --manual_dir=DIR --data_dir=DIR.")
  try:   # TFDS slicing too: 'train[:10%]', 'train[:50000]', 'train[50%:]'
    builder.info.splits[split]
  except (KeyError, ValueError, AssertionError) as e:
    raise ValueError(f"{name} has no split {split!r} ({e}); it has "
                     f"{sorted(builder.info.splits)} (slices like 'train[:10%]' work too).") from None
  label_key, group_key = spec.get("label_key", "label"), spec.get("group_key")
  image_key = spec.get("image_key", "image")
  features = builder.info.features
  num_classes = None
  if label_key and label_key in features and hasattr(features[label_key], "num_classes"):
    num_classes = features[label_key].num_classes
  read = dict(shuffle_files=False, decoders={image_key: tfds.decode.SkipDecoding()},
              read_config=tfds.ReadConfig(interleave_cycle_length=1))
  per_class = spec.get("per_class")
  if per_class and spec.get("drop_overlaps"):
    raise ValueError(f"{name}: per_class and drop_overlaps cannot be combined (per_class "
                     "subsets the ID fit set, drop_overlaps cleans OOD sets).")
  if per_class:
    # The first `per_class` examples of each class in stored order (a fixed pseudo-random
    # sample), chosen on the whole split so that it is n per class in total, then shared
    # round-robin between the processes.
    # the package registers every builder with TFDS on import (heavy; per_class only)
    from tfds_fi_imagenet import subsets
    if not num_classes:
      raise ValueError(f"per_class needs a ClassLabel {label_key!r} in {name}.")
    ds = subsets.per_class_subset(builder.as_dataset(split=split, **read), per_class,
                                  num_classes, label_key=label_key)
    ds = ds.enumerate().shard(process_count, process_index)
    # what the split really holds (fewer classes or images than asked: those, never padding)
    total = int(sum(per_class_counts(spec)))
    counts = subsets.per_class_subset_counts(per_class, num_classes, process_count, total)
    start = 0
  elif spec.get("drop_overlaps"):
    # the examples an overlap report drops (tfds_fi_imagenet.overlap) leave the set: ids are
    # renumbered 0..n-1 over what is kept, each process keeps its part's remaining examples
    parts = tfds.even_splits(split, n=process_count)
    whole = [builder.info.splits[p].num_examples for p in parts]
    keep = ~np.isin(_file_names(builder, split), list(_dropped(spec, builder)))
    new_id = np.cumsum(keep) - 1
    bounds = np.cumsum([0] + whole)
    counts = [int(keep[bounds[p]:bounds[p + 1]].sum()) for p in range(process_count)]
    first = int(bounds[process_index])
    keep_t, new_id_t = tf.constant(keep), tf.constant(new_id, tf.int64)
    ds = builder.as_dataset(split=parts[process_index], **read).enumerate()
    ds = ds.filter(lambda i, ex: tf.gather(keep_t, i + first))
    ds = ds.map(lambda i, ex: (tf.gather(new_id_t, i + first), ex))
    start = 0
  else:
    parts = tfds.even_splits(split, n=process_count)
    counts = [builder.info.splits[p].num_examples for p in parts]
    ds = builder.as_dataset(split=parts[process_index], **read).enumerate()
    start = sum(counts[:process_index])

  def convert(i, ex):
    return {
        "image": ex[image_key],
        "label": tf.cast(ex[label_key], tf.int64) if label_key and label_key in ex
                 else tf.constant(-1, tf.int64),
        "group": tf.cast(ex[group_key], tf.int64) if group_key and group_key in ex
                 else tf.constant(-1, tf.int64),
        "_id": tf.cast(i, tf.int64) + start,
    }
  ds = ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return ds, SetInfo(sum(counts), counts, num_classes)


def _file_names(builder, split: str) -> np.ndarray:
  """The `file_name` of every example of a split, in stored order."""
  import tensorflow_datasets as tfds
  if "file_name" not in builder.info.features:
    raise ValueError(f"drop_overlaps needs a 'file_name' feature; {builder.name} has none.")
  ds = builder.as_dataset(split=split, shuffle_files=False,
                          decoders={k: tfds.decode.SkipDecoding()
                                    for k in builder.info.features if k == "image"})
  ds = ds.map(lambda ex: ex["file_name"])
  return np.array([n.decode() for n in ds.as_numpy_iterator()], dtype=str)


def _dropped(spec: dict, builder) -> list[str]:
  from tfds_fi_imagenet import overlap  # the overlap report's reader (TFDS sets only)
  return overlap.dropped_file_names(spec["drop_overlaps"],
                                    overlap.set_key(builder, spec.get("split", "test")))


def dropped_overlaps(spec: dict) -> Optional[dict]:
  """What a tfds spec's `drop_overlaps` removes: {"report": path, "file_names": [...]} (the
  names the report lists for this set, as results.json records them), or None without it."""
  if spec.get("source") != "tfds" or not spec.get("drop_overlaps"):
    return None
  builder = _tfds_builder(spec)
  if builder is None:
    return None
  return {"report": str(spec["drop_overlaps"]), "file_names": _dropped(spec, builder)}


def per_class_counts(spec: dict) -> np.ndarray:
  """The examples a tfds spec with `per_class` selects of each class: int64 [num_classes],
  each min(per_class, that class's examples in the split). Counted once per process and
  spec (the labels only, until every class has `per_class`); a split with fewer classes
  or images than asked has fewer, and the set is planned at that size."""
  key = tuple(spec.get(k) or None for k in ("name", "split", "data_dir", "per_class"))
  return np.array(_per_class_counts(*key, spec.get("label_key", "label"),
                                    spec.get("image_key", "image")), np.int64)


@functools.lru_cache(maxsize=16)
def _per_class_counts(name, split, data_dir, per_class, label_key, image_key) -> tuple[int, ...]:
  import tensorflow_datasets as tfds

  from tfds_fi_imagenet import subsets
  _tf()   # TF set up (GPUs hidden) before TFDS reads
  builder = tfds.builder(name, data_dir=data_dir)
  feature = builder.info.features[label_key] if label_key in builder.info.features else None
  num_classes = getattr(feature, "num_classes", None)
  if not num_classes:
    raise ValueError(f"per_class needs a ClassLabel {label_key!r} in {name}.")
  ds = builder.as_dataset(split=split or "test", shuffle_files=False,
                          decoders={image_key: tfds.decode.SkipDecoding()})
  return tuple(int(c) for c in subsets.per_class_available(ds, int(per_class), num_classes,
                                                           label_key=label_key))


def open_set(spec: dict, process_index: int = 0, process_count: int = 1):
  """Returns (tf.data.Dataset of this process's unbatched examples, SetInfo)."""
  spec = dict(spec)
  source = spec.pop("source", None)
  if source == "digits":
    arrays = load_digits_split(spec.get("split", "test"), spec.get("classes", range(10)),
                               test_fraction=spec.get("test_fraction", 0.3),
                               seed=spec.get("seed", 0), id_classes=spec.get("id_classes"))
    ds, info = _array_source(arrays, process_index, process_count)
    info.num_classes = len(spec.get("id_classes") or spec.get("classes", range(10)))
    return ds, info
  if source == "tfds":
    if "name" not in spec:
      raise ValueError("A tfds set spec needs a 'name', e.g. dict(source='tfds', "
                       "name='fi_imagenet_1k', split='ood').")
    return _tfds_source(spec, process_index, process_count)
  raise ValueError(f"Unknown set source {source!r}; use 'digits' or 'tfds'.")


def batches(spec: dict, pp_fn: Callable[[dict], dict], global_batch_size: int, *,
            process_index: int = 0, process_count: int = 1, skip_steps: int = 0,
            prefetch: int = 2) -> tuple[Iterator[dict[str, np.ndarray]], int, SetInfo]:
  """Padded batches of this process's part of a set.

  Returns (iterator of numpy dicts with a local batch of global_batch_size // process_count,
  number of steps (the same on every process), SetInfo). With `skip_steps` the iterator starts
  at that step (resuming an extraction): the examples of the skipped steps are dropped before
  preprocessing, so every later batch holds exactly what it holds in a full pass.
  """
  tf = _tf()
  if global_batch_size % process_count:
    raise ValueError(f"batch_size {global_batch_size} must be divisible by the number of "
                     f"processes ({process_count}).")
  local_bs = global_batch_size // process_count
  ds, info = open_set(spec, process_index, process_count)
  steps = max(1, math.ceil(max(info.num_examples_per_process) / local_bs))
  if not 0 <= skip_steps <= steps:
    raise ValueError(f"skip_steps {skip_steps} is outside [0, {steps}].")
  if skip_steps:
    ds = ds.skip(skip_steps * local_bs)

  def pp(ex):
    out = pp_fn(dict(ex))
    return {"image": tf.cast(out["image"], tf.float32), "label": ex["label"],
            "group": ex["group"], "_id": ex["_id"], "_mask": tf.constant(True)}
  # parallel decode/preprocess; deterministic=True keeps the example order (it is the default
  # unless tf.data options say otherwise: explicit, since the cache and resuming rely on it)
  ds = ds.map(pp, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  spec_ = ds.element_spec
  if not spec_["image"].shape.is_fully_defined():
    raise ValueError(f"Preprocessing must give fixed-size images (got {spec_['image'].shape}); "
                     "end the pp string with a resize or central_crop.")
  pad = tf.data.Dataset.from_tensors(
      {k: tf.zeros(s.shape, s.dtype) for k, s in spec_.items()}).repeat()
  ds = ds.concatenate(pad).batch(local_bs, drop_remainder=True).take(steps - skip_steps)
  ds = ds.prefetch(prefetch)
  return ds.as_numpy_iterator(), steps, info


def train_arrays(spec: dict) -> dict[str, Any]:
  """The in-memory arrays of a digits spec (used by the demo trainer)."""
  if spec.get("source") != "digits":
    raise ValueError("Training from scratch is only supported on the in-memory digits source.")
  return load_digits_split(spec.get("split", "train"), spec.get("classes", range(10)),
                           test_fraction=spec.get("test_fraction", 0.3),
                           seed=spec.get("seed", 0), id_classes=spec.get("id_classes"))


# ----------------------------------------------------------------------------- names

def _tfds_builder(spec: dict):
  """The registered TFDS builder of a tfds spec, or None when it is unknown or not prepared."""
  import tensorflow_datasets as tfds  # heavy; TFDS sets only

  import tfds_fi_imagenet  # noqa: F401  registers the builders
  try:
    builder = tfds.builder(spec["name"], data_dir=spec.get("data_dir") or None)
  except Exception:  # unknown name: the preflight reports it
    return None
  return builder if builder.is_prepared() else None


def group_names(spec: dict) -> Optional[list[str]]:
  """The name of each `group` id of a set (index = group id), or None when unnamed.

  digits: the digit; tfds: the builder's `ood_class_names` metadata (what the OOD builders
  of tfds_fi_imagenet store), else the names of a ClassLabel `group_key`.
  """
  source = spec.get("source")
  if source == "digits":
    return [str(d) for d in range(10)]
  if source != "tfds" or not spec.get("group_key"):
    return None
  builder = _tfds_builder(spec)
  if builder is None:
    return None
  names = (builder.info.metadata or {}).get("ood_class_names")
  if names:
    return [str(n) for n in names]
  feature = builder.info.features.get(spec["group_key"]) if hasattr(
      builder.info.features, "get") else None
  return list(feature.names) if hasattr(feature, "names") else None


def class_names(spec: dict) -> Optional[list[str]]:
  """The name of each ID class (index = label) of a set, or None when unknown.

  digits: the ID digits; tfds: the names of the ClassLabel `label_key` (ImageNet-1k's 1000
  classes get their human-readable names instead of WordNet ids).
  """
  source = spec.get("source")
  if source == "digits":
    return [str(d) for d in (spec.get("id_classes") or spec.get("classes", range(10)))]
  if source != "tfds":
    return None
  builder = _tfds_builder(spec)
  label_key = spec.get("label_key", "label")
  if builder is None or not label_key or label_key not in builder.info.features:
    return None
  names = list(getattr(builder.info.features[label_key], "names", None) or [])
  return default_class_names(1000) if len(names) == 1000 else (names or None)


def default_class_names(num_classes: int) -> list[str]:
  """ImageNet-1k's human-readable names for 1000 classes, else the class indices."""
  if num_classes == 1000:
    return list(class_names_lib.IMAGENET_CLASS_NAMES)
  return [str(i) for i in range(num_classes)]
