"""DINOv2 with its linear ImageNet head on Fi-ImageNet-1k and the ImageNet OOD sets.

  python main.py --config=configs/dinov2.py:variant=B/14,ckpt=/ckpts/dinov2_vitb14_pretrain.pth,head=/ckpts/dinov2_vitb14_linear4_head.pth,data_dir=/tfds

Needs: the backbone (`ckpt`) and linear head (`head`) files from
https://dl.fbaipublicfiles.com/dinov2/ (dinov2_vit{s,b,l,g}14[_reg4]_pretrain.pth and
..._linear4_head.pth; `layers=1` for ..._linear_head.pth), read with torch.load(weights_only=True)
or as safetensors; `registers=4` for the _reg4 models. Datasets as for configs/vit.py.
Features (`pre_logits`) are the head's input: 5*D for the 4-layer head, 2*D for the 1-layer one.

Arguments: `ckpt`, `head`, `variant` (S/14, B/14, L/14, g/14), `registers`, `layers`;
`width`, `depth`, `heads`, `mlp_dim`, `patch` (0 = the variant's); `res` (crop size; the
resize is res * 256/224; the posemb keeps the checkpoint's grid and is interpolated per call);
and the common ImageNet ones (configs/common.py IMAGENET_ARGS). The report's model label is
`dinov2-<variant>[-reg<registers>][-linear1]` (`dinov2-B14-reg4`; the rule:
fi_jax/common/labels.py; `--config.model_label=...` sets one).
"""
import ml_collections

from configs import common
from fi_jax.common.labels import short_label
from fi_jax.data import preprocess
from fi_jax.models import _releases as releases


def get_config(arg=None):
  arg = common.parse_arg(arg, variant="B/14", registers=0, layers=4, ckpt="", head="",
                         res=224, **common.ARCH_ARGS, **common.IMAGENET_ARGS)
  c = common.base_config()
  c.model_name = "dinov2"
  c.model_label = short_label("dinov2", arg.variant, f"reg{arg.registers}" if arg.registers else "",
                              "linear1" if arg.layers == 1 else "")
  c.model = ml_collections.ConfigDict(dict(
      num_classes=1000, variant=arg.variant, num_registers=arg.registers,
      head_layers=arg.layers, **common.arch_overrides(arg)))
  c.model_init = arg.ckpt
  c.model_load = ml_collections.ConfigDict(dict(head=arg.head)) if arg.head else c.model_load
  c.init_shape = (1, arg.res, arg.res, 3)
  c.pp = releases.DINOV2_PP if arg.res == 224 else releases.DINOV2_PP.replace(
      "resize_small(256", f"resize_small({round(arg.res * 256 / 224)}").replace(
          "central_crop(224)", f"central_crop({arg.res})")
  c.input_std = preprocess.IMAGENET_STD
  return common.imagenet_benchmark(c, arg)
