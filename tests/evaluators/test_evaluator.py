"""The big_vision-style evaluator, driven the way big_vision's train.py drives a jit evaluator."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from fi_jax.data import loader as data
from fi_jax.evaluators import ood
from fi_jax.models import vit

ID = (0, 1, 2)
PP = "value_range(-1, 1, 0, 16)"


def test_evaluator_under_disallowed_transfers():
  model = vit.Model(len(ID), patch_size=(2, 2), width=32, depth=1, mlp_dim=64, num_heads=2,
                    head_zeroinit=False)   # a zero head: constant MSP, a degenerate detector
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)))["params"]
  train_state = {"params": params}

  def predict_fn(ts, batch):
    return model.apply({"params": ts["params"]}, batch["image"])

  assert ood.API == "jit"
  ev = ood.Evaluator(
      predict_fn, batch_size=32, devices=jax.devices(), pp_fn=PP,
      id_fit=dict(source="digits", split="train", classes=ID),
      id_test=dict(source="digits", split="test", classes=ID),
      ood={"rest": dict(source="digits", split="test", classes=(7, 8, 9), id_classes=ID)},
      detectors=("msp", "mds"))
  with jax.transfer_guard("disallow"):
    got = dict(ev.run(train_state))
  assert set(got) == {"id_accuracy"} | {f"rest/{d}/{k}" for d in ("msp", "mds")
                                        for k in ("auroc", "fpr95", "fpr95_ood_positive")}
  # MSP AUROC equals sklearn on the model's own softmax outputs
  id_x = data.load_digits_split("test", ID)["image"] / 8 - 1
  ood_x = data.load_digits_split("test", (7, 8, 9), id_classes=ID)["image"] / 8 - 1
  msp = lambda x: np.asarray(jax.nn.softmax(model.apply({"params": params}, x)[0]).max(-1))
  s_id, s_ood = msp(id_x), msp(ood_x)
  ref = roc_auc_score(np.r_[np.ones(len(s_id)), np.zeros(len(s_ood))], np.r_[s_id, s_ood])
  assert got["rest/msp/auroc"] == pytest.approx(ref, abs=1e-4)
