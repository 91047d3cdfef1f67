"""Installable: a model module outside the package by dotted path; `pip install .` gives the
packages and the `fi-jax` console script."""
import os
import shutil
import subprocess
import sys

import pytest

from configs import demo
from fi_jax.run import benchmark as run
from fi_jax.run import model as run_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The example of docs/usage.md ("A model outside fi_jax"), verbatim.
MY_MLP = '''
"""my_pkg/my_mlp.py: a model family outside fi_jax (--config.model_name=my_pkg.my_mlp)."""
import flax
import flax.linen as nn
import numpy as np


class Model(nn.Module):
  num_classes: int = 1000
  width: int = 256

  @nn.compact
  def __call__(self, images, train=False):
    x = images.reshape(images.shape[0], -1)
    x = nn.relu(nn.Dense(self.width, name="hidden")(x))
    return nn.Dense(self.num_classes, name="head")(x), {"pre_logits": x}


def load(init_params, init_file, model_cfg=None, **kw):
  """Params from an .npz of '/'-joined paths ('head/kernel', ...), no pickle."""
  with np.load(init_file, allow_pickle=False) as z:
    flat = {tuple(k.split("/")): z[k] for k in z.files}
  return flax.traverse_util.unflatten_dict(flat)
'''


def test_model_module_by_dotted_path(tmp_path, monkeypatch):
  (tmp_path / "my_pkg").mkdir()
  (tmp_path / "my_pkg" / "__init__.py").write_text("")
  (tmp_path / "my_pkg" / "my_mlp.py").write_text(MY_MLP)
  with open(os.path.join(ROOT, "docs", "usage.md")) as f:
    assert MY_MLP.strip().split("\n", 1)[1] in f.read()   # the documented example is this one
  monkeypatch.syspath_prepend(str(tmp_path))
  c = demo.get_config("quick")
  c.model_name, c.model = "my_pkg.my_mlp", {"num_classes": 6, "width": 32}
  c.train.steps, c.detectors, c.metrics.n_bootstrap = 20, ("msp", "vim"), 0
  results = run.run(c, str(tmp_path / "wd"), log=lambda s: None)
  assert [r["detector"] for r in results["rows"]] == ["msp", "vim"]
  with pytest.raises(ValueError, match="no module my_pkg.nope"):
    run_model.model_module("my_pkg.nope")


@pytest.mark.slow
def test_pip_install_gives_packages_and_console_script(tmp_path):
  src, target = tmp_path / "src", tmp_path / "site"
  src.mkdir()   # a copy: setuptools writes build/ into the source tree
  for name in ("fi_jax", "tfds_fi_imagenet", "configs"):
    shutil.copytree(os.path.join(ROOT, name), src / name,
                    ignore=shutil.ignore_patterns("__pycache__"))
  for name in ("pyproject.toml", "README.md", "LICENSE"):
    shutil.copy(os.path.join(ROOT, name), src / name)
  res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-build-isolation", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
  assert res.returncode == 0, res.stderr[-3000:]
  for p in ("fi_jax/run/cli.py", "tfds_fi_imagenet/ninco/checksums.tsv", "configs/vit.py"):
    assert (target / p).exists(), p
  env = {**os.environ, "PYTHONPATH": str(target)}
  res = subprocess.run([str(target / "bin" / "fi-jax"), "--config=configs/demo.py:bogus"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
  assert res.returncode == 2
  assert res.stderr.strip().startswith("fi-jax: error:") and "'bogus'" in res.stderr
