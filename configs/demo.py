"""The embedded demo: open-set digits with a tiny ViT trained from scratch (no download).

ID = digits 0-5 (sklearn's bundled 8x8 digits), OOD = the held-out digits 6-9. fi_jax's own
ViT (the module the real checkpoints use, at width 64) is trained with optax for ~1500 steps,
then the standard pipeline extracts features and logits, runs the detectors and reports.

  python main.py                                   # this config (the default)
  python main.py --config=configs/demo.py:quick    # fewer steps, for tests
"""
import ml_collections

from configs import common

ID_DIGITS = (0, 1, 2, 3, 4, 5)
OOD_DIGITS = (6, 7, 8, 9)


def get_config(arg=None):
  arg = common.parse_arg(arg, quick=False)
  c = common.base_config()
  c.model_name = "vit"
  c.model_label = "vit-mu-digits"
  c.model = ml_collections.ConfigDict(dict(
      num_classes=len(ID_DIGITS), patch_size=(2, 2), width=64, depth=2, mlp_dim=128,
      num_heads=4, pool_type="gap", posemb="learn"))
  c.init_shape = (1, 8, 8, 1)
  c.train = ml_collections.ConfigDict(dict(
      steps=200 if arg.quick else 1500, batch_size=64, lr=1e-3, warmup_steps=50,
      augment_shift=1))
  c.pp = "value_range(-1, 1, 0, 16)"   # digits are in [0, 16]
  c.input_std = (0.5,)                 # one channel; [0, 1] pixels span 2 units of the input
  c.batch_size = 128
  c.cache_shard_size = 256             # a few shards per set, so that a killed run resumes
  c.id_name = "digits_0-5"
  c.id_fit = ml_collections.ConfigDict(dict(source="digits", split="train", classes=ID_DIGITS))
  c.id_test = ml_collections.ConfigDict(dict(source="digits", split="test", classes=ID_DIGITS))
  c.ood = ml_collections.ConfigDict({
      "digits_6-9": dict(source="digits", split="test", classes=OOD_DIGITS,
                         id_classes=ID_DIGITS)})
  # Every detector fi_jax has that applies to this one-tower ViT (ODIN and the layer ones
  # included; the zero-shot NegLabel, CSP and GL-MCM need a two-tower model: configs/clip_demo.py);
  # quick keeps the logit ones for fast tests.
  c.detectors = tuple(common.LOGIT_DETECTORS) if arg.quick else common.posthoc_detectors(
      odin=True, model_name=c.model_name, layers=True)
  # The demo's fit set has ~760 images: neighbour counts sized for it (the ImageNet presets use
  # k=1000 / k=50 on 1.28M images); NNGuide keeps the whole fit set as its bank.
  # NECO's 100 principal directions are 13% of a ViT-B's 768 features: 8 of the demo's 64.
  c.detector_hparams = ml_collections.ConfigDict(dict(
      knn=dict(k=10), nnguide=dict(k=10, alpha=1.0), neco=dict(dim=8)))
  c.metrics.n_bootstrap = 0 if arg.quick else 200
  return c
