"""Image preprocessing as tf.data ops, written as big_vision-style pp strings.

A pp string chains ops with '|', e.g. ``"decode|resize_small(256)|central_crop(224)|value_range(-1, 1)"``.
Each op maps an example dict to an example dict and acts on ``key`` (default ``"image"``).
The op semantics follow big_vision's `pp/ops_image.py` / `ops_general.py` so that a config
copied from big_vision produces the same pixels; CLIP / DINOv2 use `normalize` with their
mean and std. The string each checkpoint family expects is `config.pp` of its config:
written out in configs/vit.py; the other configs take it from the model module
(`fi_jax.models.dinov2.PP`, the `CHECKPOINTS` table in fi_jax/models/clip.py,
`fi_jax.models.two_towers.release_config`).
"""
from __future__ import annotations

import ast
from typing import Callable, Sequence

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


def _tf():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (TF costs ~6 s: import lazily)
  return tf


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
