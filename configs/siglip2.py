"""SigLIP / SigLIP 2 zero-shot (two towers) on Fi-ImageNet-1k and the ImageNet OOD sets.

  python main.py --config=configs/siglip2.py:release=siglip2_b16_224,tokenizer=/ckpts/gemma_tokenizer.model,data_dir=/tfds

Needs: the released .npz (`release` names one; the file is looked up by its name in
$FI_JAX_CHECKPOINT_DIR, or give `ckpt=/path/file.npz`), the SentencePiece tokenizer model
(`tokenizer`; SigLIP 2: gs://big_vision/gemma_tokenizer.model, SigLIP:
gs://t5-data/vocabs/cc_en.32000/sentencepiece.model) and the prepared TFDS sets as for
configs/vit.py. The classifier head is the zero-shot head: ImageNet class names x the 80 CLIP
prompts (+ "{}"), averaged and renormalised, times exp(t) plus b.

Arguments: `release`, `ckpt`, `tokenizer`, `templates`; the image tower's `width`, `depth`,
`heads`, `mlp_dim`, `patch` (0 = the release's); `res` (input size, 0 = the release's; the
posemb is resampled at load, with a warning); and the common ImageNet ones (configs/common.py
IMAGENET_ARGS). The report's model label is the release name (`siglip2_b16_224`; the rule:
fi_jax/common/labels.py; `--config.model_label=...` sets one).
"""
import ml_collections

from configs import common
from fi_jax.common.labels import short_label
from fi_jax.models import _releases as releases


def get_config(arg=None):
  arg = common.parse_arg(arg, release="siglip2_b16_224", ckpt="", tokenizer="",
                         templates="clip_paper", res=0, **common.ARCH_ARGS,
                         **common.IMAGENET_ARGS)
  rc = releases.siglip_release_config(arg.release)
  c = common.base_config()
  c.model_name = "two_towers"
  c.model_label = short_label("siglip", arg.release)
  rc["model"]["image"].update(common.arch_overrides(arg, patch_tuple=True))
  c.model = ml_collections.ConfigDict(rc["model"])
  c.model_init = arg.ckpt or rc["model_init"]
  c.init_shape = rc["init_shape"]
  c.pp = rc["pp"]
  if arg.res:
    c.init_shape = (1, arg.res, arg.res, 3)
    c.pp = f"decode|resize({arg.res})|value_range(-1, 1)"
  c.zero_shot = ml_collections.ConfigDict(dict(
      tokenizer=arg.tokenizer, tokenizer_kind=rc["tokenizer"], templates=arg.templates,
      batch_size=256))
  return common.imagenet_benchmark(c, arg)
