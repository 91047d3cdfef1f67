"""Image preprocessing as tf.data ops, written as big_vision-style pp strings.

A pp string chains ops with '|', e.g. ``"decode|resize_small(256)|central_crop(224)|value_range(-1, 1)"``.
Each op maps an example dict to an example dict and acts on ``key`` (default ``"image"``).
The op semantics follow big_vision's `pp/ops_image.py` / `ops_general.py` so that a config
copied from big_vision produces the same pixels; CLIP / DINOv2 use `normalize` with their
mean and std. The string each checkpoint family expects is `config.pp` of its config:
written out in configs/vit.py; the other configs take it from the model module
(`fi_jax.models.dinov2.PP`, the `CHECKPOINTS` table in fi_jax/models/clip.py,
`fi_jax.models.two_towers.release_config`; the torchvision / timm classifiers: the
`PRETRAINED` tables of their model files, built with `torchvision_pp` / `timm_pp`).

The torchvision / timm evaluation transforms decode and resize with PIL (Pillow's resize always
antialiases and rounds to uint8 after each pass), which TF's float resize does not reproduce
bit for bit. `decode_pil`, `resize_torchvision` and `resize_timm` therefore run Pillow inside
tf.data (`tf.numpy_function`), and `central_crop_torchvision` uses torchvision's offsets, so
the pixels equal the reference's `transforms` on the same files.
"""
from __future__ import annotations

import ast
import functools
import io
import math
import sys
import threading
from typing import Callable, Sequence

import numpy as np
from PIL import Image

# Channel statistics the PyTorch-born checkpoints were trained with (values in [0, 1]).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

Op = Callable[[dict], dict]
_OPS: dict[str, Callable[..., Op]] = {}


def register(fn: Callable[..., Op]) -> Callable[..., Op]:
  """Registers a pp op constructor under its function name."""
  _OPS[fn.__name__] = fn
  return fn


# TensorFlow's __init__ ends by importing `keras.src.optimizers` (all of Keras, and through it
# scikit-learn) "so that load-time registrations happen", inside a try that skips it on an
# ImportError. fi_jax uses tf.data and tf.image only: skipping it saves about half of the
# import (on a demo's critical path; docs/performance.md). `tf.keras` still works: it imports Keras on first use.
_EAGER_KERAS = "keras.src.optimizers"
_TF_IMPORT_LOCK = threading.Lock()


@functools.cache
def tf_module():
  """`tensorflow`, imported on first use with the GPUs hidden from it: TF only preprocesses on
  the host and must never take accelerator memory from JAX. The one place fi_jax imports TF
  (several seconds: a rerun whose sets are all cached never does); when nothing has imported
  it yet, without its eager import of Keras (see _EAGER_KERAS)."""
  with _TF_IMPORT_LOCK:   # the compile-ahead thread and the main thread may both get here
    blocked = "tensorflow" not in sys.modules and _EAGER_KERAS not in sys.modules
    if blocked:
      sys.modules[_EAGER_KERAS] = None   # an import of it raises ImportError (TF skips it)
    try:
      import tensorflow as tf
    finally:
      if blocked and sys.modules.get(_EAGER_KERAS, 0) is None:
        del sys.modules[_EAGER_KERAS]
  tf.config.set_visible_devices([], "GPU")
  return tf


class _LazyTF:
  """`tf_module()` on first attribute use: the ops are built when a config is read, but TF is
  needed only once a set is really preprocessed."""

  def __getattr__(self, name):
    return getattr(tf_module(), name)


_TF = _LazyTF()


def _tf():
  return _TF


def _hw(size) -> tuple[int, int]:
  if isinstance(size, int):
    return size, size
  h, w = size
  return int(h), int(w)


def _resize(tf, image, hw, method, antialias):
  """Resizes like big_vision: float math, then clip and cast back to the input dtype."""
  dtype = image.dtype
  out = tf.image.resize(image, hw, method=method, antialias=antialias)
  if dtype == tf.uint8:
    out = tf.cast(tf.clip_by_value(out, 0., 255.), tf.uint8)
  else:
    out = tf.cast(out, dtype)
  return out


@register
def decode(channels: int = 3, precise: bool = False, key: str = "image") -> Op:
  """Decodes encoded image bytes to uint8 HWC (big_vision `decode`)."""
  tf = _tf()

  def op(data):
    if precise:  # JPEG only: the slower, exact inverse DCT
      img = tf.io.decode_jpeg(data[key], channels=channels, dct_method="INTEGER_ACCURATE")
    else:
      img = tf.io.decode_image(data[key], channels=channels, expand_animations=False)
    img.set_shape([None, None, channels])
    return {**data, key: img}
  return op


@register
def resize(size, method: str = "bilinear", antialias: bool = False, key: str = "image") -> Op:
  """Squash-resizes to `size` (int or (h, w)), ignoring the aspect ratio."""
  tf = _tf()
  hw = _hw(size)
  return lambda data: {**data, key: _resize(tf, data[key], hw, method, antialias)}


@register
def resize_small(size: int, method: str = "area", antialias: bool = False,
                 key: str = "image") -> Op:
  """Resizes so that the smaller side equals `size`, keeping the aspect ratio."""
  tf = _tf()

  def op(data):
    img = data[key]
    h, w = tf.shape(img)[0], tf.shape(img)[1]
    ratio = tf.cast(size, tf.float32) / tf.cast(tf.minimum(h, w), tf.float32)
    nh = tf.cast(tf.round(tf.cast(h, tf.float32) * ratio), tf.int32)
    nw = tf.cast(tf.round(tf.cast(w, tf.float32) * ratio), tf.int32)
    return {**data, key: _resize(tf, img, (nh, nw), method, antialias)}
  return op


@register
def central_crop(size, key: str = "image") -> Op:
  """Crops the centre `size` (int or (h, w)) window; offsets round down like big_vision."""
  tf = _tf()
  ch, cw = _hw(size)

  def op(data):
    img = data[key]
    h, w = tf.shape(img)[0], tf.shape(img)[1]
    top, left = (h - ch) // 2, (w - cw) // 2
    img = tf.image.crop_to_bounding_box(img, top, left, ch, cw)
    return {**data, key: img}
  return op


@register
def value_range(vmin: float = -1., vmax: float = 1., in_min: float = 0., in_max: float = 255.,
                clip_values: bool = False, key: str = "image") -> Op:
  """Linearly maps [in_min, in_max] to [vmin, vmax] in float32."""
  tf = _tf()

  def op(data):
    img = tf.cast(data[key], tf.float32)
    img = vmin + (img - in_min) / (in_max - in_min) * (vmax - vmin)
    if clip_values:
      img = tf.clip_by_value(img, vmin, vmax)
    return {**data, key: img}
  return op


@register
def normalize(mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
              in_max: float = 255., key: str = "image") -> Op:
  """(x / in_max - mean) / std per channel: the torchvision ToTensor + Normalize pair."""
  tf = _tf()

  def op(data):
    img = tf.cast(data[key], tf.float32) / in_max
    img = (img - tf.constant(mean, tf.float32)) / tf.constant(std, tf.float32)
    return {**data, key: img}
  return op


@register
def clip_value_range(key: str = "image") -> Op:
  """OpenAI CLIP's mean/std normalisation (big_vision's `clip_value_range`)."""
  return normalize(CLIP_MEAN, CLIP_STD, key=key)


@register
def vgg_value_range(key: str = "image") -> Op:
  """ImageNet mean/std normalisation (big_vision's `vgg_value_range`; DINOv2, timm)."""
  return normalize(IMAGENET_MEAN, IMAGENET_STD, key=key)


@register
def grayscale_to_rgb(key: str = "image") -> Op:
  """Repeats a single channel three times (for 1-channel sources fed to RGB models)."""
  tf = _tf()

  def op(data):
    img = data[key]
    return {**data, key: tf.image.grayscale_to_rgb(img) if img.shape[-1] == 1 else img}
  return op


# ----------------------------------------------------------------------------- torchvision / timm

# Pillow resampling filters by the names torchvision's InterpolationMode / timm use.
_PIL_METHODS = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
                "bicubic": Image.Resampling.BICUBIC, "lanczos": Image.Resampling.LANCZOS,
                "box": Image.Resampling.BOX, "hamming": Image.Resampling.HAMMING}


def _pil_method(method: str):
  if method not in _PIL_METHODS:
    raise ValueError(f"Unknown resize method {method!r}; known: {sorted(_PIL_METHODS)}.")
  return _PIL_METHODS[method]


def torchvision_resized_hw(h: int, w: int, size) -> tuple[int, int]:
  """torchvision `Resize(size)`'s output size: an int sets the shorter side and the longer
  becomes int(size * long / short) (truncated); an (h, w) pair is taken as is."""
  if not isinstance(size, int):
    return _hw(size)
  short, long = (w, h) if w <= h else (h, w)
  if short == size:
    return h, w
  new_short, new_long = size, int(size * long / short)
  return (new_long, new_short) if w <= h else (new_short, new_long)


def _pil_resize(arr: np.ndarray, size, method) -> np.ndarray:
  """uint8 HWC (C = 1, 3 or 4) -> Pillow-resized uint8 HWC, torchvision's output size."""
  h, w, c = arr.shape
  oh, ow = torchvision_resized_hw(h, w, size)
  if (oh, ow) == (h, w):
    return arr
  img = Image.fromarray(arr[..., 0] if c == 1 else arr)
  out = np.asarray(img.resize((ow, oh), method))
  return out.reshape(oh, ow, c)


def _decode_pil_bytes(data, mode: str) -> np.ndarray:
  if isinstance(data, np.ndarray):   # tf.numpy_function passes a tf.string as a 0-d object array
    data = data.item()
  with Image.open(io.BytesIO(data)) as img:
    arr = np.asarray(img.convert(mode))
  return arr[..., None] if arr.ndim == 2 else arr


@register
def decode_pil(channels: int = 3, key: str = "image") -> Op:
  """Decodes image bytes with Pillow, `Image.open(f).convert("RGB")` ("L" for channels=1):
  the decoder (and CMYK / palette / grey conversion) torchvision's and timm's loaders use."""
  tf = _tf()
  modes = {1: "L", 3: "RGB", 4: "RGBA"}
  if channels not in modes:
    raise ValueError(f"decode_pil: channels must be 1, 3 or 4, got {channels}.")

  def op(data):
    img = tf.numpy_function(lambda b: _decode_pil_bytes(b, modes[channels]),
                            [data[key]], tf.uint8, stateful=False)
    img.set_shape([None, None, channels])
    return {**data, key: img}
  return op


def _resize_pil_op(size, method: str, key: str) -> Op:
  tf = _tf()
  resample = _pil_method(method)

  def op(data):
    img = data[key]
    if img.dtype != tf.uint8:
      raise ValueError(f"PIL resizes need uint8 images (decode / decode_pil first), got "
                       f"{img.dtype.name}.")
    channels = img.shape[-1]
    out = tf.numpy_function(lambda a: _pil_resize(a, size, resample), [img], tf.uint8,
                            stateful=False)
    out.set_shape([None, None, channels] if isinstance(size, int) else [*_hw(size), channels])
    return {**data, key: out}
  return op


@register
def resize_torchvision(size, method: str = "bilinear", key: str = "image") -> Op:
  """torchvision `Resize(size, interpolation)` on a PIL image: an int resizes the shorter side
  to `size` and the longer to int(size * long / short); (h, w) resizes to exactly that.
  Resampling is Pillow's (BILINEAR / BICUBIC always antialias when shrinking)."""
  return _resize_pil_op(size if isinstance(size, int) else _hw(size), method, key)


def timm_scale_size(img_size: int, crop_pct: float) -> int:
  """timm's resize target before the centre crop: floor(img_size / crop_pct)."""
  return math.floor(img_size / crop_pct)


@register
def resize_timm(img_size: int, crop_pct: float = 0.875, method: str = "bilinear",
                crop_mode: str = "center", key: str = "image") -> Op:
  """timm's eval resize (`transforms_imagenet_eval`): scale = floor(img_size / crop_pct);
  crop_mode "center" resizes the shorter side to it (torchvision `Resize(scale)`), "squash"
  resizes both sides to it. Follow with `central_crop_torchvision(img_size)`."""
  if not isinstance(img_size, int):
    raise ValueError(f"resize_timm takes a square img_size (int), got {img_size!r}.")
  scale = timm_scale_size(img_size, crop_pct)
  if crop_mode == "center":
    return resize_torchvision(scale, method, key=key)
  if crop_mode == "squash":
    return resize_torchvision((scale, scale), method, key=key)
  raise ValueError(f"resize_timm: crop_mode must be 'center' or 'squash', got {crop_mode!r}.")


@register
def central_crop_torchvision(size, key: str = "image") -> Op:
  """torchvision `CenterCrop(size)`: offsets int(round((h - crop) / 2)) (round half to even),
  and an image smaller than the crop is first zero-padded ((crop - h) // 2 before)."""
  tf = _tf()
  ch, cw = _hw(size)

  def op(data):
    img = data[key]
    h, w = tf.shape(img)[0], tf.shape(img)[1]
    ph, pw = tf.maximum(ch - h, 0), tf.maximum(cw - w, 0)
    img = tf.pad(img, [[ph // 2, (ph + 1) // 2], [pw // 2, (pw + 1) // 2], [0, 0]])
    h, w = h + ph, w + pw
    half = lambda d: tf.cast(tf.round(tf.cast(d, tf.float64) / 2.0), tf.int32)  # half to even
    img = tf.image.crop_to_bounding_box(img, half(h - ch), half(w - cw), ch, cw)
    return {**data, key: img}
  return op


def _fmt(v: Sequence[float]) -> str:
  return "(" + ", ".join(repr(float(x)) for x in v) + ")"


def torchvision_pp(resize, crop, method: str = "bilinear", mean: Sequence[float] = IMAGENET_MEAN,
                   std: Sequence[float] = IMAGENET_STD) -> str:
  """The pp string of a torchvision weights enum's `transforms()` (ImageClassification:
  Resize(resize, interpolation) -> CenterCrop(crop) -> ToTensor -> Normalize(mean, std))."""
  return (f"decode_pil|resize_torchvision({resize!r}, '{method}')|"
          f"central_crop_torchvision({crop!r})|normalize({_fmt(mean)}, {_fmt(std)})")


def timm_pp(img_size: int, crop_pct: float, method: str = "bicubic",
            mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
            crop_mode: str = "center") -> str:
  """The pp string of timm's eval transform for a pretrained_cfg (`resolve_data_config` +
  `create_transform`): resize from crop_pct, centre crop to img_size, mean / std."""
  return (f"decode_pil|resize_timm({img_size}, {crop_pct!r}, '{method}', '{crop_mode}')|"
          f"central_crop_torchvision({img_size})|normalize({_fmt(mean)}, {_fmt(std)})")


def _parse_op(text: str) -> Op:
  try:
    node = ast.parse(text.strip(), mode="eval").body
  except SyntaxError as e:
    raise ValueError(f"Cannot parse pp op {text!r}: {e.msg}.") from None
  if isinstance(node, ast.Name):
    name, args, kwargs = node.id, [], {}
  elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
    name = node.func.id
    try:
      args = [ast.literal_eval(a) for a in node.args]
      kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except ValueError:
      raise ValueError(f"pp op {text!r}: arguments must be literals.") from None
  else:
    raise ValueError(f"Cannot parse pp op {text!r}; expected name or name(args).")
  if name not in _OPS:
    raise ValueError(f"Unknown pp op {name!r} in {text!r}; known ops: {sorted(_OPS)}.")
  try:
    return _OPS[name](*args, **kwargs)
  except TypeError as e:
    raise ValueError(f"Bad arguments for pp op {text!r}: {e}.") from None


def get_preprocess_fn(pp: str) -> Op:
  """Parses a pp string into one function example-dict -> example-dict (empty string: identity)."""
  ops = [_parse_op(t) for t in pp.split("|") if t.strip()]

  def fn(data):
    for op in ops:
      data = op(data)
    return data
  return fn
