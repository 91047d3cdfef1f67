"""An official MAE fine-tuned ViT (facebookresearch/mae) on Fi-ImageNet-1k and the ImageNet OOD sets.

  python main.py --config=configs/mae.py:name=vit_base_patch16,ckpt=/ckpts/mae_finetuned_vit_base.pth,data_dir=/tfds

`name`: vit_base_patch16, vit_large_patch16 or vit_huge_patch14 (tag `finetuned_in1k`, the
default). The file is https://dl.fbaipublicfiles.com/mae/finetune/mae_finetuned_vit_<size>.pth
(`zoo.resolve("mae/<name>")["url"]`); the model (fi_jax.models.vit, average pooling + fc_norm)
and MAE's eval transform (Resize(256, bicubic), CenterCrop(224), ImageNet mean/std) come from
fi_jax.models.zoo. (timm's `.mae` tags are the headless pre-training encoders:
`zoo.from_pretrained` features, no benchmark run without a classifier head.)
Other arguments as configs/timm.py (`dtype`, `res`, the ImageNet benchmark's).
"""
from configs import common


def get_config(arg=None):
  arg = common.parse_arg(arg, name="vit_base_patch16", ckpt="", dtype="float32", res=0,
                         **common.IMAGENET_ARGS)
  return common.zoo_benchmark("mae", arg)
