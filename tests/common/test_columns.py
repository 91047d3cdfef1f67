"""The column names of an extracted set (fi_jax/common/columns.py) and the Outputs/Head
containers: names built and parsed by one definition."""
import numpy as np
import pytest

from fi_jax.common import columns
from fi_jax.common.outputs import Head, Outputs


def test_scorer_and_layer_columns_round_trip():
  assert columns.scorer_column(columns.SCORE, "odin") == "score/odin"
  assert columns.scorer_column(columns.STAT, "adascale_a") == "stat/adascale_a"
  assert columns.scorer_of("score/odin") == "odin"
  assert columns.scorer_of("stat/adascale_a") == "adascale_a"
  col = columns.layer_column("gram", "block03")
  assert col == "layer/gram/block03" and columns.is_layer_column(col)
  assert columns.layer_group("gram") == "layer/gram" and col.startswith(columns.layer_group("gram"))
  for own in (*columns.MODEL_OUTPUTS, *columns.PASS_THROUGH, col):
    assert columns.scorer_of(own) is None, own


@pytest.mark.parametrize("name", columns.FILE_KEYS)
def test_file_keys_are_model_outputs_or_pass_through(name):
  assert name in columns.MODEL_OUTPUTS + columns.PASS_THROUGH


def test_outputs_and_head_hold_what_detectors_read():
  f, z = np.ones((3, 4), np.float32), np.zeros((3, 2), np.float32)
  out = Outputs(f, z, np.array([0, 1, -1]))
  assert out.features is f and out.logits is z and list(out.labels) == [0, 1, -1]
  head = Head(np.ones((4, 2)), np.zeros(2))
  assert head.w.shape == (4, 2) and head.b.shape == (2,)
