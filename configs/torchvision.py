"""A torchvision classifier (its published weights) on Fi-ImageNet-1k and the ImageNet OOD sets.

  python main.py --config=configs/torchvision.py:name=resnet50.IMAGENET1K_V1,ckpt=/ckpts/resnet50-0676ba61.pth,data_dir=/tfds

`name` is torchvision's model name with an optional weights enum member (`resnet50` = its
DEFAULT weights, IMAGENET1K_V2; `regnet_y_16gf.IMAGENET1K_SWAG_E2E_V1`, `swin_t`, ...; every
name: `python -m fi_jax.models list`). The model family,
input size and eval preprocessing (the weights' `transforms()`) come from fi_jax.models.zoo.
Needs: `ckpt`, the weights file (the url is `zoo.resolve("torchvision/<name>")["url"]`), and in
`data_dir` the prepared TFDS sets (see configs/vit.py). `dtype=bfloat16` computes in bf16;
`res=N` evaluates at input size N (crop N, the resize scaled with it; 0 = the weights'). The
report's model label is the canonical name (`<source>/<model>.<tag>`).
"""
from configs import common


def get_config(arg=None):
  arg = common.parse_arg(arg, name="resnet50", ckpt="", dtype="float32", res=0,
                         **common.IMAGENET_ARGS)
  return common.zoo_benchmark("torchvision", arg)
