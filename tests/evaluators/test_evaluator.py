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


@pytest.mark.slow
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


@pytest.mark.slow
def test_evaluator_reports_full_spectrum_values_with_csid_sets():
  """csid= adds OpenOOD's full-spectrum values (ID side = ID test + shifted set), the pooled and
  per-set accuracy and, for a shifted set with a class_subset, the rows in that subset's label
  space; each equals sklearn / numpy on the model's own outputs."""
  from scipy.special import log_softmax
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(64, len(ID))), jnp.float32)

  def predict_fn(ts, batch):   # a linear model: one cheap compile
    x = batch["image"].reshape(len(batch["image"]), -1)
    return x @ ts["params"]["w"], {"pre_logits": x}
  ev = ood.Evaluator(
      predict_fn, batch_size=32, devices=jax.devices(), pp_fn=PP,
      id_fit=dict(source="digits", split="train", classes=ID),
      id_test=dict(source="digits", split="test", classes=ID),
      ood={"rest": dict(source="digits", split="test", classes=(7, 8, 9), id_classes=ID)},
      csid={"shift": dict(source="digits", split="train", classes=(0, 2), id_classes=ID,
                          class_subset=[0, 2])},
      detectors=("msp",), metric_keys=("auroc",))
  got = dict(ev.run({"params": {"w": w}}))
  assert set(got) == {"id_accuracy", "rest/msp/auroc", "fs/rest/msp/auroc", "fs/id_accuracy",
                      "csid/shift/accuracy", "fs_class_subset_of_shift/rest/msp/auroc",
                      "fs_class_subset_of_shift/id_accuracy"}

  def split(name, classes, id_classes=ID):
    d = data.load_digits_split(name, classes, id_classes=id_classes)
    x = (d["image"] / 8 - 1).reshape(len(d["image"]), -1)
    return np.asarray(x @ np.asarray(w, np.float64)), d["label"]
  z_id, y_id = split("test", ID)
  z_shift, y_shift = split("train", (0, 2))
  z_ood, _ = split("test", (7, 8, 9))
  msp = lambda z: log_softmax(z, axis=1).max(1)   # noqa: E731
  auroc = lambda a, b: roc_auc_score(np.r_[np.ones(len(a)), np.zeros(len(b))], np.r_[a, b])  # noqa: E731
  assert got["fs/rest/msp/auroc"] == pytest.approx(
      auroc(np.r_[msp(z_id), msp(z_shift)], msp(z_ood)), abs=1e-4)
  sub, keep = [0, 2], np.isin(y_id, [0, 2])
  assert got["fs_class_subset_of_shift/rest/msp/auroc"] == pytest.approx(
      auroc(np.r_[msp(z_id[keep][:, sub]), msp(z_shift[:, sub])], msp(z_ood[:, sub])), abs=1e-4)
  pooled = np.r_[z_id.argmax(1) == y_id, z_shift.argmax(1) == y_shift]
  assert got["fs/id_accuracy"] == pytest.approx(pooled.mean(), abs=1e-6)
  assert got["csid/shift/accuracy"] == pytest.approx(
      np.mean(np.array(sub)[z_shift[:, sub].argmax(1)] == y_shift), abs=1e-6)
