"""CLIP (OpenAI or OpenCLIP weights) zero-shot on Fi-ImageNet-1k and the ImageNet OOD sets.

  python main.py --config=configs/clip.py:name=openai-B/16,ckpt=/ckpts/open_clip_model.safetensors,data_dir=/tfds

Needs: the OpenCLIP state dict of the checkpoint `name` (open_clip_model.safetensors, or
open_clip_pytorch_model.bin read with torch.load(weights_only=True)); where to download each is
in fi_jax.models._releases.CLIP_CHECKPOINTS. The BPE vocabulary defaults to the copy inside an installed
open_clip (`vocab=` points elsewhere). Datasets as for configs/vit.py. Features are the
normalised image embeddings; the head is the zero-shot head of OpenAI's 80 prompts.

Arguments: `name`, `ckpt`, `vocab`; the image tower's `width`, `depth`, `heads`, `mlp_dim`,
`patch` (0 = the checkpoint name's); `res` (input size, 0 = the checkpoint's; the posemb keeps
the checkpoint's grid and is resized per call); and the common ImageNet ones (configs/common.py
IMAGENET_ARGS). The report's model label is `clip-<name>` (`clip-openai-B16`; the rule:
fi_jax/common/labels.py; `--config.model_label=...` sets one).
"""
import ml_collections

from configs import common
from fi_jax.common.labels import short_label
from fi_jax.data import preprocess
from fi_jax.models import _releases as releases


def get_config(arg=None):
  arg = common.parse_arg(arg, name="openai-B/16", ckpt="", vocab="", res=0, **common.ARCH_ARGS,
                         **common.IMAGENET_ARGS)
  if arg.name not in releases.CLIP_CHECKPOINTS:
    raise ValueError(f"Unknown CLIP checkpoint {arg.name!r}; known: {sorted(releases.CLIP_CHECKPOINTS)}.")
  model_kw, _, pp = releases.CLIP_CHECKPOINTS[arg.name]
  model_kw = dict(model_kw)
  res = model_kw.get("image_size", 224)
  if arg.res and arg.res != res:
    pp = pp.replace(f"({res}", f"({arg.res}")   # resize_small(res, ...) and central_crop(res)
    res = model_kw["image_size"] = arg.res
  if common.arch_overrides(arg):
    model_kw["image"] = common.arch_overrides(arg)
  c = common.base_config()
  c.model_name = "clip"
  c.model_label = short_label("clip", arg.name)
  c.model = ml_collections.ConfigDict(model_kw)
  c.model_init = arg.ckpt
  c.init_shape = (1, res, res, 3)
  c.pp = pp
  c.input_std = preprocess.CLIP_STD
  c.zero_shot = ml_collections.ConfigDict(dict(batch_size=256))
  if arg.vocab:
    c.zero_shot.vocab_path = arg.vocab
  return common.imagenet_benchmark(c, arg)
