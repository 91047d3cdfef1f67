"""Progress bars (tqdm) with images/s and ETA for the long stages, on process 0 only.

  bar = progress.bar(total_examples, "id_fit")
  for batch in batches:
    ...
    bar.update(n_real_examples)
  bar.close()

`batches(it, total, desc)` wraps a batch iterator of the input pipeline and counts each
batch's real (unpadded) examples.
"""
from __future__ import annotations

import sys
from typing import Iterable, Iterator, Optional

import jax
import numpy as np
import tqdm


def bar(total: Optional[int], desc: str, unit: str = "img") -> tqdm.tqdm:
  """A tqdm bar on stderr (a no-op bar off process 0) showing rate (unit/s) and ETA."""
  return tqdm.tqdm(total=total, desc=desc, unit=unit, unit_scale=False, file=sys.stderr,
                        dynamic_ncols=True, mininterval=0.5, smoothing=0.1,
                        disable=jax.process_index() != 0)


def batches(it: Iterable[dict[str, np.ndarray]], total: Optional[int],
            desc: str) -> Iterator[dict[str, np.ndarray]]:
  """Yields the batches of `it`, advancing a bar by each batch's `_mask`ed examples."""
  b = bar(total, desc)
  try:
    for batch in it:
      yield batch
      mask = batch.get("_mask")
      b.update(int(np.sum(mask)) if mask is not None else len(batch["image"]))
  finally:
    b.close()
