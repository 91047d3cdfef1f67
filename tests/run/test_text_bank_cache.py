"""fi_jax.run.model: the text banks the configured detectors read (NegLabel, CSP) are asked of
the model and cached beside its head; a rerun reads them without building the model, and a run
that needs a bank the cache lacks builds the model again."""
import numpy as np

from configs import common
from fi_jax.common.outputs import Head
from fi_jax.run import model as run_model


class _Model:
  """A LazyModel stand-in that counts builds."""

  def __init__(self, head):
    self.head, self.builds = head, 0

  def get(self):
    self.builds += 1
    return None, None, self.head, {}


def test_banks_cached_beside_the_head(tmp_path):
  c = common.base_config()
  c.detectors = ("msp", "neglabel")
  assert run_model.text_banks(c) == ("neglabel",)
  texts = {"neglabel/emb": np.ones((3, 2), np.float32), "neglabel/pos": np.ones((2, 2), np.float32),
           "neglabel/lexfile": np.zeros(3, np.int32), "neglabel/word": np.arange(3, dtype=np.int32),
           "csp/emb": np.zeros((3, 2), np.float32)}
  model = _Model(Head(np.eye(2, dtype=np.float32), np.zeros(2, np.float32), texts))
  head = run_model.cached_head(c, model, str(tmp_path))
  assert model.builds == 1 and sorted(head.texts) == sorted(k for k in texts if "neglabel" in k)
  again = run_model.cached_head(c, model, str(tmp_path))
  assert model.builds == 1
  np.testing.assert_array_equal(again.texts["neglabel/word"], texts["neglabel/word"])
  c.detectors = ("neglabel", "csp")                   # csp's bank is not cached yet
  assert set(run_model.cached_head(c, model, str(tmp_path)).texts) == set(texts)
  assert model.builds == 2
  c.detectors = ("msp",)
  assert run_model.cached_head(c, model, str(tmp_path)).texts is None
