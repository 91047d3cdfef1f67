"""fi_jax.metrics: equality with sklearn / numpy (ties, saturation), properties, per-class
(macro) aggregation, bootstrap, input checks, 8-device sharding and the float32 path.

Sizes stay <= 512 per set where possible: fi_jax pads to bucket sizes, so one compilation
serves most tests.
"""
import inspect
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from fi_jax.metrics import device as metrics
from tests.helpers import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS = ("auroc", "fpr95", "fpr95_ood_positive", "fpr95_ninco", "aupr_in", "aupr_out",
        "detection_error", "tnr95")
RANK_KEYS = tuple(k for k in KEYS if k != "fpr95_ninco")   # invariant to monotone maps


def ref_metrics(x, y, tpr=0.95, drop_intermediate=False):
  """sklearn / numpy reference for every metric (definitions in fi_jax/metrics/device.py)."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  lab = np.r_[np.ones(len(x)), np.zeros(len(y))]
  s = np.r_[x, y]
  out = {"auroc": roc_auc_score(lab, s)}
  fpr, tp, _ = roc_curve(lab, s, drop_intermediate=drop_intermediate)
  out["fpr95"] = fpr[np.argmax(tp >= tpr)]
  out["tnr95"] = 1 - out["fpr95"]
  out["detection_error"] = np.min(0.5 * (1 - tp) + 0.5 * fpr)
  fpr, tp, _ = roc_curve(1 - lab, -s, drop_intermediate=drop_intermediate)
  out["fpr95_ood_positive"] = fpr[np.argmax(tp >= tpr)]
  out["fpr95_ninco"] = np.mean(y >= np.quantile(x, 1 - tpr))
  out["aupr_in"] = average_precision_score(lab, s)
  out["aupr_out"] = average_precision_score(1 - lab, -s)
  return out


def make_scores(kind, rng, n_id, n_ood):
  x, y = rng.normal(1.0, 1.0, n_id), rng.normal(0.0, 1.0, n_ood)
  if kind == "ties":
    x, y = np.round(x, 1), np.round(y, 1)
  elif kind == "saturated":                    # float32-MSP-like: many exact 1.0 on both sides
    x, y = np.minimum(np.round(x, 2), 1.0), np.minimum(np.round(y + 0.8, 2), 1.0)
  return x, y


def assert_close(got, want, keys=KEYS, tol=1e-12):
  for k in keys:
    assert got[k] == pytest.approx(want[k], abs=tol), (k, got[k], want[k])


# ----------------------------------------------------------------------------- vs sklearn

@pytest.mark.parametrize("kind", ["continuous", "ties", "saturated"])
@pytest.mark.parametrize("tpr", [0.95, 0.8, 1.0])
def test_matches_sklearn(kind, tpr):
  rng = np.random.default_rng([len(kind), int(tpr * 100)])     # deterministic per case
  for n_id, n_ood in [(500, 300), (37, 11), (1, 1), (2, 7)]:
    x, y = make_scores(kind, rng, n_id, n_ood)
    got = metrics.ood_metrics(x, y, tpr=tpr)
    assert_close(got, ref_metrics(x, y, tpr))
    assert (got["n_id"], got["n_ood"], got["tpr"]) == (n_id, n_ood, tpr)


def test_saturation_separates_conventions():
  """docs/metrics.md#fpr95_ood_positive: with a block of exact 1.0 scores OpenOOD v1.5's FPR jumps
  to 100%."""
  rng = np.random.default_rng(0)
  x = np.where(rng.random(400) < 0.6, 1.0, rng.random(400))
  y = np.where(rng.random(300) < 0.16, 1.0, rng.random(300) * 0.9)
  got = metrics.ood_metrics(x, y)
  assert_close(got, ref_metrics(x, y))
  assert got["fpr95_ood_positive"] == 1.0 and got["fpr95"] < 0.9


def test_larger_bucket_and_types():
  rng = np.random.default_rng(1)
  x, y = make_scores("ties", rng, 1500, 600)
  got = metrics.ood_metrics(x.astype(np.float32), y.astype(np.float32))
  assert_close(got, ref_metrics(x.astype(np.float32), y.astype(np.float32)))
  assert all(type(v) is float for v in got.values())
  assert set(got) == set(KEYS) | {"n_id", "n_ood", "tpr"}
  got_int = metrics.ood_metrics(np.arange(20), np.arange(5, 12))   # integer scores
  assert_close(got_int, ref_metrics(np.arange(20), np.arange(5, 12)))


def test_drop_intermediate_corner_case():
  """Threshold-exact FPR; sklearn's default roc_curve drops the collinear crossing point."""
  x = np.array([3.0, 2.0, 1.0, 0.0])
  y = np.array([3.0, 2.0, 1.0, 0.0])          # four tie blocks of (1 ID, 1 OOD)
  got = metrics.ood_metrics(x, y, tpr=0.5)
  assert got["fpr95"] == 0.5 == ref_metrics(x, y, 0.5)["fpr95"]
  assert ref_metrics(x, y, 0.5, drop_intermediate=True)["fpr95"] == 1.0
  rng = np.random.default_rng(2)               # without ties both agree
  x, y = make_scores("continuous", rng, 300, 200)
  assert_close(metrics.ood_metrics(x, y), ref_metrics(x, y, drop_intermediate=True),
               keys=("fpr95", "fpr95_ood_positive"))


def test_negative_zero_ties_with_zero():
  x, y = np.array([0.0, -0.0, 1.0, -1.0]), np.array([-0.0, 0.0, 0.5])
  assert_close(metrics.ood_metrics(x, y), ref_metrics(x, y))


# ----------------------------------------------------------------------------- properties

tie_scores = st.lists(st.integers(0, 12), min_size=1, max_size=60)


@settings(max_examples=50, deadline=None)
@given(x=tie_scores, y=tie_scores, data=st.data())
def test_invariant_to_increasing_transform(x, y, data):
  table = np.sort(np.asarray(data.draw(st.lists(
      st.floats(-1e6, 1e6, allow_nan=False), min_size=13, max_size=13, unique=True))))
  x, y = np.asarray(x), np.asarray(y)
  a = metrics.ood_metrics(x, y)
  b = metrics.ood_metrics(table[x], table[y])
  assert_close(b, a, keys=RANK_KEYS, tol=1e-12)
  assert_close(a, ref_metrics(x, y))


@settings(max_examples=50, deadline=None)
@given(x=tie_scores, y=tie_scores, tpr=st.sampled_from([0.95, 0.9, 0.5]))
def test_swap_relations(x, y, tpr):
  x, y = np.asarray(x, float), np.asarray(y, float)
  a = metrics.ood_metrics(x, y, tpr=tpr)
  b = metrics.ood_metrics(-y, -x, tpr=tpr)      # OOD becomes ID, scores negated
  assert b["auroc"] == pytest.approx(a["auroc"], abs=1e-12)
  assert b["aupr_in"] == pytest.approx(a["aupr_out"], abs=1e-12)
  assert b["aupr_out"] == pytest.approx(a["aupr_in"], abs=1e-12)
  assert b["fpr95"] == a["fpr95_ood_positive"]
  assert b["fpr95_ood_positive"] == a["fpr95"]
  assert b["detection_error"] == pytest.approx(a["detection_error"], abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(x=st.lists(st.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False), min_size=1,
                  max_size=80),
       y=st.lists(st.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False), min_size=1,
                  max_size=80))
def test_arbitrary_floats_match_sklearn(x, y):
  # subnormal scores: the pinned cases below (XLA:CPU flushes subnormal arithmetic to zero)
  assert_close(metrics.ood_metrics(x, y), ref_metrics(x, y))


@pytest.mark.parametrize("x, y", [([2.225073858507e-311], [0.0]),
                                  ([5e-324, 5e-324, 1.0], [0.0, 5e-324, -1e-310])])
def test_subnormal_scores_match_sklearn(x, y):
  """Subnormal scores compare exactly (integer keys) and a quantile between equal order
  statistics keeps their value (found by hypothesis: the NINCO threshold was flushed to 0)."""
  assert_close(metrics.ood_metrics(x, y), ref_metrics(x, y))


# ----------------------------------------------------------------------------- per class

def grouped_data(seed, layout="small_classes"):
  """Ties, -1 (no class), non-contiguous ids; many small classes (Fi-ImageNet-like) or a few
  large ones (NINCO-like) -- the two per-class aupr_in strategies."""
  rng = np.random.default_rng(seed)
  x, y = make_scores("ties", rng, 480, 400)
  if layout == "small_classes":
    ids = np.r_[7, 10**6, rng.choice(5000, 150, replace=False)]
    g = np.r_[ids, rng.choice(ids[:20], 400 - len(ids) - 40), np.full(40, -1)]
  else:
    g = np.r_[rng.choice([3, 9, 12, 40, 41], 360), np.full(40, -1)]
  return x, y, rng.permutation(g)


@pytest.mark.slow
@pytest.mark.parametrize("layout, tpr", [("small_classes", 0.95), ("small_classes", 0.7),
                                         ("large_classes", 0.95)])
def test_macro_and_table_match_sklearn_loop(layout, tpr):
  x, y, g = grouped_data(0, layout)
  classes = np.unique(g[g >= 0])
  want = [ref_metrics(x, y[g == c], tpr) for c in classes]
  got = metrics.ood_metrics(x, y, tpr=tpr, ood_groups=g)
  table = metrics.per_group_metrics(x, y, g, tpr=tpr)
  np.testing.assert_array_equal(table["group"], classes)
  np.testing.assert_array_equal(table["n_ood"], [np.sum(g == c) for c in classes])
  for k in KEYS:
    np.testing.assert_allclose(table[k], [w[k] for w in want], rtol=0, atol=1e-12, err_msg=k)
    if k != "tnr95":
      assert got[f"{k}_macro"] == pytest.approx(np.mean([w[k] for w in want]), abs=1e-12), k
  assert got["n_ood_groups"] == len(classes)
  # samples without a class (-1) still count in the pooled metrics
  assert_close(got, ref_metrics(x, y, tpr))


def test_single_group_macro_equals_pooled():
  x, y, _ = grouped_data(1)
  got = metrics.ood_metrics(x, y, ood_groups=np.full(len(y), 3))
  for k in metrics.METRICS:
    assert got[f"{k}_macro"] == pytest.approx(got[k], abs=1e-12), k


# ----------------------------------------------------------------------------- bootstrap

@pytest.mark.slow
def test_bootstrap_matches_numpy_reference_loop():
  rng = np.random.default_rng(3)
  x, y = make_scores("ties", rng, 300, 120)
  n_boot, ci = 25, 0.9
  got = metrics.ood_metrics(x, y, n_bootstrap=n_boot, ci=ci, seed=11)
  ii, oo = metrics.bootstrap_indices(len(x), len(y), n_boot, seed=11)
  assert ii.shape == (n_boot, 300) and oo.shape == (n_boot, 120)
  xs, ys = np.sort(x), np.sort(y)
  reps = [ref_metrics(xs[ii[b]], ys[oo[b]]) for b in range(n_boot)]
  for k in KEYS:
    lo, hi = np.quantile([r[k] for r in reps], [(1 - ci) / 2, (1 + ci) / 2])
    assert got[f"{k}_ci_low"] == pytest.approx(lo, abs=1e-12), k
    assert got[f"{k}_ci_high"] == pytest.approx(hi, abs=1e-12), k
  assert_close(got, ref_metrics(x, y))                   # point estimates unchanged
  assert got["n_bootstrap"] == n_boot and got["ci_level"] == ci


@pytest.mark.slow
def test_bootstrap_seeded_and_contains_estimate():
  rng = np.random.default_rng(4)
  x, y = make_scores("continuous", rng, 500, 300)
  a = metrics.ood_metrics(x, y, n_bootstrap=25, seed=0)
  assert a == metrics.ood_metrics(x, y, n_bootstrap=25, seed=0)
  b = metrics.ood_metrics(x, y, n_bootstrap=25, seed=1)
  assert a["auroc_ci_low"] != b["auroc_ci_low"]
  for k in KEYS:
    assert a[f"{k}_ci_low"] <= a[k] <= a[f"{k}_ci_high"], k
    assert a[f"{k}_ci_high"] - a[f"{k}_ci_low"] < 0.2, k
  ii, _ = metrics.bootstrap_indices(500, 300, 25, seed=0)
  assert ii.min() >= 0 and ii.max() < 500 and len({tuple(r[:20]) for r in ii}) == 25


# ----------------------------------------------------------------------------- checks / misc

@pytest.mark.parametrize("kwargs, match", [
    (dict(id_scores=[0.1, np.nan], ood_scores=[0.2]), "id_scores.*NaN"),
    (dict(id_scores=[0.1], ood_scores=[np.inf, 0.0]), "ood_scores.*infinite"),
    (dict(id_scores=[], ood_scores=[0.2]), "id_scores is empty"),
    (dict(id_scores=[0.1], ood_scores=np.zeros((2, 1))), "ood_scores must be a 1-D"),
    (dict(id_scores=[0.1], ood_scores=[0.2, 0.3], ood_groups=[1]), "ood_groups must be 1-D"),
    (dict(id_scores=[0.1], ood_scores=[0.2], ood_groups=[[1]]), "ood_groups must be 1-D"),
    (dict(id_scores=[0.1], ood_scores=[0.2], ood_groups=[1.5]), "ood_groups must hold int"),
    (dict(id_scores=[0.1], ood_scores=[0.2, 0.3], ood_groups=[-1, -2]), "no class id >= 0"),
    (dict(id_scores=[0.1], ood_scores=[0.2], tpr=0.0), "tpr must be in"),
    (dict(id_scores=[0.1], ood_scores=[0.2], n_bootstrap=-1), "n_bootstrap must be"),
    (dict(id_scores=[0.1], ood_scores=[0.2], ci=1.0), "ci must be in"),
])
def test_bad_input_raises(kwargs, match):
  with pytest.raises(ValueError, match=match):
    metrics.ood_metrics(kwargs.pop("id_scores"), kwargs.pop("ood_scores"), **kwargs)


def test_device_arrays_without_implicit_transfers():
  rng = np.random.default_rng(5)
  x, y = make_scores("ties", rng, 200, 100)
  g = rng.integers(0, 9, 100)
  xd, yd, gd = jax.device_put(x), jax.device_put(y), jax.device_put(g)
  logits, labels = jax.device_put(rng.normal(size=(50, 4))), jax.device_put(np.arange(50) % 5 - 1)
  with jax.transfer_guard("disallow"):     # (bootstrap too: see the 8-device test)
    got = metrics.ood_metrics(xd, yd, ood_groups=gd)
    metrics.classification_accuracy(logits, labels)
  assert_close(got, ref_metrics(x, y))


def test_classification_accuracy():
  rng = np.random.default_rng(6)
  logits = rng.normal(size=(300, 7))
  labels = rng.integers(-2, 7, 300)
  keep = labels >= 0
  want = np.mean(np.argmax(logits[keep], 1) == labels[keep])
  assert metrics.classification_accuracy(logits, labels) == pytest.approx(want, abs=1e-15)
  assert metrics.classification_accuracy(jnp.asarray(logits), jnp.asarray(labels)) == \
      pytest.approx(want, abs=1e-15)
  assert np.isnan(metrics.classification_accuracy(logits[:3], np.full(3, -1)))
  with pytest.raises(ValueError, match="logits must be"):
    metrics.classification_accuracy(logits[0], labels[:1])
  with pytest.raises(ValueError, match="labels must be 1-D"):
    metrics.classification_accuracy(logits, labels[:5])


# ----------------------------------------------------------------------------- subprocesses

def run_script(body, env):
  src = "\n".join([inspect.getsource(ref_metrics), inspect.getsource(make_scores),
                   textwrap.dedent(body)])
  res = subprocess.run([sys.executable, "-c", src], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu", **env})
  assert res.returncode == 0, res.stderr[-4000:]
  return json.loads(res.stdout.strip().splitlines()[-1])


SHARDED = """
import json, numpy as np, jax
from jax.sharding import NamedSharding, PartitionSpec as P
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve
jax.config.update("jax_enable_x64", True)
from fi_jax.metrics import device as metrics
assert jax.device_count() == 8
mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
shard = lambda a: jax.device_put(a, NamedSharding(mesh, P("d")))
rng = np.random.default_rng(0)
x, y = make_scores("ties", rng, 4000, 800)
g = rng.integers(-1, 60, 800)
xs, ys, gs = shard(x), shard(y), shard(g)
assert len(xs.sharding.device_set) == 8
kw = dict(n_bootstrap=20, seed=3)
with jax.transfer_guard("disallow"):        # no implicit host round trip on the way
  a = metrics.ood_metrics(xs, ys, ood_groups=gs, **kw)
b = metrics.ood_metrics(x, y, ood_groups=g, **kw)
ta, tb = metrics.per_group_metrics(xs, ys, gs), metrics.per_group_metrics(x, y, g)
same_table = all(np.array_equal(ta[k], tb[k]) for k in tb)
print(json.dumps(dict(sharded=a, single=b, same_table=same_table)))
"""


@pytest.mark.slow
def test_sharded_over_8_devices_equals_single_device():
  out = run_script(SHARDED, {"XLA_FLAGS": subprocess_env.xla_flags(8)})
  assert out["sharded"] == out["single"]
  assert out["same_table"]
  assert "auroc_macro" in out["sharded"] and "auroc_ci_low" in out["sharded"]


FLOAT32 = """
import json, numpy as np, jax
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve
from fi_jax.metrics import device as metrics
assert not jax.config.jax_enable_x64
rng = np.random.default_rng(0)
errs = {}
for kind in ("continuous", "ties", "saturated"):
  x, y = make_scores(kind, rng, 3000, 700)
  x, y = x.astype(np.float32), y.astype(np.float32)   # the values fi_jax sees
  got = metrics.ood_metrics(x, y, n_bootstrap=10)
  want = ref_metrics(x, y)
  errs[kind] = {k: abs(got[k] - want[k]) for k in want}
  g = rng.integers(0, 30, 700)
  got = metrics.ood_metrics(x, y, ood_groups=g)
  want = [ref_metrics(x, y[g == c]) for c in np.unique(g)]
  errs[kind + "_macro"] = {k: abs(got[k + "_macro"] - np.mean([w[k] for w in want]))
                           for k in want[0] if k != "tnr95"}
print(json.dumps(errs))
"""


@pytest.mark.slow
def test_float32_path_matches_sklearn():
  """x64 off: counts exact, sums in float32 -> agreement to 1e-6 (FPRs to 1e-7)."""
  errs = run_script(FLOAT32, {"JAX_ENABLE_X64": "0"})
  for case, e in errs.items():
    for k, v in e.items():
      tol = 1e-7 if k.startswith(("fpr", "tnr")) else 1e-6
      assert v <= tol, (case, k, v)


@pytest.mark.slow
def test_ten_million_scores():
  rng = np.random.default_rng(7)
  x = np.round(rng.normal(1.0, 1.0, 9_000_000), 4)
  y = np.round(rng.normal(0.0, 1.0, 1_000_000), 4)
  got = metrics.ood_metrics(x, y)
  assert_close(got, ref_metrics(x, y), tol=1e-9)


MULTI_PROCESS = """
import json, sys, numpy as np, jax
pid, port = int(sys.argv[1]), sys.argv[2]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=pid, coordinator_bind_address=f"127.0.0.1:{port}")
jax.config.update("jax_enable_x64", True)
from jax.sharding import NamedSharding, PartitionSpec as P
from fi_jax.metrics import device as metrics
mesh = jax.make_mesh((jax.device_count(),), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
rng = np.random.default_rng(0)
x, y = np.round(rng.normal(1, 1, 4000), 1), np.round(rng.normal(0, 1, 800), 1)
g = rng.integers(-1, 60, 800)
def global_array(a):      # each process holds half of the samples
  n = len(a) // 2
  return jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), a[pid * n:][:n])
xs, ys, gs = global_array(x), global_array(y), global_array(g)
assert not xs.is_fully_addressable and jax.device_count() == 4
kw = dict(n_bootstrap=20, seed=3)
with jax.transfer_guard("disallow"):
  a = metrics.ood_metrics(xs, ys, ood_groups=gs, **kw)
b = metrics.ood_metrics(x, y, ood_groups=g, **kw)
print(json.dumps(dict(equal=a == b, n_groups=a["n_ood_groups"])))
"""


@pytest.mark.slow
def test_two_processes_global_arrays_equal_local():
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = str(s.getsockname()[1])
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2",
         "XLA_FLAGS": subprocess_env.xla_flags()}
  procs = [subprocess.Popen([sys.executable, "-c", MULTI_PROCESS, str(i), port], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  try:
    outs = [p.communicate(timeout=600) for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-4000:]
    res = json.loads(out.strip().splitlines()[-1])
    assert res == {"equal": True, "n_groups": 60.0}
