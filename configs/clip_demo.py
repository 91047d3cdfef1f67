"""Two-tower smoke run: a tiny random-weights CLIP on the demo's digits (no download).

ID = digits 0-5, OOD = digits 6-9 (sklearn's bundled 8x8 digits, as configs/demo.py). The CLIP
is fi_jax's own (fi_jax/models/clip.py) at width 32, one block per tower, random weights
(`random_init`: the report says so); its zero-shot head embeds "a photo of the digit {}" for
the six ID digit names with the real CLIP tokenizer (open_clip's BPE vocabulary, or
$FI_JAX_CLIP_BPE). The detectors are the zero-shot ones and a few logit ones: MCM, NegLabel and
CSP (the first `words` labels of each WordNet file of the shipped word list, embedded once),
GL-MCM (the image tower's local score). The numbers mean nothing (random weights); the run
shows the two-tower path end to end in about a minute on a CPU.

  python main.py --config=configs/clip_demo.py
  python main.py --config=configs/clip_demo.py:words=40
"""
import ml_collections

from configs import common, demo

DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five")
DETECTORS = ("msp", "energy", "mcm", "neglabel", "csp", "glmcm")


def get_config(arg=None):
  arg = common.parse_arg(arg, words=12)
  c = demo.get_config("quick")
  c.model_name = "clip"
  c.model_label = "clip-tiny-random"
  c.model = ml_collections.ConfigDict(dict(
      out_dim=16, image_size=8, image=dict(width=32, depth=1, num_heads=2, patch_size=2),
      text=dict(width=32, depth=1, num_heads=2)))
  c.train = ml_collections.ConfigDict()   # no training: random weights on purpose
  c.random_init = True
  c.zero_shot = ml_collections.ConfigDict(dict(
      class_names=list(DIGIT_NAMES), templates=["a photo of the digit {}."], batch_size=64,
      word_limit=arg.words))
  c.detectors = DETECTORS
  # ~0.15 x (29 files x `words`) negative labels: a handful per group
  c.detector_hparams = ml_collections.ConfigDict(dict(neglabel=dict(groups=4),
                                                      csp=dict(groups=4)))
  c.metrics.n_bootstrap = 0
  return c
