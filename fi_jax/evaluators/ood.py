"""A big_vision-style evaluator: OOD detection metrics of the model being trained.

Compatible by design with big_vision's jit evaluator API (`API = "jit"`,
`Evaluator(predict_fn, *, batch_size, devices, **kw)`, `run(train_state)` yielding
`(name, value)`), without importing big_vision. To use it from big_vision's train.py, add a
one-line module inside big_vision's evaluators package, `big_vision/evaluators/fi_ood.py`:
``from fi_jax.evaluators.ood import *``, and a `config.evals` entry (README, "Inside
big_vision training", has the full block):

    config.evals.ood = dict(type="fi_ood", pred="predict", log_percent=0.1,
                            pp_fn="decode|resize_small(256)|central_crop(224)|value_range(-1, 1)"
                                  "|onehot(1000, key='label', key_result='labels')|keep('image', 'labels')",
                            id_fit=dict(name="imagenet2012", split="train[:10000]"),
                            data=dict(name="imagenet2012", split="validation"),
                            ood=dict(ninco=dict(name="fi_imagenet_1k", split="ood", label_key=None)),
                            detectors=("msp", "energy", "mds"))

With `csid=dict(<name>=<set spec>, ...)` (covariate-shifted ID sets: ImageNet-V2, -R, ...; a
spec may name a `class_subset`) `run()` also yields OpenOOD v1.5's full-spectrum values
(`_full_spectrum`, docs/metrics.md#full-spectrum).

What one evaluator keeps across `run()` calls (train.py calls `run` at every log step):
  * the compiled forward step: one `fi_jax.extract.Forward` per (mesh, input scorers), whose
    jitted step compiles once per input shape;
  * the input pipeline: with `cache="final_data"` (default) the preprocessed batches of every
    set stay in host memory after the first call, like big_vision's `cache_final`;
    "none" / "pipeline" / "raw_data" re-run the tf.data pipeline on every call;
  * nothing else: the detectors are fit on the ID fit set again each call (the model changed).

predict_fn conventions (big_vision's `predict_fn(train_state, batch)`; only
`{"params": train_state["params"]}` is passed, never the optimizer state):
  * `(logits, out)` and `(logits, *_, out)`: features are `out[features_key]`;
  * bare `logits`: no features; detectors that need them are skipped;
  * two-tower `(zimg, ztxt, out)` when `zero_shot=` is given: the zero-shot head is built from
    class names and prompt templates with the model's own text tower and temperature/bias
    (`predict_fn(train_state, {"labels": tokens})`), as `main.py` builds it
    (`fi_jax.models.zero_shot_head`); logits = zimg @ w + b, features = zimg.

Sharding: parameters that are already sharded `jax.Array`s (train.py's train state, under its
mesh) are used where they are; the batch is split over every device of that mesh. Unsharded
parameters are put replicated on `devices`. Detectors and metrics run on the first of `devices`
that belongs to the calling process.

Processes: in big_vision every process calls `run()` and gets the metrics, so every process
holds every set here. The forward step's outputs stay split over the devices and each process
fetches only its own rows; the rows of each set are then all-gathered once (through one device
per process) and every process fits and scores the detectors on the same arrays, yielding the
same metrics. That suits evaluation-sized sets; the benchmark run (`fi_jax.run`) instead
leaves each process only its own rows and scores on process 0.

Layer detectors (mdsens, gram; docs/detectors.md#layer-scores) read the blocks of the
predict_fn's `out` (big_vision's ViT `out["encoder"]["blockNN"]["+mlp"]`, or CNN stages); their
reduced outputs are computed in the same compiled step. When `out` has no blocks, those
detectors fail (below) and the others run.

A detector that raises or gives non-finite scores (e.g. fDBD on a zero-initialised head at
step 0) yields no metrics; it is logged (Python logging, i.e. absl's log under train.py) and
reported as `("failed/<detector>", 1.0)`; a detector skipped for lack of features or head as
`("skipped/<detector>", 1.0)`. Values are numbers only: train.py's metric writer logs
`float(value)`, so a text value would end the training job.
"""
from __future__ import annotations

import collections
import logging
import re
import time
from typing import Callable, Iterator, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fi_jax import detectors as det_lib
from fi_jax import pipeline
from fi_jax.common import distributed
from fi_jax.data import class_subsets, preprocess
from fi_jax.data import loader as data
from fi_jax.data import specs as specs_lib
from fi_jax.extract import forward as extract
from fi_jax.models import zero_shot_head
from fi_jax.models.text import tokenizers

API = "jit"
CACHE_MODES = ("none", "pipeline", "raw_data", "final_data")
# big_vision pp ops that only move labels or keys around: fi_jax's data pipeline reads the
# image and the label itself, so these are accepted and dropped.
LABEL_OPS = ("onehot", "keep", "copy", "drop", "rename", "squeeze_last_dim", "flatten")
# train.py / from_config settings that may reach the evaluator; accepted and not used here.
IGNORED_KW = ("log_steps", "log_epochs", "log_examples", "log_percent", "skip_first", "prefix",
              "pred", "pred_kw", "loss_name", "label_key", "prefetch")
_log = logging.getLogger(__name__)


def bv_pp(pp_fn: str) -> Callable[[dict], dict]:
  """A big_vision pp string as fi_jax's preprocess fn: label-plumbing ops (`LABEL_OPS`) are
  dropped, every other op must be one fi_jax has (else one error listing them)."""
  kept = []
  for part in pp_fn.split("|"):
    m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)", part)
    if not part.strip():
      continue
    name = m.group(1) if m else part.strip()
    if name in LABEL_OPS:
      continue
    if name not in preprocess._OPS:
      raise ValueError(
          f"pp op {name!r} in {pp_fn!r} has no fi_jax counterpart; supported image ops: "
          f"{sorted(preprocess._OPS)}, accepted and ignored label ops: "
          f"{list(LABEL_OPS)}.")
    kept.append(part)
  return preprocess.get_preprocess_fn("|".join(kept))


def _set_spec(spec) -> dict:
  """A big_vision `data=dict(name=..., split=...)` is a TFDS set; fi_jax specs pass through."""
  spec = dict(spec)
  if "source" not in spec and "name" in spec:
    spec["source"] = "tfds"
  return spec


def _mesh_of(params) -> Optional[Mesh]:
  """The mesh the parameters are sharded on (None: not NamedSharding'd jax.Arrays)."""
  for leaf in jax.tree.leaves(params):
    sharding = getattr(leaf, "sharding", None)
    if isinstance(sharding, NamedSharding):
      return sharding.mesh
  return None


class Evaluator:
  """OOD metrics (per detector and OOD set) and the ID accuracy of the current train_state."""

  def __init__(self, predict_fn: Callable, *, batch_size: int, devices: Sequence,
               pp_fn: Optional[str] = None, pp_img: Optional[str] = None,
               id_fit: Optional[dict] = None, id_test: Optional[dict] = None,
               data: Optional[dict] = None,
               ood: Optional[dict] = None,
               detectors: Sequence[str] = ("msp", "maxlogit", "energy"),
               detector_preset: Optional[str] = "ninco", detector_hparams: Optional[dict] = None,
               features_key: str = "pre_logits", head_path: str = "head", tpr: float = 0.95,
               input_std: Sequence[float] = (0.5, 0.5, 0.5),
               metric_keys: Sequence[str] = ("auroc", "fpr95", "fpr95_ood_positive"),
               macro: bool = False, n_bootstrap: int = 0, seed: int = 0,
               cache: str = "final_data", zero_shot: Optional[dict] = None,
               csid: Optional[dict] = None, **kw):
    unknown = sorted(set(kw) - set(IGNORED_KW))
    if unknown:
      raise TypeError(f"Unknown evaluator settings {unknown}; accepted besides the named "
                      f"arguments (and not used by the evaluator): {list(IGNORED_KW)}.")
    if (cache or "none").lower() not in CACHE_MODES:
      raise ValueError(f"cache must be one of {CACHE_MODES}, got {cache!r}.")
    pp = pp_fn if pp_fn is not None else pp_img
    if pp is None:
      raise ValueError("The evaluator needs pp_fn (or pp_img), e.g. "
                       "'decode|resize_small(256)|central_crop(224)|value_range(-1, 1)'.")
    id_test = id_test if id_test is not None else data
    if id_fit is None or id_test is None or not ood:
      raise ValueError("The evaluator needs id_fit, id_test (or big_vision's data=) and ood "
                       "(a dict of OOD set specs), e.g. data=dict(name='imagenet2012', "
                       "split='validation').")
    self.devices = list(devices)
    if batch_size % len(self.devices):
      raise ValueError(f"batch_size {batch_size} does not divide over the {len(self.devices)} "
                       f"devices given; use a multiple of {len(self.devices)}.")
    self.predict_fn = predict_fn
    self.batch_size = batch_size
    self.mesh = Mesh(np.asarray(self.devices), (distributed.DATA_AXIS,))
    self.pp = bv_pp(pp)
    self.sets = specs_lib.set_specs(_set_spec(id_fit), _set_spec(id_test),
                                   {k: _set_spec(v) for k, v in ood.items()},
                                   csid={k: _set_spec(v) for k, v in (csid or {}).items()},
                                   csid_order=tuple(csid or ()))
    for name, spec in (csid or {}).items():   # a bad subset fails here, not after extraction
      if spec.get("class_subset") is not None:
        class_subsets.subset_indices(spec["class_subset"])
    self.detectors = det_lib.build_suite(detectors, detector_preset, detector_hparams)
    self.features_key, self.head_path = features_key, head_path
    self.tpr, self.metric_keys = tpr, tuple(metric_keys)
    self.macro, self.n_bootstrap, self.seed = macro, int(n_bootstrap), seed
    self.input_std = tuple(input_std)
    self.cache = (cache or "none").lower()
    self.zero_shot = dict(zero_shot) if zero_shot is not None else None
    self._tokenizer = self._make_tokenizer() if self.zero_shot is not None else None
    self._batches: dict[str, list] = {}        # set name -> preprocessed host batches
    self._forwards: dict[Mesh, extract.Forward] = {}
    self._has_features = None                  # known after the first trace
    self.last_timings: dict[str, float] = {}   # of the last run(): extract_s, detectors_s
    self._embed_text = jax.jit(lambda p, tokens: self.predict_fn({"params": p},
                                                                  {"labels": tokens}))

  # ------------------------------------------------------------------------- model outputs

  def _make_tokenizer(self) -> Callable:
    tok = self.zero_shot.get("tokenizer")
    if callable(tok):
      return tok
    if isinstance(tok, str):
      return tokenizers.get_tokenizer(self.zero_shot.get("tokenizer_kind", "siglip"), tok,
                                      max_len=int(self.zero_shot.get("max_len", 64)))
    raise ValueError("zero_shot needs a tokenizer: a callable texts -> int tokens [N, L], or a "
                     "SentencePiece model path with tokenizer_kind and max_len.")

  def _predict(self, p, images):
    """(logits, features) of one batch for `extract.Forward`; `p` = {"params", "zs"}."""
    return self._predict_out(p, images)[:2]

  def _predict_out(self, p, images):
    """(logits, features, the model's out dict or None): `_predict` plus what the layer
    detectors read (fi_jax.extract.layer_columns finds the blocks in `out`, or the detectors fail)."""
    out = self.predict_fn({"params": p["params"]}, {"image": images})
    if self.zero_shot is not None:        # two tower: (zimg, ztxt, out)
      zimg = out[0]
      w, b = p["zs"]
      logits = jnp.dot(zimg, w, precision=jax.lax.Precision.HIGHEST) + b
      self._has_features = True
      return logits, zimg, (out[-1] if len(out) > 2 else None)
    if isinstance(out, (tuple, list)):    # (logits, out) or (logits, *_, out)
      logits, extra = out[0], (out[-1] if len(out) > 1 else None)
    else:                                 # bare logits
      logits, extra = out, None
    if isinstance(extra, dict) and self.features_key in extra:
      self._has_features = True
      return logits, extra[self.features_key], extra
    self._has_features = False
    return logits, jnp.zeros((logits.shape[0], 0), logits.dtype), extra

  def _zero_shot_head(self, params, mesh: Mesh) -> tuple[np.ndarray, np.ndarray]:
    """(w [D, C], b [C]) from the current text tower (one compiled text step)."""
    zs = self.zero_shot
    bs = int(zs.get("batch_size", 256))
    repl = NamedSharding(mesh, P())
    scale_bias = {}

    def embed(texts):
      tokens = np.asarray(self._tokenizer(list(texts)))
      tokens = np.pad(tokens, [(0, bs - len(tokens)), (0, 0)])   # one shape: one compile
      _, ztxt, out = self._embed_text(params, jax.device_put(tokens, repl))
      scale_bias["t"] = out["t"]
      scale_bias["b"] = out.get("b", 0.0)
      return np.asarray(jax.device_get(ztxt))[:len(texts)]
    emb = zero_shot_head.class_embeddings(embed, zs.get("class_names"),
                                     zs.get("templates", "clip_paper"), batch_size=bs,
                                     canonicalize_text=zs.get("canonicalize_text", True))
    scale = float(np.asarray(jax.device_get(scale_bias["t"])).reshape(-1)[0])
    bias = float(np.asarray(jax.device_get(scale_bias["b"])).reshape(-1)[0])
    return (scale * emb.T).astype(np.float32), np.full((emb.shape[0],), bias, np.float32)

  def _head(self, params, zs) -> Optional[det_lib.Head]:
    if zs is not None:
      return det_lib.Head(*zs)
    node = params
    for part in self.head_path.split("/"):
      if not hasattr(node, "keys") or part not in node:
        return None
      node = node[part]
    return det_lib.Head(*jax.device_get((node["kernel"], node["bias"])))

  # ------------------------------------------------------------------------- input and forward

  def _set_batches(self, name: str) -> Iterator[dict[str, np.ndarray]]:
    if name in self._batches:
      return iter(self._batches[name])
    it, _, _ = data.batches(self.sets[name], self.pp, self.batch_size,
                            process_index=jax.process_index(),
                            process_count=jax.process_count())
    if self.cache == "final_data":
      self._batches[name] = list(it)
      return iter(self._batches[name])
    return it

  def _forward(self, mesh: Mesh) -> extract.Forward:
    """The run's one compiled step on `mesh` (every input scorer; each set runs its own)."""
    if mesh not in self._forwards:
      reducers = pipeline.layer_reducers(self.detectors)
      self._forwards[mesh] = pipeline.build_forward(
          self.detectors, self._predict, mesh, self.input_std,
          predict_out=self._predict_out if reducers else None)
    return self._forwards[mesh]

  def _extract(self, name: str, fwd: extract.Forward, p, mesh: Mesh) -> dict[str, np.ndarray]:
    """One set through the compiled step, two steps in flight; rows in set order. Each process
    fetches its own rows; with several processes they are then all-gathered, so that every
    process holds the whole set (see "Processes" above)."""
    sharding = NamedSharding(mesh, P(tuple(mesh.axis_names)))
    n_local = len(mesh.local_devices)
    pending, rows = collections.deque(), []
    own = pipeline.input_scorer_names(self.detectors, name)
    active = fwd.active(own)

    def fetch(out):
      rows.append(extract.host_rows(out))
    for local in self._set_batches(name):
      n = len(local["_mask"])
      if n % n_local:
        raise ValueError(f"{name}: the local batch of {n} does not divide over the {n_local} "
                         f"local devices of the mesh {dict(mesh.shape)}; choose batch_size "
                         f"as a multiple of {mesh.size}.")
      with jax.transfer_guard("allow"):   # explicit (counts as implicit with several processes)
        batch = {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local.items()}
      out = fwd.own_columns(fwd.step(p, batch, active), own)
      for v in out.values():
        v.copy_to_host_async()
      pending.append(out)
      if len(pending) >= 2:
        fetch(pending.popleft())
    while pending:
      fetch(pending.popleft())
    if jax.process_count() == 1:
      return extract.in_set_order(rows)
    return extract.in_set_order([distributed.allgather_rows(
        extract.in_set_order(rows, keep_id=True))])

  # ------------------------------------------------------------------------- run

  def run(self, train_state) -> Iterator[tuple[str, float]]:
    """Yields ("<ood set>/<detector>/<metric>", value), ("id_accuracy", value) and
    ("failed/<detector>" | "skipped/<detector>", 1.0); with `csid` sets also the full-spectrum
    values (`_full_spectrum`)."""
    params = train_state["params"]     # never the optimizer state
    mesh = _mesh_of(params)
    if mesh is None:                   # host or single-device params: replicated on `devices`
      mesh = self.mesh
      params = jax.device_put(params, NamedSharding(mesh, P()))
    if self.batch_size % mesh.size:
      raise ValueError(f"batch_size {self.batch_size} does not divide over the {mesh.size} "
                       f"devices of the parameters' mesh {dict(mesh.shape)}.")
    zs = self._zero_shot_head(params, mesh) if self.zero_shot is not None else None
    p = {"params": params,
         "zs": None if zs is None else jax.device_put(zs, NamedSharding(mesh, P()))}
    t0, sets = time.time(), {}
    for name in self.sets:
      t = time.time()
      sets[name] = self._extract(name, self._forward(mesh), p, mesh)
      _log.info("fi_ood: %s extracted in %.2f s", name, time.time() - t)
    head = self._head(params, zs)
    self.last_timings = {"extract_s": time.time() - t0}
    # train.py runs with jax_transfer_guard="disallow"; host arrays move explicitly here.
    with jax.transfer_guard("allow"), jax.default_device(self._local_device()):
      accuracy = pipeline.id_accuracy(sets["id_test"])
      if accuracy is not None:
        yield "id_accuracy", accuracy
      t = time.time()
      yield from self._detector_metrics(sets, head)
      self.last_timings["detectors_s"] = time.time() - t

  def _local_device(self):
    """The first of `devices` that belongs to this process (detectors and metrics run there)."""
    mine = [d for d in self.devices if d.process_index == jax.process_index()]
    return mine[0] if mine else jax.local_devices()[0]

  def _detector_metrics(self, sets, head) -> Iterator[tuple[str, float]]:
    usable, skipped = {}, {}
    for name, det in self.detectors.items():
      if "features" in det.needs and not self._has_features:
        skipped[name] = f"no features (predict_fn gave no out[{self.features_key!r}])"
      elif "head" in det.needs and head is None:
        skipped[name] = f"no classifier head at params[{self.head_path!r}]"
      else:
        usable[name] = det
    jhead = None if head is None else det_lib.Head(jnp.asarray(head.w), jnp.asarray(head.b))
    scores, errors = pipeline.score_sets(usable, sets, jhead, keep_going=True)
    results = {}
    for name, per_set in scores.items():
      if not all(np.isfinite(s).all() for s in per_set.values()):
        errors[name] = "non-finite scores"
        continue
      try:
        rows = pipeline.metric_rows({name: per_set}, sets, tpr=self.tpr, per_group=self.macro,
                                    n_bootstrap=self.n_bootstrap, seed=self.seed)
        results[name] = [(f"{r['ood_set']}/{name}/{k}", float(r[k]))
                         for r in rows for key in self.metric_keys
                         for k in (key, f"{key}_macro", f"{key}_ci_low", f"{key}_ci_high")
                         if k in r]
      except Exception as e:  # one detector must not sink training
        errors[name] = f"{type(e).__name__}: {e}"
    for name in self.detectors:
      for item in results.get(name, []):
        yield item
    if any(specs_lib.is_csid(s) for s in self.sets):
      try:
        yield from self._full_spectrum(
            sets, {n: v for n, v in scores.items() if n not in errors}, usable, jhead)
      except Exception as e:  # must not sink training either
        _log.warning("fi_ood: full-spectrum metrics failed: %s: %s", type(e).__name__, e)
        yield "failed/full_spectrum", 1.0
    for name, why in skipped.items():
      _log.warning("fi_ood: detector %s skipped: %s", name, why)
      yield f"skipped/{name}", 1.0
    for name, why in errors.items():
      _log.warning("fi_ood: detector %s failed: %s", name, why)
      yield f"failed/{name}", 1.0

  def _full_spectrum(self, sets, scores, dets, head) -> Iterator[tuple[str, float]]:
    """OpenOOD v1.5's full-spectrum values when `csid` names covariate-shifted ID sets
    (`pipeline.full_spectrum`, docs/metrics.md#full-spectrum):
    ("fs/<ood set>/<detector>/<metric>", v) with the ID side = the ID test set plus every
    shifted set, ("fs/id_accuracy", v) pooled over them, ("csid/<set>/accuracy", v) per shifted
    set (over its `class_subset` where it names one), and for each class subset of sets that
    restrict their logits (ImageNet-R / -A) ("fs_<subset>/<ood set>/<detector>/<metric>", v)
    and ("fs_<subset>/id_accuracy", v) in that subset's label space."""
    fs = pipeline.full_spectrum(self.sets, sets, scores, dets=dets, head=head, tpr=self.tpr,
                                per_group=self.macro, n_bootstrap=self.n_bootstrap,
                                seed=self.seed)
    blocks = [("fs", fs)] + [(f"fs_{re.sub(r'[^A-Za-z0-9_]+', '_', b['class_subset'])}", b)
                             for b in fs.get("restricted", [])]
    for prefix, block in blocks:
      if block.get("accuracy") is not None:
        yield f"{prefix}/id_accuracy", float(block["accuracy"])
      for r in block["rows"]:
        for key in self.metric_keys:
          for k in (key, f"{key}_macro", f"{key}_ci_low", f"{key}_ci_high"):
            if k in r:
              yield f"{prefix}/{r['ood_set']}/{r['detector']}/{k}", float(r[k])
    for name, acc in fs["csid_accuracy"].items():
      if acc is not None:
        yield f"csid/{name}/accuracy", float(acc)
