"""Full-spectrum (OpenOOD v1.5 "FS") rows and accuracies against OpenOOD's own definition.

The reference below is written from OpenOOD at commit 3c35632ee91b54b09d1f085d04f94744cece7d0b
(github.com/Jingkang50/OpenOOD, 2025-12-01): `openood/evaluation_api/evaluator.py`
(`Evaluator.eval_ood(fsood=True)`: the ID test scores followed by every csid set's scores form
the ID side of each OOD set; `eval_acc('csid')`: top-1 pooled over the csid sets and the ID test
set) and `openood/evaluators/metrics.py` (`auc_and_fpr_recall`: OOD is the positive class,
`roc_curve(ood_indicator, -conf)`, FPR = the first point with TPR >= 0.95, AUROC = the area
under that curve). OpenOOD's AUPR is a trapezoid over the PR curve, not fi_jax's average
precision (docs/metrics.md), so only AUROC and FPR@95 are compared.
"""
import numpy as np
import pytest
from sklearn import metrics as skm

from fi_jax import pipeline
from fi_jax.data import class_subsets


def openood_fs(id_conf, csid_confs, ood_conf):
  """OpenOOD v1.5's FS (FPR@95, AUROC) of one OOD set, as its evaluator computes them."""
  conf = np.concatenate([id_conf, *csid_confs, ood_conf])
  label = np.concatenate([np.zeros(len(id_conf) + sum(map(len, csid_confs))),
                          -np.ones(len(ood_conf))])
  ood_indicator = (label == -1).astype(int)
  fpr_list, tpr_list, _ = skm.roc_curve(ood_indicator, -conf)   # sklearn's defaults, as OpenOOD
  return fpr_list[np.argmax(tpr_list >= 0.95)], skm.auc(fpr_list, tpr_list)


def openood_csid_acc(pred_label_pairs):
  correct = sum(int((p == y).sum()) for p, y in pred_label_pairs)
  return correct / sum(len(y) for _, y in pred_label_pairs)


@pytest.mark.slow
@pytest.mark.parametrize("ties", [False, True])
def test_full_spectrum_rows_equal_openood(ties):
  rng = np.random.default_rng(3)
  draw = lambda n, mu: rng.normal(mu, 1.0, n)   # noqa: E731
  if ties:   # coarse scores: many tied values across ID, csid and OOD
    draw = lambda n, mu: np.round(rng.normal(mu, 1.0, n), 1)   # noqa: E731
  scores, sets = {}, {"id_test": {}, "csid/v2": {}, "csid/r": {}, "ood/a": {}, "ood/b": {}}
  for det, shift in (("msp", 1.0), ("energy", 0.5)):
    scores[det] = {"id_test": draw(300, shift), "csid/v2": draw(120, shift - 0.4),
                   "csid/r": draw(90, shift - 1.0), "ood/a": draw(200, 0.0),
                   "ood/b": draw(150, -0.3)}
  rows = pipeline.full_spectrum_rows(scores, sets, ["csid/v2", "csid/r"], model="m",
                                     id_set="id + v2 + r")
  assert len(rows) == 4
  standard = {(r["detector"], r["ood_set"]): r
              for r in pipeline.metric_rows(scores, sets, model="m", id_set="id")}
  for r in rows:
    s = scores[r["detector"]]
    fpr, auroc = openood_fs(s["id_test"], [s["csid/v2"], s["csid/r"]], s["ood/" + r["ood_set"]])
    assert r["id_set"] == "id + v2 + r"
    assert r["n_id"] == 300 + 120 + 90
    assert r["fpr95_ood_positive"] == pytest.approx(fpr, abs=1e-12)
    assert r["auroc"] == pytest.approx(auroc, abs=1e-12)
    # the shifted sets score lower than the ID test set, so FS is harder than the standard row
    assert r["auroc"] < standard[(r["detector"], r["ood_set"])]["auroc"]


def test_full_spectrum_rows_need_every_id_side_set():
  scores = {"msp": {"id_test": np.ones(3), "ood/a": np.zeros(3)}}
  assert pipeline.full_spectrum_rows(scores, {"ood/a": {}}, ["csid/v2"]) == []
  with pytest.raises(ValueError, match="at least one covariate-shifted"):
    pipeline.full_spectrum_rows(scores, {}, [])


def test_pooled_accuracy_is_openoods_csid_acc():
  rng = np.random.default_rng(0)
  sets, pairs = [], []
  for n in (50, 30, 20):
    logits, labels = rng.normal(size=(n, 7)), rng.integers(0, 7, n)
    sets.append({"logits": logits, "label": labels})
    pairs.append((logits.argmax(1), labels))
  assert pipeline.pooled_accuracy(sets) == pytest.approx(openood_csid_acc(pairs), abs=0)
  assert pipeline.pooled_accuracy([{"logits": np.zeros((2, 3)), "label": -np.ones(2, int)}]) is None


def test_subset_accuracy_takes_the_argmax_over_the_subset():
  """ImageNet-R / -A: the prediction is the best of the 200 subset classes, even when a class
  outside the subset has a larger logit (their papers' evaluation)."""
  subset = class_subsets.subset_indices("imagenet_r")
  rng = np.random.default_rng(1)
  n = 40
  labels = rng.choice(subset, n)
  logits = rng.normal(size=(n, 1000))
  logits[np.arange(n), labels] += 8.0               # the true class leads within the subset
  outside = np.setdiff1d(np.arange(1000), subset)
  logits[np.arange(n), rng.choice(outside, n)] += 16.0   # ... but an outside class leads overall
  logits[np.arange(5), labels[:5]] -= 30.0                   # five images wrong inside the subset too
  restricted = subset[np.argmax(logits[:, subset], axis=1)]
  expected = float(np.mean(restricted == labels))
  arrays = {"logits": logits, "label": labels}
  assert pipeline.id_accuracy(arrays, subset) == pytest.approx(expected, abs=1e-15)
  assert expected == pytest.approx(35 / 40)
  assert pipeline.id_accuracy(arrays) == 0.0        # the 1000-way argmax misses every one
  with pytest.raises(ValueError, match="not in the set's class_subset"):
    pipeline.id_accuracy({"logits": logits, "label": np.r_[outside[:1], labels[1:]]}, subset)


def test_class_subsets_are_200_imagenet_classes():
  for name in ("imagenet_r", "imagenet_a"):
    wnids = class_subsets.SUBSETS[name]
    assert len(set(wnids)) == 200 and list(wnids) == sorted(wnids)
    idx = class_subsets.subset_indices(name)
    labels = class_subsets.imagenet_wnids()
    assert [labels[i] for i in idx] == list(wnids)
  # a handful of known positions (ImageNet-1k label order): goldfish, great white shark (R)
  assert list(class_subsets.subset_indices("imagenet_r")[:2]) == [1, 2]
  assert list(class_subsets.subset_indices("imagenet_a")[:2]) == [6, 11]
  with pytest.raises(ValueError, match="Unknown class_subset"):
    class_subsets.subset_indices("imagenet_z")


def _log_msp(z):
  """log max softmax, a numpy reference."""
  z = z - z.max(1, keepdims=True)
  return -np.log(np.exp(z).sum(1))


@pytest.mark.slow
def test_restricted_full_spectrum_scores_the_subsets_logits():
  """ImageNet-R / -A rows in the 200-class label space: MSP and energy on logits[:, subset] of
  every set; the fit and ID test sets keep their images of the subset's classes, the shifted
  and OOD sets all rows; detectors that read more than the logits are left out; the rows equal
  OpenOOD's FS metrics on those restricted scores."""
  from scipy.special import logsumexp

  from fi_jax import detectors
  rng = np.random.default_rng(7)
  c, d = 12, 5
  subset = np.array([1, 4, 6, 9])
  def arrays(n, labels):
    return {"features": rng.normal(size=(n, d)), "logits": rng.normal(0, 2, (n, c)),
            "label": labels, "_id": np.arange(n)}
  sets = {"id_fit": arrays(60, rng.integers(0, c, 60)),
          "id_test": arrays(80, np.r_[rng.integers(0, c, 78), -1, 4]),
          "csid/r": arrays(50, rng.choice(subset, 50)),
          "ood/a": arrays(40, -np.ones(40, np.int64))}
  sets["csid/r"]["logits"][:, subset] += 1.0
  dets = {n: detectors.build(n) for n in ("msp", "energy", "vim")}
  head = detectors.Head(rng.normal(size=(d, c)), rng.normal(size=c))
  out = pipeline.restricted_full_spectrum(dets, sets, head, ["csid/r"], subset,
                                          id_set="id + r [4 classes]", model="m")
  in_subset = np.isin(sets["id_test"]["label"], subset)
  assert out["n_id_test"] == int(in_subset.sum()) and out["n_classes"] == 4
  assert out["csid_sets"] == ["r"] and out["detectors"] == ["msp", "energy"]   # not vim
  assert {r["detector"] for r in out["rows"]} == {"msp", "energy"}
  z_id = sets["id_test"]["logits"][in_subset][:, subset]
  z_r, z_ood = sets["csid/r"]["logits"][:, subset], sets["ood/a"]["logits"][:, subset]
  for det, f in (("msp", _log_msp), ("energy", lambda z: logsumexp(z, axis=1))):
    (row,) = [r for r in out["rows"] if r["detector"] == det]
    fpr, auroc = openood_fs(f(z_id), [f(z_r)], f(z_ood))
    assert row["id_set"] == "id + r [4 classes]" and row["n_id"] == len(z_id) + 50
    assert row["auroc"] == pytest.approx(auroc, abs=1e-12)
    assert row["fpr95_ood_positive"] == pytest.approx(fpr, abs=1e-12)
  # accuracy: argmax over the subset, pooled over the kept ID test images and the shifted set
  pred = np.r_[z_id.argmax(1), z_r.argmax(1)]
  truth = np.searchsorted(subset, np.r_[sets["id_test"]["label"][in_subset], sets["csid/r"]["label"]])
  assert out["accuracy"] == pytest.approx(np.mean(pred == truth), abs=1e-15)
  # a detector that fits (KL-Matching, TempScale) sees the fit set's images of the subset only
  restricted_fit = pipeline.restrict_to_classes(sets["id_fit"], subset, keep_rows="labelled")
  assert len(restricted_fit["logits"]) == int(np.isin(sets["id_fit"]["label"], subset).sum())
  assert restricted_fit["logits"].shape[1] == 4 and set(restricted_fit["label"]) <= {0, 1, 2, 3}
  # no labelled ID test image of the subset: nothing to compare, said so
  none = {**sets, "id_test": {**sets["id_test"], "label": -np.ones(80, np.int64)}}
  skipped = pipeline.restricted_full_spectrum(dets, none, head, ["csid/r"], subset)
  assert skipped["rows"] == [] and "no labelled image of the 4 classes" in skipped["skipped"]
