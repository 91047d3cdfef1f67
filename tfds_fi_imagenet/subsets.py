"""Per-class subsets of a labelled split, e.g. n images per class of imagenet2012 train.

The detectors' ID fit set is TFDS `imagenet2012` train. Its examples are stored in an order
fixed by TFDS's key hashing, so "the first n examples of each class in stored order" is a
deterministic pseudo-random sample that every process and every run agrees on. The split
must therefore be read in a fixed order: `shuffle_files=False` and deterministic tf.data
(the default; TFDS's file interleave is then fixed too). Reading stops once every class has
n examples (plus tf.data's read-ahead), so for n=10 most of the 1.28 M images are never read.

Use on every process with the *whole* split, then each process keeps its share:

  ds = builder.as_dataset(split="train", shuffle_files=False,
                          decoders={"image": tfds.decode.SkipDecoding()})
  total = per_class_available(ds, 10, 1000).sum()   # 10 * 1000, or fewer when classes lack images
  ds = per_class_subset(ds, n_per_class=10, num_classes=1000,
                        process_index=jax.process_index(), process_count=jax.process_count())
  counts = per_class_subset_counts(10, 1000, jax.process_count(), total)   # per process

(A selection done after splitting the split per process would give n per class *per
process*, not n per class in total.)
"""
from __future__ import annotations

import numpy as np


def per_class_subset(ds, n_per_class: int, num_classes: int, *, label_key: str = "label",
                     process_index: int = 0, process_count: int = 1):
  """The first `n_per_class` examples of each class, then this process's share.

  Args:
    ds: a tf.data.Dataset of dict examples in a deterministic order (the whole split).
    n_per_class: examples kept per class (classes with fewer keep all of theirs).
    num_classes: labels are ints in [0, num_classes); others (e.g. -1) are dropped.
    label_key: the label feature.
    process_index, process_count: the selection is sharded round-robin
      (`Dataset.shard`), so process p gets selected examples p, p + P, p + 2P, ...

  Returns:
    A tf.data.Dataset with the same element spec.
  """
  import tensorflow as tf  # lazy: TF costs ~6 s
  if n_per_class < 1 or num_classes < 1:
    raise ValueError(f"n_per_class ({n_per_class}) and num_classes ({num_classes}) must be "
                     ">= 1.")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} is not in [0, {process_count}).")
  n = tf.constant(n_per_class, tf.int64)

  def step(state, ex):
    counts, done_before = state
    y = tf.cast(ex[label_key], tf.int64)
    valid = (y >= 0) & (y < num_classes)
    yc = tf.clip_by_value(y, 0, num_classes - 1)
    keep = valid & (tf.gather(counts, yc) < n)
    counts = tf.tensor_scatter_nd_add(counts, [[yc]], [tf.cast(keep, tf.int64)])
    return (counts, tf.reduce_all(counts >= n)), (ex, keep, done_before)

  init = (tf.zeros([num_classes], tf.int64), tf.constant(False))
  ds = ds.scan(init, step)
  # Stop right after the example that completed the last class.
  ds = ds.take_while(lambda ex, keep, done_before: tf.logical_not(done_before))
  # one lambda per line, with its own argument names: AutoGraph cannot tell apart two lambdas of
  # one signature on one line (it warns, per call, that it cannot convert them)
  ds = ds.filter(lambda ex, keep, done_before: keep)
  ds = ds.map(lambda example, kept, done: example)
  if process_count > 1:
    ds = ds.shard(process_count, process_index)
  return ds


def per_class_subset_counts(n_per_class: int, num_classes: int,
                            process_count: int = 1, total: int | None = None) -> list[int]:
  """Examples per process of `per_class_subset`: of `total` selected examples (the real count,
  `per_class_available(...).sum()`), or of n_per_class * num_classes when every class has
  at least n_per_class (total=None)."""
  if total is None:
    total = n_per_class * num_classes
  return [int(c) for c in np.array([total // process_count] * process_count)
          + (np.arange(process_count) < total % process_count)]


def per_class_available(ds, n_per_class: int, num_classes: int, *,
                        label_key: str = "label", chunk: int = 4096) -> np.ndarray:
  """How many examples `per_class_subset` selects of each class: int64 [num_classes], each
  min(n_per_class, the examples of that class in `ds`). Reads only the labels (pass `ds`
  with images undecoded) and stops, like the selection, once every class has n_per_class; a
  split that lacks some classes, or has fewer of them, is read to its end."""
  import tensorflow as tf  # lazy: TF costs ~6 s
  if n_per_class < 1 or num_classes < 1:
    raise ValueError(f"n_per_class ({n_per_class}) and num_classes ({num_classes}) must be "
                     ">= 1.")
  counts = np.zeros(num_classes, np.int64)
  labels = ds.map(lambda ex: tf.cast(ex[label_key], tf.int64)).batch(chunk)
  for y in labels.as_numpy_iterator():
    y = y[(y >= 0) & (y < num_classes)]
    counts += np.bincount(y, minlength=num_classes)
    np.minimum(counts, n_per_class, out=counts)
    if counts.min() >= n_per_class:
      break
  return counts
