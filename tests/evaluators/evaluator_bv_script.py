"""Drives fi_jax.evaluators.ood the way big_vision's train.py does, on 8 simulated CPU devices
with x64 off; prints one JSON line of findings for tests/evaluators/test_evaluator_bv.py."""
import gc
import json
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fi_jax.data import loader as data
from fi_jax.evaluators import ood
from fi_jax.models import two_towers, vit
from fi_jax.models import zero_shot_head as zero_shot
from fi_jax.run import benchmark as fi_run

sys.path.insert(0, "configs")
import demo  # noqa: E402  (configs/demo.py)

ID, OOD = (0, 1, 2, 3, 4, 5), (6, 7, 8, 9)
PP_BV = ("value_range(-1, 1, 0, 16)|onehot(6, key='label', key_result='labels')"
         "|keep('image', 'labels')")
DETS = ("msp", "energy", "mds", "fdbd")
BS = 64
compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, dur, **kw: compiles.append(name)
    if name == "/jax/core/compile/backend_compile_duration" else None)


def sets_kw():
  return dict(id_fit=dict(source="digits", split="train", classes=ID),
              data=dict(source="digits", split="test", classes=ID),
              ood={"digits_6-9": dict(source="digits", split="test", classes=OOD, id_classes=ID)})


def evaluator(predict_fn, devices, **kw):
  # what big_vision's from_config passes: the config entry less type/pred/prefix, plus devices
  cfg = dict(pp_fn=PP_BV, log_percent=0.1, cache="final_data", detectors=DETS,
             input_std=(0.5,), **sets_kw())
  cfg.update(kw)
  return ood.Evaluator(predict_fn, batch_size=BS, devices=devices, **cfg)


def shard_tree(tree, mesh):
  """FSDP-style: each leaf's largest dimension split over the mesh when it divides."""
  def put(x):
    spec = [None] * x.ndim
    if x.ndim:
      d = int(np.argmax(x.shape))
      if x.shape[d] % mesh.size == 0:
        spec[d] = tuple(mesh.axis_names)
    return jax.device_put(x, NamedSharding(mesh, P(*spec)))
  return jax.tree.map(put, tree)


def bytes_on(tree, device):
  return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards
             if s.device == device)


def main():
  out = {}
  config = demo.get_config("quick=True")
  config.train = None
  config.random_init = True   # the random-init model is what the evaluator sees too
  # with a random head: a zero head's constant logits make msp/energy/fdbd degenerate (no rows)
  config.model.head_zeroinit = False
  config.x64 = False
  config.batch_size = BS
  config.detectors = list(DETS)
  config.metrics.n_bootstrap = 0
  config.metrics.per_group = False
  model = vit.Model(**config.model.to_dict())
  params = jax.jit(lambda: model.init(jax.random.PRNGKey(config.seed),
                                      jnp.zeros(config.init_shape)))()["params"]

  # ---- main.py on the same model and data
  with tempfile.TemporaryDirectory() as wd:
    res = fi_run.run(config, wd, log=lambda s: None)
  out["main"] = {f"{r['ood_set']}/{r['detector']}/{k}": r[k] for r in res["rows"]
                 for k in ("auroc", "fpr95", "fpr95_ood_positive")}
  out["main"]["id_accuracy"] = res["id_accuracy"]
  out["main_errors"] = sorted(res["meta"]["detector_errors"])

  # ---- train.py: a mesh, a sharded train state with optimizer moments, jitted predict_fn
  devices = np.asarray(jax.devices())
  mesh = Mesh(devices.reshape(4, 2), ("data", "fsdp"))
  seen_keys = []

  def predict_fn(train_state, batch):
    seen_keys.append(sorted(train_state))
    return model.apply({"params": train_state["params"]}, batch["image"])
  train_state = {"params": shard_tree(params, mesh),
                 "opt": {"mu": shard_tree(params, mesh), "nu": shard_tree(params, mesh)}}
  d0 = devices[0]
  out["param_bytes_total"] = sum(x.nbytes for x in jax.tree.leaves(params))
  out["param_bytes_dev0"] = bytes_on(train_state["params"], d0)
  put_bytes = []
  real_put = jax.device_put
  # bytes of parameter-shaped arrays put on devices (detector inputs, e.g. score blocks of
  # features, are other shapes and are expected)
  param_shapes = {tuple(x.shape) for x in jax.tree.leaves(params) if np.size(x) > 1}
  jax.device_put = lambda x, *a, **k: (put_bytes.append(
      sum(np.asarray(l).nbytes for l in jax.tree.leaves(x)
          if hasattr(l, "shape") and tuple(l.shape) in param_shapes)),
      real_put(x, *a, **k))[1]
  ev = evaluator(predict_fn, list(mesh.devices.flat))
  calls, times = [], []
  live_before = sum(bytes_on(x, d0) for x in jax.live_arrays())
  try:
    for _ in range(3):
      n = len(compiles)
      t = time.time()
      with mesh, jax.transfer_guard("disallow"):
        calls.append(dict(ev.run(train_state)))
      times.append(time.time() - t)
      out.setdefault("compiles", []).append(len(compiles) - n)
  finally:
    jax.device_put = real_put
  out["put_bytes_max"] = max(put_bytes, default=0)
  gc.collect()   # what only reference cycles still hold is not kept by the evaluator
  out["live_growth_dev0"] = sum(bytes_on(x, d0) for x in jax.live_arrays()) - live_before
  out["opt_seen"] = any("opt" in k for k in seen_keys)
  out["eval"] = calls[-1]
  out["same_across_calls"] = calls[0] == calls[1] == calls[2]
  out["eval_times"] = times
  out["timings"] = ev.last_timings

  # ---- replicated (unsharded) params: bit-equal to main.py's mesh layout
  ev_r = evaluator(lambda ts, b: model.apply({"params": ts["params"]}, b["image"]), list(devices))
  out["eval_replicated"] = dict(ev_r.run({"params": params}))

  # ---- the control: big_vision's classification evaluator, on the same cached batches
  acc_fn = jax.jit(lambda ts, img, lab, m: (
      jnp.sum((jnp.argmax(predict_fn(ts, {"image": img})[0], -1) == lab) * m), jnp.sum(m)))
  sharding = NamedSharding(mesh, P(("data", "fsdp")))
  batches = list(data.batches(sets_kw()["data"], ev.pp, BS)[0]) + list(
      data.batches(sets_kw()["ood"]["digits_6-9"], ev.pp, BS)[0]) + list(
          data.batches(sets_kw()["id_fit"], ev.pp, BS)[0])
  ctimes = []
  for _ in range(3):
    t = time.time()
    with mesh, jax.transfer_guard("disallow"):
      tot = 0
      for b in batches:
        g = [jax.make_array_from_process_local_data(sharding, b[k])
             for k in ("image", "label", "_mask")]
        tot += np.asarray(jax.device_get(acc_fn(train_state, *g))[0])
    ctimes.append(time.time() - t)
  out["control_times"] = ctimes

  # ---- predict_fn conventions
  three = lambda ts, b: (lambda lo, o: (lo, o["pre_logits"], o))(
      *model.apply({"params": ts["params"]}, b["image"]))
  out["eval_three"] = dict(evaluator(three, list(devices)).run(train_state))
  bare = lambda ts, b: model.apply({"params": ts["params"]}, b["image"])[0]
  out["eval_bare"] = dict(evaluator(bare, list(devices)).run(train_state))

  # ---- zero-initialised head (big_vision head_zeroinit) at step 0
  zparams = jax.tree.map(lambda x: x, params)
  zparams["head"] = jax.tree.map(jnp.zeros_like, params["head"])
  # neco (dim 100 > the 64 features) cannot fit: a failing detector beside the working ones
  out["eval_zero_head"] = dict(evaluator(predict_fn, list(devices),
                                         detectors=DETS + ("neco",)).run(
      {"params": shard_tree(zparams, mesh)}))

  # ---- two towers with a zero-shot head
  tt = two_towers.Model(image=dict(patch_size=(2, 2), width=32, depth=1, mlp_dim=64, num_heads=2),
                        text=dict(width=32, depth=1, mlp_dim=64, num_heads=2, vocab_size=50),
                        out_dim=(None, 32), bias_init=-1.0, text_len=8)
  tparams = jax.jit(lambda: tt.init(jax.random.PRNGKey(1), jnp.zeros((1, 8, 8, 1))))()["params"]
  tok = lambda texts: np.asarray([[1 + sum(map(ord, w)) % 49 for w in t.split()][:8]
                                  + [0] * (8 - len(t.split()[:8])) for t in texts], np.int32)
  names = [f"digit {i}" for i in ID]
  temps = ["a photo of {}", "{}"]
  tpredict = lambda ts, b: tt.apply({"params": ts["params"]}, b.get("image"), b.get("labels"))
  ev_t = evaluator(tpredict, list(devices), detectors=("msp", "mds"),
                   zero_shot=dict(tokenizer=tok, class_names=names, templates=temps, batch_size=8))
  with mesh, jax.transfer_guard("disallow"):
    got = [dict(ev_t.run({"params": shard_tree(tparams, mesh)})) for _ in range(2)]
  out["eval_two_tower"] = got[-1]
  # main.py's zero-shot head (fi_jax.models.zero_shot_head) and logits on the same sets
  embed = zero_shot.text_embedder(tt, tparams, tok, batch_size=8, pad="batch")
  w, b = zero_shot.head_arrays(embed, names, temps, scale=float(np.exp(tparams["t"][0])),
                               bias=float(tparams["b"][0]))
  img = lambda spec: data.load_digits_split(spec["split"], spec["classes"],
                                            id_classes=spec.get("id_classes"))
  z = lambda a: np.asarray(jax.jit(lambda x: tt.apply({"params": tparams}, x)[0])(
      a["image"] / 8 - 1))
  from sklearn.metrics import roc_auc_score
  s = lambda a: np.asarray(jax.nn.softmax(z(a) @ w + b).max(-1))
  sid, sood = s(img(sets_kw()["data"])), s(img(sets_kw()["ood"]["digits_6-9"]))
  out["two_tower_ref_auroc"] = roc_auc_score(np.r_[np.ones(len(sid)), np.zeros(len(sood))],
                                             np.r_[sid, sood])
  print("RESULT " + json.dumps(out, default=float))


if __name__ == "__main__":
  main()
