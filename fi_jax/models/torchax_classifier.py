"""Any timm / torchvision ImageNet-1k classifier without a native Flax port, run through torchax.

torchax (PyPI `torchax`, Apache-2.0) runs a PyTorch module as a JAX function of (weights,
inputs). This family wraps that function in fi_jax's model interface, so a name such as
"timm/mobilevit_xs.cvnets_in1k" goes through the same `zoo.from_pretrained` / config route,
jit and batch sharding as the native ports (`zoo.resolve(name)["route"]` says which route a
name takes; native ports keep priority):

  model = Model(variant="timm/ghostnet_100.in1k")
  params = load(jax.eval_shape(model.init, rng, images), ckpt, {...})
  logits, out = model.apply({"params": params}, images_nhwc)   # out["pre_logits"]: [B, D]

What a model computes (`_LogitsAndPreLogits`): timm models give `forward_head(f)` as logits
and `forward_head(f, pre_logits=True)` as pre-logits (f = `forward_features(x)`), as timm
defines them; torchvision models the input of their last `nn.Linear` with `num_classes`
outputs as pre-logits and that layer's output as logits. `params["head"]` is the affine map
from pre-logits to logits (the classifier itself, or, for a classifier that is not one
`nn.Linear`, the affine map read off it on the identity matrix and checked on a probe batch),
for the head-based detectors.

Admission: torchax can be silently wrong (torchvision's `swin_v2_t` once gave 22% relative
error through an ignored in-place `zero_()`), so `load` admits a checkpoint only after the
torchax function equals torch eager on a seeded probe batch of 2 images at the model's input
size, logits and pre-logits within `TOLERANCE` (max |difference| / max |torch|), and the head
reproduces the logits; the record (`admission(...)`, also in results.json meta
`torchax_admission`) is cached per checkpoint (its sha256).

Hosts without torch: what needs torch is cached under `cache_dir()` (environment variable
`FI_JAX_TORCHAX_CACHE`, default ~/.cache/fi_jax/torchax), one folder per name:
  info.json                      the resolved entry (preprocessing, url) and the weights' keys
                                 and shapes (their checkpoint keys too)
  export-<B>x<H>x<W>-<dtype>.bin  `jax.export` of the forward for one batch shape (for CPU,
                                 CUDA and TPU), made the first time that shape is traced
  <sha256[:16]>/admission.json   the equivalence check of one checkpoint file
Every forward, with or without torch, runs the stored export (so both hosts compute the same
program). A host without torch reads the checkpoint with fi_jax's own readers, and needs the
name's info.json, its checkpoint's admission and an export for each batch shape it runs: run
the same config once on a host with torch (same batch size), then copy the folder.
"""
from __future__ import annotations

import collections
import copy
import datetime
import functools
import hashlib
import io
import json
import os
import re
import threading
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.data import preprocess
from fi_jax.models import _torchax_adapter as adapter
from fi_jax.models._checkpoints import CheckpointError
from fi_jax.models.convert import readers

TOLERANCE = 1e-4
PROBE_BATCH = 2
EXPORT_PLATFORMS = ("cpu", "cuda", "tpu")
_INTERP = {"bilinear": "bilinear", "bicubic": "bicubic", "nearest": "nearest"}


def cache_dir() -> str:
  """Where the torch-dependent artefacts live (see the module docstring)."""
  return os.path.expanduser(os.environ.get("FI_JAX_TORCHAX_CACHE", "~/.cache/fi_jax/torchax"))


def _folder(name: str, root: Optional[str] = None) -> str:
  return os.path.join(root or cache_dir(), re.sub(r"[^\w.-]", "_", name))


def _write_atomic(path: str, data: bytes) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)


def _read_json(path: str) -> Optional[dict]:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _split(name: str) -> tuple[str, str, str]:
  source, slash, rest = name.partition("/")
  if not slash or source not in ("timm", "torchvision") or not rest:
    raise ValueError(f"Checkpoint name {name!r} must be 'timm/<model>[.<tag>]' or "
                     f"'torchvision/<model>[.<weights>]'.")
  model, _, tag = rest.partition(".")
  return source, model, tag


# ----------------------------------------------------------------------------- resolution

def _torch_side():
  """(torch, timm, torchvision), imported once through the adapter (shim, torchax)."""
  adapter.environment()
  import timm
  import torch
  import torchvision
  return torch, timm, torchvision


def resolve(name: str) -> dict[str, Any]:
  """The zoo entry of a timm / torchvision ImageNet-1k classifier name (a tag-less name means
  the library's default weights): variant (the full name), source, num_classes, input_size,
  pp, url, family ("torchax_classifier"), route ("torchax"). Read from the library's
  pretrained config when torch is installed (and cached in info.json), else from the cache.
  Raises ValueError if the name is not a 1000-class classifier of timm / torchvision."""
  source, model, tag = _split(name)
  try:
    torch, timm, torchvision = _torch_side()
  except ImportError as e:
    for candidate in _cached_names(name):
      info = _read_json(os.path.join(_folder(candidate), "info.json"))
      if info:
        return info["entry"]
    raise ImportError(f"{name!r} has no native Flax port; it runs through torchax, which needs "
                      f"torch ({e}), or a cache made on a host with torch in {cache_dir()}.")
  del torch
  if source == "timm":
    entry = _timm_entry(timm, model, tag)
  else:
    entry = _torchvision_entry(torchvision, model, tag)
  folder = _folder(entry["variant"])
  info = _read_json(os.path.join(folder, "info.json")) or {}
  if info.get("entry") != entry:
    info["entry"] = entry
    _write_atomic(os.path.join(folder, "info.json"), json.dumps(info, indent=1).encode())
  return entry


def _cached_names(name: str) -> list[str]:
  """Full names in the cache that `name` may mean (itself; a tag-less name: any tag)."""
  if not os.path.isdir(cache_dir()):
    return []
  folder = os.path.basename(_folder(name))
  found = sorted(d for d in os.listdir(cache_dir()) if d == folder or (
      "." not in name.split("/", 1)[1] and d.startswith(folder + ".")))
  out = []
  for d in found:
    info = _read_json(os.path.join(cache_dir(), d, "info.json"))
    if info and "entry" in info:
      out.append(info["entry"]["variant"])
  return out


def _timm_entry(timm, model: str, tag: str) -> dict[str, Any]:
  full = f"{model}.{tag}" if tag else model
  if not timm.is_model(model):
    raise ValueError(f"timm has no model {model!r}.")
  try:
    cfg = timm.models.get_pretrained_cfg(full)
  except RuntimeError:   # timm: "Invalid pretrained tag"
    cfg = None
  if cfg is None:
    raise ValueError(f"timm has no pretrained weights {full!r}; "
                     f"tags: {timm.list_pretrained(model + '.*')[:12]}")
  cfg = cfg.to_dict()
  tag = cfg.get("tag") or tag
  if cfg.get("num_classes") != 1000:
    raise ValueError(f"timm/{model}.{tag} has {cfg.get('num_classes')} classes, not the 1000 "
                     f"ImageNet-1k classes fi_jax evaluates.")
  _, h, w = cfg["input_size"]
  if h != w:
    raise ValueError(f"timm/{model}.{tag} takes {h}x{w} inputs; the torchax route supports "
                     f"square inputs only.")
  interp = _INTERP.get(cfg.get("interpolation", "bicubic"), "bicubic")
  pp = preprocess.timm_pp(h, float(cfg.get("crop_pct", 0.875)), interp,
                          tuple(cfg["mean"]), tuple(cfg["std"]),
                          crop_mode=cfg.get("crop_mode", "center"))
  hub = cfg.get("hf_hub_id") or f"timm/{model}.{tag}"
  return dict(variant=f"timm/{model}.{tag}", source="timm", num_classes=1000, input_size=h,
              pp=pp, url=f"https://huggingface.co/{hub}/resolve/main/model.safetensors",
              family="torchax_classifier", route="torchax")


def _torchvision_entry(torchvision, model: str, tag: str) -> dict[str, Any]:
  try:
    enum = torchvision.models.get_model_weights(model)
  except ValueError:
    raise ValueError(f"torchvision has no classifier {model!r}.") from None
  tag = tag or "DEFAULT"
  try:
    weights = enum[tag]
  except KeyError:
    raise ValueError(f"torchvision/{model} has no weights {tag!r}; it has "
                     f"{[w.name for w in enum]}.") from None
  if len(weights.meta.get("categories") or ()) != 1000:
    raise ValueError(f"torchvision/{model}.{weights.name} is not a 1000-class ImageNet "
                     f"classifier.")
  t = weights.transforms()
  resize, crop = int(t.resize_size[0]), int(t.crop_size[0])
  pp = preprocess.torchvision_pp(resize, crop, t.interpolation.value, tuple(t.mean),
                                 tuple(t.std))
  return dict(variant=f"torchvision/{model}.{weights.name}", source="torchvision",
              num_classes=1000, input_size=crop, pp=pp, url=weights.url,
              family="torchax_classifier", route="torchax")


# ----------------------------------------------------------------------------- torch side

def _torch_module(name: str):
  """The library's module of `name` with random weights, in eval mode."""
  torch, timm, torchvision = _torch_side()
  source, model, tag = _split(name)
  torch.manual_seed(0)
  if source == "timm":
    m = timm.create_model(f"{model}.{tag}", pretrained=False)
  else:
    m = torchvision.models.get_model(model, weights=None)
  return m.eval()


def _wrapper(m, source: str):
  """A module returning (logits, pre-logits) of `m` (see the module docstring); its state keys
  and the checkpoint keys they come from."""
  torch, _, _ = _torch_side()
  names = {}
  for k, v in list(m.named_parameters()) + list(m.named_buffers()):
    names.setdefault(id(v), k)

  class LogitsAndPreLogits(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.model = m
      if source == "torchvision":
        path, linear = _last_linear(torch, m)
        self.classifier = linear
        self.model = copy.copy(m)   # shallow: the classifier slot of a copy becomes Identity
        _replace(self.model, path, torch.nn.Identity())

    def forward(self, x):
      if source == "timm":
        f = self.model.forward_features(x)
        return self.model.forward_head(f), self.model.forward_head(f, pre_logits=True)
      pre = self.model(x)
      return self.classifier(pre), pre

  w = LogitsAndPreLogits().eval()
  keys = {k: names[id(v)] for k, v in list(w.named_parameters()) + list(w.named_buffers())
          if id(v) in names}
  return w, keys


def _last_linear(torch, m):
  found = [(k, v) for k, v in m.named_modules() if isinstance(v, torch.nn.Linear)
           and v.out_features == 1000]
  if not found:
    raise ValueError(f"{type(m).__name__} has no nn.Linear with 1000 outputs to read "
                     f"pre-logits from.")
  return found[-1]


def _replace(root, path: str, new) -> None:
  """Sets the submodule at dotted `path` of `root` (a shallow copy of a model) to `new`,
  copying each container on the way, so the original model is unchanged."""
  *parents, last = path.split(".")
  root._modules = dict(root._modules)
  node = root
  for p in parents:
    child = copy.copy(node._modules[p])
    child._modules = dict(child._modules)
    node._modules[p] = child
    node = child
  node._modules[last] = new


def _load_into(m, sd: Mapping[str, np.ndarray], name: str, ckpt: str, url: str) -> None:
  """`m.load_state_dict(sd)`, with one error naming the file's keys and shapes."""
  torch, _, _ = _torch_side()
  want = {k: tuple(v.shape) for k, v in m.state_dict().items()}
  missing = [k for k in want if k not in sd]
  unexpected = [k for k in sd if k not in want]
  shapes = [f"{k}: file {tuple(sd[k].shape)} vs model {want[k]}" for k in want
            if k in sd and tuple(sd[k].shape) != want[k]]
  if missing or unexpected or shapes:
    parts = ([f"missing in the file: {missing[:8]}"] if missing else []) + (
        [f"not in the model: {unexpected[:8]}"] if unexpected else []) + shapes[:8]
    raise CheckpointError(f"{ckpt!r} does not fit {name}: {'; '.join(parts)}. The weights "
                          f"of {name} are at {url}.")
  tensors = collections.OrderedDict((k, torch.from_numpy(np.array(v))) for k, v in sd.items())
  # the per-module format versions a torch.save'd state dict carries (fi_jax's reader reads
  # tensors only): those of the model itself, whose keys the file matched (MNASNet needs one)
  tensors._metadata = m.state_dict()._metadata
  m.load_state_dict(tensors, strict=True)


def _head_from(torch, wrapper, source: str, width: int) -> tuple[np.ndarray, np.ndarray]:
  """(kernel [D, C], bias [C]) of the affine map pre-logits -> logits."""
  clf = wrapper.classifier if source == "torchvision" else wrapper.model.get_classifier()
  if isinstance(clf, torch.nn.Linear):
    return (clf.weight.detach().numpy().T.astype(np.float32),
            (clf.bias.detach().numpy() if clf.bias is not None
             else np.zeros(clf.out_features)).astype(np.float32))
  with torch.no_grad():
    eye = torch.cat([torch.zeros(1, width), torch.eye(width)])
    try:
      out = clf(eye)
    except RuntimeError:   # a 1x1 convolution classifier
      out = clf(eye[:, :, None, None])
    out = out.reshape(width + 1, -1).numpy().astype(np.float64)
  return (out[1:] - out[:1]).astype(np.float32), out[0].astype(np.float32)


# ----------------------------------------------------------------------------- model

def _rel(got, want) -> float:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


class Model:
  """A torchax-run classifier with the interface of fi_jax's Flax models (`init`, `apply`).

  `variant` is the full name ("timm/<model>.<tag>" / "torchvision/<model>.<weights>"),
  `dtype` "float32" or "bfloat16" (weights and images cast before the forward),
  `input_size` the resolution it is evaluated at when not the weights' own (configs' `res`):
  the admission check probes at that size."""

  def __init__(self, num_classes: int = 1000, variant: str = "", dtype: str = "float32",
               input_size: int = 0):
    if num_classes != 1000:
      raise ValueError("The torchax route runs the published 1000-class classifiers.")
    _split(variant)
    self.num_classes, self.variant, self.dtype = num_classes, variant, jnp.dtype(dtype)
    self.input_size = int(input_size)   # 0: the weights' own; the admission probes at it
    self._torch = None   # (wrapper, jax function) once built

  def _built(self):
    if self._torch is None:
      torchax, env = adapter.environment()
      wrapper, keys = _wrapper(_torch_module(self.variant), _split(self.variant)[0])
      _, fn = torchax.extract_jax(wrapper, env)
      self._torch = wrapper, keys, fn
      self._record_keys(wrapper, keys)
    return self._torch

  def _record_keys(self, wrapper, keys) -> None:
    path = os.path.join(_folder(self.variant), "info.json")
    info = _read_json(path) or {}
    weights = {k: [list(v.shape), str(v.dtype).replace("torch.", "")]
               for k, v in list(wrapper.named_parameters()) + list(wrapper.named_buffers())}
    if info.get("weights") != weights or info.get("keys") != keys:
      info.update(weights=weights, keys=keys)
      _write_atomic(path, json.dumps(info, indent=1).encode())

  def info(self) -> dict:
    """info.json of the variant (weights' keys and shapes), made with torch if missing."""
    info = _read_json(os.path.join(_folder(self.variant), "info.json")) or {}
    if "weights" not in info:
      self._built()
      info = _read_json(os.path.join(_folder(self.variant), "info.json"))
    return info

  def init(self, rng, images) -> dict:
    """{"params": {"torch": {key: array}, "head": {"kernel", "bias"}}}: the library's random
    initialisation with torch, zeros of the recorded shapes without it (eval_shape needs
    only the shapes)."""
    del rng, images
    info = self.info()
    torch_params = {k: jnp.zeros(s, jnp.dtype(d)) for k, (s, d) in info["weights"].items()}
    width = int(info["pre_logits_width"]) if "pre_logits_width" in info else None
    if self._torch is not None or width is None:
      wrapper, _, _ = self._built()
      torch_params = {k: jnp.asarray(v.detach().numpy()) for k, v in
                      list(wrapper.named_parameters()) + list(wrapper.named_buffers())}
      width = self._pre_logits_width(wrapper)
    head = {"kernel": jnp.zeros((width, self.num_classes), jnp.float32),
            "bias": jnp.zeros((self.num_classes,), jnp.float32)}
    return {"params": {"torch": torch_params, "head": head}}

  def _pre_logits_width(self, wrapper) -> int:
    torch, _, _ = _torch_side()
    size = self.input_size or resolve(self.variant)["input_size"]
    with torch.no_grad():
      _, pre = wrapper(torch.zeros(1, 3, size, size))
    path = os.path.join(_folder(self.variant), "info.json")
    info = _read_json(path)
    info["pre_logits_width"] = int(pre.shape[-1])
    _write_atomic(path, json.dumps(info, indent=1).encode())
    return int(pre.shape[-1])

  def _export_path(self, shape: tuple, dtype) -> str:
    b, h, w, _ = shape
    return os.path.join(_folder(self.variant), f"export-{b}x{h}x{w}-{jnp.dtype(dtype).name}.bin")

  def exported(self, weights: Mapping[str, Any], shape: tuple, dtype=jnp.float32):
    """The stored `jax.export` of the forward for one batch shape; made (torch needed) and
    stored the first time."""
    path = self._export_path(shape, dtype)
    if os.path.exists(path):
      with open(path, "rb") as f:
        return jax.export.deserialize(bytearray(f.read()))
    try:
      _, _, fn = self._built()
    except ImportError:
      raise RuntimeError(
          f"{self.variant}: no stored forward for batch shape {tuple(shape)} ({path}); run the "
          f"same config (same batch size) once on a host with torch, then copy "
          f"{_folder(self.variant)} here.") from None

    def forward(w, images):
      logits, pre = fn(w, (jnp.transpose(images, (0, 3, 1, 2)),))
      return logits, pre
    spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)
    args = (jax.tree.map(spec, dict(weights)), jax.ShapeDtypeStruct(tuple(shape), dtype))
    try:
      try:
        exp = jax.export.export(jax.jit(forward), platforms=EXPORT_PLATFORMS)(*args)
      except (NotImplementedError, ValueError):   # an op without a lowering on some platform
        exp = jax.export.export(jax.jit(forward))(*args)
    except Exception as e:   # noqa: BLE001 - torchax raises its own types; one line out
      op = adapter.op_name(e)
      what = f"operator {op} has no lowering in torchax {adapter.TORCHAX_VERSION}" if op else (
          f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
      raise RuntimeError(f"torchax cannot run {self.variant}: {what}.") from None
    _write_atomic(path, bytes(exp.serialize()))
    return exp

  def apply(self, variables: Mapping[str, Any], images, **kwargs):
    """(logits [B, C], {"pre_logits": [B, D]}) of NHWC images, through the stored export."""
    del kwargs
    p = variables["params"]["torch"]
    if self.dtype != jnp.float32:
      p = jax.tree.map(lambda a: a.astype(self.dtype) if jnp.issubdtype(a.dtype, jnp.floating)
                       else a, p)
    images = jnp.asarray(images, self.dtype)
    exp = self.exported(p, images.shape, images.dtype)
    logits, pre = exp.call(p, images)
    return logits, {"pre_logits": pre}


# ----------------------------------------------------------------------------- loading

def _sha256(path: str) -> str:
  """The file's sha256, read once per (path, size, modification time)."""
  st = os.stat(path)
  return _sha256_of(os.path.abspath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
  del size, mtime_ns   # the cache key: a changed file is hashed again
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      h.update(block)
  return h.hexdigest()


def _admission_path(variant: str, ckpt: str, size: int) -> str:
  return os.path.join(_folder(variant), _sha256(ckpt)[:16], f"admission-{size}px.json")


def _probe_size(model_kw: Mapping[str, Any]) -> int:
  return int(model_kw.get("input_size") or resolve(model_kw["variant"])["input_size"])


def admission(ckpt: str, model_kw: Mapping[str, Any]) -> Optional[dict]:
  """The cached equivalence record of checkpoint `ckpt` at the model's input size (None if
  not checked yet)."""
  return _read_json(_admission_path(model_kw["variant"], ckpt, _probe_size(model_kw)))


def load(init_params: Mapping[str, Any], ckpt: str, model_kw: Mapping[str, Any],
         **unused) -> dict:
  """The params of `ckpt` (a timm .safetensors / torchvision .pth state dict, read by fi_jax's
  readers: no pickle beyond the allow-listed reader), after the admission check (see the
  module docstring; done once per file, with torch)."""
  del unused
  model = Model(**{k: v for k, v in model_kw.items()
                   if k in ("num_classes", "variant", "dtype", "input_size")})
  variant = model.variant
  entry = resolve(variant)
  hint = f"The weights of {variant} are at {entry['url']}."
  sd = readers.read_state_dict(ckpt, hint)
  record = admission(ckpt, model_kw)
  if record is None:
    record = _admit(model, sd, ckpt, entry)
  if not record["admitted"]:
    raise CheckpointError(
        f"torchax computes {variant} differently from torch eager (relative error: logits "
        f"{record['logits_rel_err']:.2g}, pre-logits {record['pre_logits_rel_err']:.2g}, head "
        f"{record['head_rel_err']:.2g}; tolerance {TOLERANCE}): not admitted. Use a native "
        f"port or torch for this model.")
  info = model.info()
  keys = info["keys"]
  shapes = {k: tuple(s.shape) for k, s in init_params["torch"].items()}
  absent = [keys[k] for k in shapes if keys[k] not in sd]
  if absent:
    raise CheckpointError(f"{ckpt!r} does not fit {variant}: missing in the file: "
                          f"{absent[:8]}. {hint}")
  torch_params = {}
  for k, shape in shapes.items():
    v = np.asarray(sd[keys[k]])
    if tuple(v.shape) != shape:
      raise CheckpointError(f"{ckpt!r} does not fit {variant}: {keys[k]}: file "
                            f"{tuple(v.shape)} vs model {shape}. {hint}")
    torch_params[k] = jnp.asarray(v.astype(init_params["torch"][k].dtype))
  return {"torch": torch_params, "head": _head_params(ckpt, variant)}


def _head_path(variant: str, ckpt: str) -> str:
  return os.path.join(_folder(variant), _sha256(ckpt)[:16], "head.npz")


def _head_params(ckpt: str, variant: str) -> dict:
  with np.load(_head_path(variant, ckpt), allow_pickle=False) as z:
    return {"kernel": jnp.asarray(z["kernel"]), "bias": jnp.asarray(z["bias"])}


def _admit(model: Model, sd: Mapping[str, np.ndarray], ckpt: str, entry: dict) -> dict:
  """Loads `sd` into the torch module, compares torch eager with the torchax export on the
  probe batch, stores the record and the head; returns the record."""
  torch, _, _ = _torch_side()
  torchax, _ = adapter.environment()
  source = _split(model.variant)[0]
  original = _torch_module(model.variant)
  _load_into(original, sd, model.variant, ckpt, entry["url"])
  wrapper, keys = _wrapper(original, source)
  _, fn = torchax.extract_jax(wrapper, adapter.environment()[1])
  model._torch = wrapper, keys, fn
  model._record_keys(wrapper, keys)
  size = model.input_size or entry["input_size"]
  x = np.random.default_rng(0).standard_normal((PROBE_BATCH, size, size, 3)).astype(np.float32)
  with torch.no_grad():
    xt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
    want_logits = original(xt).numpy()
    wrapped_logits, want_pre = (t.numpy() for t in wrapper(xt))
  kernel, bias = _head_from(torch, wrapper, source, want_pre.shape[-1])
  weights = {k: jnp.asarray(v.detach().numpy()) for k, v in
             list(wrapper.named_parameters()) + list(wrapper.named_buffers())}
  logits, out = jax.jit(model.apply)({"params": {"torch": weights}}, x)
  record = dict(
      name=model.variant, checkpoint=os.path.abspath(ckpt), checkpoint_sha256=_sha256(ckpt),
      probe=[PROBE_BATCH, size, size, 3], tolerance=TOLERANCE,
      wrapper_rel_err=_rel(wrapped_logits, want_logits),
      logits_rel_err=_rel(logits, want_logits), pre_logits_rel_err=_rel(out["pre_logits"], want_pre),
      head_rel_err=_rel(want_pre.astype(np.float64) @ kernel + bias, want_logits),
      torch=torch.__version__, torchax=adapter.TORCHAX_VERSION, jax=jax.__version__,
      date=datetime.date.today().isoformat())
  record["admitted"] = all(record[k] <= TOLERANCE for k in
                           ("wrapper_rel_err", "logits_rel_err", "pre_logits_rel_err",
                            "head_rel_err"))
  path = _admission_path(model.variant, ckpt, size)
  buf = io.BytesIO()
  np.savez(buf, kernel=kernel, bias=bias)
  _write_atomic(_head_path(model.variant, ckpt), buf.getvalue())
  _write_atomic(path, json.dumps(record, indent=1).encode())
  return record

