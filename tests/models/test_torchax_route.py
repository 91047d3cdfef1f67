"""The torchax route (fi_jax/models/torchax_classifier.py): timm / torchvision classifiers without
a native port, loaded from real-format random-init checkpoints through `zoo.from_pretrained`,
equal torch eager (logits and pre-logits); sharded over 4 devices equal to 1 device; and run
from the cache in a process where torch cannot be imported."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from fi_jax.models import _torchax_adapter, torchax_classifier, zoo
from fi_jax.models._checkpoints import CheckpointError
from tests.helpers import subprocess_env

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
try:
  _torchax_adapter.environment()   # torchax imports through the project's adapter only
except ImportError as e:
  pytest.skip(f"the torchax route's extra is not installed: {e}", allow_module_level=True)
torchvision = pytest.importorskip("torchvision")
safetensors_torch = pytest.importorskip("safetensors.torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZE = 64   # evaluated at 64 px (Model's `input_size`): small, and every one of these takes it

# 10 architectures of 10 families (timm's modules, torchvision's) that have no native port
ARCHS = ["timm/ghostnet_100", "timm/hardcorenas_a", "timm/rexnet_100", "timm/dla46_c",
         "timm/edgenext_xx_small", "timm/repghostnet_050", "timm/hgnetv2_b0",
         "timm/inception_next_atto", "torchvision/shufflenet_v2_x0_5", "torchvision/mnasnet0_5"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
  path = tmp_path / "torchax-cache"
  monkeypatch.setenv("FI_JAX_TORCHAX_CACHE", str(path))
  return path


def _checkpoint(name, folder, seed=0):
  """(file, the torch model) of `name` with random weights, saved as its library ships it:
  timm as model.safetensors, torchvision as a torch.save'd .pth state dict. BatchNorm
  statistics are perturbed so that they matter."""
  torch.manual_seed(seed)
  source, model = name.split("/")
  if source == "timm":
    m = timm.create_model(model, pretrained=False)
  else:
    m = torchvision.models.get_model(model.split(".")[0], weights=None)
  with torch.no_grad():
    for mod in m.modules():
      if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
        mod.running_mean.uniform_(-0.2, 0.2)
        mod.running_var.uniform_(0.5, 1.5)
  m.eval()
  os.makedirs(folder, exist_ok=True)
  if source == "timm":
    path = os.path.join(folder, "model.safetensors")
    safetensors_torch.save_file({k: v.contiguous() for k, v in m.state_dict().items()}, path)
  else:
    path = os.path.join(folder, "weights.pth")
    torch.save(m.state_dict(), path)
  return path, m


def _torch_outputs(m, source, x):
  """(logits, pre-logits) of torch eager: timm's forward_head(pre_logits=True); torchvision's
  input of the last Linear (read with a forward hook)."""
  xt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
  with torch.no_grad():
    if source == "timm":
      f = m.forward_features(xt)
      return m(xt).numpy(), m.forward_head(f, pre_logits=True).numpy()
    seen = {}
    last = [v for v in m.modules() if isinstance(v, torch.nn.Linear)][-1]
    hook = last.register_forward_hook(lambda mod, inp, out: seen.update(pre=inp[0]))
    logits = m(xt).numpy()
    hook.remove()
    return logits, seen["pre"].numpy()


def _rel(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


@pytest.mark.slow
@pytest.mark.parametrize("name", ARCHS)
def test_zoo_loads_a_torchax_model_equal_to_torch_eager(name, cache, tmp_path, monkeypatch):
  """resolve says "torchax"; from_pretrained admits the file (its record is in the cache) and
  the outputs on a batch other than the probe equal torch eager within 1e-4. (Exported for
  the CPU only here, to save time: the CPU/CUDA/TPU export is the sharded test's.)"""
  monkeypatch.setattr(torchax_classifier, "EXPORT_PLATFORMS", ("cpu",))
  info = zoo.resolve(name)
  assert info["route"] == "torchax" and info["family"] == "torchax_classifier"
  ckpt, m = _checkpoint(info["name"], tmp_path / "ckpt")
  model, params, _ = zoo.from_pretrained(name, ckpt, input_size=SIZE)
  record = torchax_classifier.admission(ckpt, dict(variant=info["name"], input_size=SIZE))
  assert record["admitted"] and record["probe"] == [2, SIZE, SIZE, 3]
  x = np.random.default_rng(1).standard_normal((2, SIZE, SIZE, 3)).astype(np.float32)
  logits, out = jax.jit(model.apply)({"params": params}, x)
  want_logits, want_pre = _torch_outputs(m, info["source"], x)
  assert _rel(logits, want_logits) < 1e-4 and _rel(out["pre_logits"], want_pre) < 1e-4
  head = np.asarray(out["pre_logits"], np.float64) @ np.asarray(params["head"]["kernel"]) + \
      np.asarray(params["head"]["bias"])
  assert _rel(head, want_logits) < 1e-4


def test_native_ports_keep_priority_and_unknown_names_say_why(cache):
  assert zoo.resolve("timm/resnet50")["route"] == "flax"
  assert zoo.resolve("torchvision/resnet18")["route"] == "flax"
  with pytest.raises(ValueError, match="Nor does the torchax route take it: timm has no model"):
    zoo.resolve("timm/not_a_model_at_all")
  with pytest.raises(ValueError, match="not a 1000-class"):
    zoo.resolve("torchvision/raft_small")


def test_a_file_that_does_not_fit_names_the_files_keys(cache, tmp_path):
  ckpt, m = _checkpoint("timm/ghostnet_100", tmp_path / "ckpt")
  sd = {k: v for k, v in m.state_dict().items() if k != "conv_stem.weight"}
  sd["extra.weight"] = torch.zeros(3)
  safetensors_torch.save_file({k: v.contiguous() for k, v in sd.items()}, ckpt)
  with pytest.raises(CheckpointError, match=r"missing in the file: \['conv_stem.weight'\]; "
                     r"not in the model: \['extra.weight'\].*huggingface.co/timm/ghostnet_100"):
    zoo.from_pretrained("timm/ghostnet_100", ckpt, input_size=SIZE)


@pytest.mark.slow
def test_a_model_torchax_computes_wrongly_is_not_admitted(cache, tmp_path, monkeypatch):
  """The admission compares against torch eager: a torchax function that is off by 1% (here
  made so) is refused with one line, and the refusal is recorded."""
  ckpt, _ = _checkpoint("timm/ghostnet_100", tmp_path / "ckpt")
  real = torchax_classifier.Model.apply

  def off(self, variables, images, **kw):
    logits, out = real(self, variables, images, **kw)
    return logits * 1.01, out
  monkeypatch.setattr(torchax_classifier.Model, "apply", off)
  with pytest.raises(CheckpointError, match="differently from torch eager.*not admitted"):
    zoo.from_pretrained("timm/ghostnet_100", ckpt, input_size=SIZE)
  record = torchax_classifier.admission(ckpt, dict(variant="timm/ghostnet_100.in1k",
                                                   input_size=SIZE))
  assert not record["admitted"] and 0.005 < record["logits_rel_err"] < 0.02


_SCRIPT = """
import json, sys
import numpy as np
if sys.argv[1] == "no-torch":
  sys.modules["torch"] = None   # import torch raises ImportError
import jax
from fi_jax.common import distributed
from fi_jax.extract import forward
from fi_jax.models import _predictor, zoo
name, ckpt, size = sys.argv[2], sys.argv[3], int(sys.argv[4])
model, params, info = zoo.from_pretrained(name, ckpt, input_size=size)
predict, _ = _predictor.default_predictor(model, params, None)
x = np.random.default_rng(2).standard_normal((10, size, size, 3)).astype(np.float32)
batches = [dict(image=np.concatenate([x[i:i + 8], np.zeros((8 - len(x[i:i + 8]), size, size, 3),
                                                           np.float32)]),
                label=np.zeros(8, np.int32), group=np.zeros(8, np.int32),
                _id=np.arange(i, i + 8), _mask=np.arange(i, i + 8) < len(x))
           for i in (0, 8)]
out = forward.extract(predict, params, batches, distributed.data_mesh())
print("OUT " + json.dumps({"devices": jax.device_count(), "route": info["route"],
                           "logits": np.asarray(out["logits"]).tolist(),
                           "features": np.asarray(out["features"]).tolist()}))
"""


def _run(mode, devices, name, ckpt, cache):
  env = {**os.environ, "FI_JAX_TORCHAX_CACHE": str(cache), "PYTHONPATH": ROOT,
         "XLA_FLAGS": subprocess_env.xla_flags(devices)}
  res = subprocess.run([sys.executable, "-c", _SCRIPT, mode, name, ckpt, str(SIZE)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]
  return json.loads([line for line in res.stdout.splitlines() if line.startswith("OUT ")][-1][4:])


@pytest.mark.slow
def test_sharded_over_4_devices_and_without_torch_equal_one_device(cache, tmp_path):
  """The extraction stage's sharded forward: 4 devices give 1 device's outputs; a process in
  which torch cannot be imported runs the same program from the cache (the stored exports and
  the admission) and gives the same bits."""
  name = "timm/ghostnet_100.in1k"
  ckpt, m = _checkpoint(name, tmp_path / "ckpt")
  one = _run("torch", 1, name, ckpt, cache)
  four = _run("torch", 4, name, ckpt, cache)
  no_torch = _run("no-torch", 1, name, ckpt, cache)
  assert (one["devices"], four["devices"]) == (1, 4) and no_torch["route"] == "torchax"
  np.testing.assert_allclose(four["logits"], one["logits"], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(four["features"], one["features"], rtol=1e-5, atol=1e-5)
  assert no_torch["logits"] == one["logits"] and no_torch["features"] == one["features"]
  x = np.random.default_rng(2).standard_normal((10, SIZE, SIZE, 3)).astype(np.float32)
  want_logits, want_pre = _torch_outputs(m, "timm", x)
  assert _rel(one["logits"], want_logits) < 1e-4 and _rel(one["features"], want_pre) < 1e-4
  exports = sorted((cache / name.replace("/", "_")).glob("export-*.bin"))
  assert [p.name for p in exports] == ["export-2x64x64-float32.bin", "export-8x64x64-float32.bin"]
  exported = jax.export.deserialize(bytearray(exports[1].read_bytes()))
  assert exported.platforms == torchax_classifier.EXPORT_PLATFORMS == ("cpu", "cuda", "tpu")
