"""Perception Encoder PE-Core zero-shot on Fi-ImageNet-1k and the ImageNet OOD sets.

  python main.py --config=configs/pe_core.py:name=PE-Core-L14-336,ckpt=/ckpts/PE-Core-L14-336.pt,data_dir=/tfds

Needs: the checkpoint of `name` (fi_jax.models._releases.PE_CORE_CHECKPOINTS): the official
`<name>.pt` from https://huggingface.co/facebook/<name>, or open_clip's
`open_clip_model.safetensors` (`_releases.pe_core_urls(name)`). The BPE vocabulary is CLIP's
(the copy inside an installed open_clip by default; `vocab=` points elsewhere); texts are
tokenized to the text tower's context (32 tokens, 72 for G/14). Preprocessing is the official
eval transform: a squash resize to the input size (bilinear, on the PIL image), mean = std =
0.5. Features are the normalised image embeddings; the head is the zero-shot head of OpenAI's
80 prompts, and the two-tower detectors (MCM, NegLabel, CSP; GL-MCM with `layer_detectors`)
are on.

Arguments: `name`, `ckpt`, `vocab`; `res` (input size, 0 = the release's; the posemb keeps the
checkpoint's grid and is resized per call, the RoPE grid follows the input); and the common
ImageNet ones (configs/common.py IMAGENET_ARGS). The report's model label is the release name
(`pe_core-PE-Core-L14-336`; `--config.model_label=...` sets one).
"""
import ml_collections

from configs import common
from fi_jax.common.labels import short_label
from fi_jax.models import _releases as releases


def get_config(arg=None):
  arg = common.parse_arg(arg, name="PE-Core-B16-224", ckpt="", vocab="", res=0,
                         **common.IMAGENET_ARGS)
  if arg.name not in releases.PE_CORE_CHECKPOINTS:
    raise ValueError(f"Unknown PE-Core release {arg.name!r}; known: "
                     f"{sorted(releases.PE_CORE_CHECKPOINTS)}. {releases.PE_CORE_DOWNLOAD_HINT}")
  model_kw, res, _, _ = releases.PE_CORE_CHECKPOINTS[arg.name]
  res = arg.res or res
  c = common.base_config()
  c.model_name = "pe_core"
  c.model_label = short_label("pe_core", arg.name)
  c.model = ml_collections.ConfigDict({**model_kw, "image_size": res})
  c.model_init = arg.ckpt
  c.init_shape = (1, res, res, 3)
  c.pp = releases.PE_CORE_PP.format(res=res)
  c.input_std = (0.5, 0.5, 0.5)
  c.zero_shot = ml_collections.ConfigDict(dict(batch_size=256))
  if arg.vocab:
    c.zero_shot.vocab_path = arg.vocab
  return common.imagenet_benchmark(c, arg)
