"""The model of a benchmark run: the family module named by `config.model_name`, its
parameters (loaded from `config.model_init`, trained on `config.train` for the demo, or taken
from the feature cache's trained-parameter entry), its predictor and classifier head, and the
names a run's report and cache give it (`model_label`, `model_key`, `checkpoint_meta`).
`LazyModel` builds it only when something is not in the cache yet.
"""
from __future__ import annotations

import copy
import datetime
import hashlib
import importlib
import os
import time
from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.common.labels import RANDOM_INIT_SUFFIX, short_label
from fi_jax.common.outputs import Head
from fi_jax.data import loader, preprocess
from fi_jax.extract import cache
from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import _releases as releases
from fi_jax.models._predictor import default_predictor
from fi_jax.models.convert import readers
from fi_jax.run import train

Log = Callable[[str], None]


def log_on_process_0(msg: str) -> None:
  """A run's default log: the message on process 0's stdout."""
  if jax.process_index() == 0:
    print(msg, flush=True)


def to_dict(config) -> dict:
  return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def model_module(name: str):
  """`fi_jax.models.<name>` (big_vision style: models are found by module name), or any
  importable module given by a dotted path (`my_pkg.my_model`) with the same `Model` /
  `load()` (/ `predictor()`) interface."""
  full = name if "." in name else f"fi_jax.models.{name}"
  try:
    return importlib.import_module(full)
  except ModuleNotFoundError as e:
    if e.name and (full == e.name or full.startswith(e.name + ".")):
      where = (f"fi_jax/models/{name}.py" if "." not in name else
               f"module {name} (is its package on PYTHONPATH / installed?)")
      raise ValueError(f"Unknown model_name {name!r}: no {where}.") from None
    raise

def build_model(config, log: Log, params_cache: Optional[str] = None,
                on_train_start: Optional[Callable] = None):
  """Returns (predict_fn, params, head, model_meta).

  With `params_cache` (a cache entry path), trained parameters are saved there and a later
  build with the same model key loads them instead of training again. When it trains,
  `on_train_start(predict_fn, params, head)` is called first, with zeros of the parameters'
  shapes (what depends only on shapes compiles meanwhile: fi_jax.run.compile_ahead); if it returns a
  function, that is called once the training step is traced (`train.train_classifier`'s
  `on_traced`). With the default predictor the returned predict_fn is that same function
  object.
  """
  t0 = time.time()
  mod = model_module(config.model_name)
  model_cfg = to_dict(config.model)
  model = mod.Model(**model_cfg)
  init_shape = tuple(config.get("init_shape", (1, 224, 224, 3)))
  init = lambda: model.init(jax.random.PRNGKey(config.seed),
                            jnp.zeros(init_shape, jnp.float32))["params"]
  load_kw = to_dict(config.get("model_load", {}))
  factory = getattr(mod, "predictor", None) or default_predictor
  if text_banks(config) and config.get("zero_shot") is not None:
    config = copy.deepcopy(config)            # the two-tower predictor embeds the word lists
    with config.unlocked():
      config.zero_shot.text_banks = text_banks(config)
  trained = cache.load(params_cache, log=log) if config.get("train") and params_cache else None
  early = traced = None
  if config.get("train") and trained is None and on_train_start is not None:
    # zeros of the parameters' shapes: what compiles ahead depends on nothing else
    zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), jax.eval_shape(init))
    early = factory(model, zeros, config)
    traced = on_train_start(early[0], zeros, early[1])
  if config.get("model_init") and not config.get("train") and not load_kw.get("dont_load"):
    params = jax.eval_shape(init)   # shapes only: every value comes from the checkpoint
  else:
    params = jax.jit(init, compiler_options=_init_compiler_options())()
  meta: dict[str, Any] = {"model_name": config.model_name, "model": model_cfg}
  if config.get("model_init"):
    t = time.time()
    params = mod.load(params, config.model_init, model_cfg, **load_kw)
    meta["model_init"] = config.model_init
    if config.model_name == "torchax_classifier":   # its equivalence check against torch
      meta["torchax_admission"] = mod.admission(config.model_init, model_cfg)
    log(f"Loaded {config.model_init} ({time.time() - t:.1f} s).")
  if trained is not None:
    params = jax.tree.map(jnp.asarray, checkpoints.recover_tree(trained))
    meta["trained_params_from_cache"] = params_cache
    log(f"Trained parameters from cache {params_cache} (no training).")
  elif config.get("train"):
    tcfg = to_dict(config.train)
    arrays = loader.train_arrays(to_dict(config.id_fit))
    images = preprocess_arrays(config.pp, arrays["image"])
    t = time.time()
    log(f"Training {config.model_name} on {len(images)} ID images ({tcfg['steps']} steps).")
    params = train.train_classifier(model, params, images, arrays["label"], seed=config.seed,
                                    log=log, on_traced=traced if callable(traced) else None,
                                    **tcfg)
    meta["train_seconds"] = round(time.time() - t, 2)
    if params_cache and jax.process_index() == 0:
      cache.save(params_cache, {k: np.asarray(v) for k, v in checkpoints.flatten(params).items()},
                 {"model_name": config.model_name, "train": tcfg})
  predict, head = factory(model, params, config)
  if early is not None and factory is default_predictor:
    predict = early[0]   # it takes the params as an argument: what compiled ahead is reused
  meta["build_seconds"] = round(time.time() - t0, 2)
  return predict, params, head, meta

def _init_compiler_options() -> Optional[dict[str, Any]]:
  """XLA options for the model's initialisation, which runs once: on CPU, LLVM at -O1 (about
  half the compile time of the default level; the demo's initial values are bit-identical),
  so that the training starts earlier. Elsewhere the defaults."""
  return {"xla_backend_optimization_level": 1} if jax.default_backend() == "cpu" else None

def preprocess_arrays(pp: str, images: np.ndarray) -> np.ndarray:
  """Applies a pp string to in-memory images (the trainer sees exactly what extraction sees)."""
  tf = preprocess.tf_module()   # heavy: only the demo trains
  fn = preprocess.get_preprocess_fn(pp)
  ds = tf.data.Dataset.from_tensor_slices({"image": images}).map(fn).batch(4096)
  return np.concatenate([b["image"] for b in ds.as_numpy_iterator()]).astype(np.float32)

def model_key(config) -> str:
  """What determines the model's outputs: the cache key of everything extracted with it."""
  return cache.key_of(config.model_name, to_dict(config.model), config.get("model_init", ""),
                      to_dict(config.get("model_load", {})), to_dict(config.get("train") or {}),
                      config.pp, config.seed, list(config.get("init_shape", ())))


def _checkpoint_files(config) -> list[str]:
  """The local files the model loads: model_init (a release name resolved as by the loaders,
  a sub-key ':img' dropped) and the DINOv2 head (model_load.head)."""
  init = config.get("model_init") or ""
  names = {**releases.VANITY_NAMES, **releases.SIGLIP_RELEASES}
  inits = list(init.values()) if isinstance(init, Mapping) else [init] if init else []
  files = [readers.split_subkey(releases.resolve_vanity(str(f), names)[0])[0] for f in inits]
  head = config.get("model_load", {}).get("head")
  return files + ([head] if head else [])

def model_label(config) -> str:
  """The report's model name: `config.model_label` if set (the bundled configs set the
  default of fi_jax/common/labels.py: `vit-B16`, `clip-openai-B16`, ...), else the same rule
  on the model family and variant (a release name as is), with `-random-init` for a model
  without a checkpoint under random_init. The checkpoint file is in `checkpoint_meta`."""
  if config.get("model_label"):
    return config.model_label
  m = to_dict(config.model)
  variant = m.get("variant") or (m.get("image") or {}).get("variant")
  init = config.get("model_init") or ""
  if isinstance(init, str) and init.partition(":")[0] in {**releases.VANITY_NAMES,
                                                         **releases.SIGLIP_RELEASES}:
    return short_label(init.partition(":")[0])
  label = short_label(config.model_name, variant if isinstance(variant, str) else "")
  return label + (RANDOM_INIT_SUFFIX if not init and config.get("random_init") else "")

def checkpoint_meta(config) -> list[dict[str, Any]]:
  """Path, size, mtime and sha256 of the first MiB of each checkpoint file loaded (results
  meta: which file a report came from, without hashing gigabytes)."""
  out = []
  for f in _checkpoint_files(config):
    if not os.path.isfile(f):
      out.append({"path": f, "exists": False})
      continue
    st = os.stat(f)
    with open(f, "rb") as fh:
      head = hashlib.sha256(fh.read(1 << 20)).hexdigest()
    out.append({"path": os.path.abspath(f), "bytes": st.st_size,
                "mtime": datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc)
                .isoformat(timespec="seconds"), "sha256_first_mib": head})
  return out

class LazyModel:
  """Builds (loads or trains) the model only when something is not in the cache yet."""

  def __init__(self, config, log: Log, workdir: Optional[str] = None):
    self.config, self.log, self._built = config, log, None
    self.params_cache = (os.path.join(workdir, "cache", model_key(config), "params")
                         if workdir and config.get("cache", True) else None)
    self.on_train_start: Optional[Callable] = None   # see build_model

  def get(self):
    """(predict_fn, params, head, model_meta)."""
    if self._built is None:
      self._built = build_model(self.config, self.log, self.params_cache, self.on_train_start)
    return self._built

def text_banks(config) -> tuple[str, ...]:
  """The two-tower text banks (`Head.texts`) the configured detectors read (`text_bank`)."""
  from fi_jax import detectors
  banks = {detectors.REGISTRY[n].text_bank for n in (config.get("detectors", ()) or ())
           if n in detectors.REGISTRY}
  return tuple(sorted(b for b in banks if b))


def _bank_key(config) -> str:
  """What a text bank depends on besides the model: the word list and the class names."""
  zs = to_dict(config.get("zero_shot", {}) or {})
  return cache.key_of(zs.get("word_list"), zs.get("word_limit"), zs.get("class_names"))


def cached_head(config, model: LazyModel, workdir: str, log: Log = log_on_process_0):
  """The classifier head (cached beside the features, so a rerun needs no model at all), with
  the text banks the detectors read (`text_banks`, one cache entry each)."""
  root = os.path.join(workdir, "cache", model_key(config))
  path, use_cache = os.path.join(root, "head"), config.get("cache", True)
  bank_paths = {b: os.path.join(root, f"text_bank-{b}-{_bank_key(config)}")
                for b in text_banks(config)}
  arrays = cache.load(path, log=log) if use_cache else None
  banks = {b: cache.load(p, log=log) if use_cache else None for b, p in bank_paths.items()}
  if arrays is None or any(v is None for v in banks.values()):
    head = model.get()[2]
    arrays = {"w": np.asarray(head.w), "b": np.asarray(head.b)}
    texts = {k: np.asarray(v) for k, v in (head.texts or {}).items()}
    banks = {b: {k: v for k, v in texts.items() if k.startswith(f"{b}/")} for b in bank_paths}
    if jax.process_index() == 0 and use_cache:
      cache.save(path, arrays, {"model_name": config.model_name})
      for b, p in bank_paths.items():
        if banks[b]:
          cache.save(p, banks[b], {"model_name": config.model_name, "text_bank": b})
  texts = {k: v for bank in banks.values() for k, v in (bank or {}).items()}
  return Head(jnp.asarray(arrays["w"]), jnp.asarray(arrays["b"]), texts or None)
