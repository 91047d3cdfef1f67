"""fi_jax reads torch.save files without torch, equal to torch.load(weights_only=True), and
refuses anything beyond tensors, containers and scalars without running it."""
import os
import pickle

import numpy as np
import pytest
import torch

from fi_jax.models._checkpoints import CheckpointError
from fi_jax.models.convert import readers, torch_pickle


def _reference(path):
  def conv(v):
    if isinstance(v, torch.Tensor):
      v = v.detach()
      return v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy()
    if isinstance(v, dict):
      return {k: conv(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
      return type(v)(conv(x) for x in v)
    return v
  return conv(torch.load(path, map_location="cpu", weights_only=True))


def _assert_same(got, want):
  if isinstance(want, dict):
    assert list(got) == list(want)
    for k in want:
      _assert_same(got[k], want[k])
  elif isinstance(want, (list, tuple)):
    assert len(got) == len(want)
    for g, w in zip(got, want):
      _assert_same(g, w)
  elif isinstance(want, np.ndarray):
    g = np.asarray(got, np.float32) if got.dtype.name == "bfloat16" else got
    assert g.dtype == want.dtype and g.shape == want.shape
    np.testing.assert_array_equal(g, want)
  else:
    assert got == want


def _state():
  g = torch.Generator().manual_seed(0)
  base = torch.randn(4, 6, generator=g)
  lin = torch.nn.Linear(3, 2)
  return {
      "model": {
          "w": base, "w_t": base.t(), "w_slice": base[1:3, ::2], "view": base.view(24)[5:9],
          "half": torch.randn(3, generator=g).half(), "bf16": torch.randn(5, generator=g).bfloat16(),
          "f64": torch.randn(2, 2, generator=g).double(), "i64": torch.arange(7),
          "i32": torch.arange(3, dtype=torch.int32), "u8": torch.arange(4, dtype=torch.uint8),
          "bool": torch.tensor([True, False]), "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 3),
          **lin.state_dict(),
      },
      "param": torch.nn.Parameter(torch.ones(2)),
      "epoch": 7, "name": "resnet", "lr": [0.1, (1, 2)],
  }


@pytest.mark.parametrize("zipped", [True, False])
def test_equals_torch_load(tmp_path, zipped):
  path = str(tmp_path / "ckpt.pth")
  torch.save(_state(), path, _use_new_zipfile_serialization=zipped)
  _assert_same(torch_pickle.load(path), _reference(path))


def test_real_module_state_dict_through_readers(tmp_path):
  net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
  net[1].running_mean.normal_()
  path = str(tmp_path / "net.pth")
  torch.save(net.state_dict(), path)
  got = readers.read_state_dict(path)
  want = {k: v.detach().numpy() for k, v in net.state_dict().items()}
  assert sorted(got) == sorted(want)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k])


class _Evil:
  def __reduce__(self):
    return (os.system, ("echo pwned > /dev/null",))


@pytest.mark.parametrize("zipped", [True, False])
def test_refuses_arbitrary_globals_without_running_them(tmp_path, zipped, monkeypatch):
  path = str(tmp_path / "evil.pth")
  torch.save({"w": torch.ones(1), "x": _Evil()}, path, _use_new_zipfile_serialization=zipped,
             pickle_module=pickle)
  calls = []
  monkeypatch.setattr(os, "system", lambda *a: calls.append(a))
  with pytest.raises(torch_pickle.UnsupportedContent, match=r"references (posix|os)\.system"):
    torch_pickle.load(path)
  with pytest.raises(CheckpointError, match=r"evil\.pth"):
    readers.read_state_dict(path)
  assert not calls


def test_truncated_file_is_a_checkpoint_error_naming_it(tmp_path):
  path = tmp_path / "cut.pth"
  torch.save({"w": torch.randn(64, 64)}, str(path))
  data = path.read_bytes()
  path.write_bytes(data[:len(data) // 2])
  with pytest.raises(CheckpointError, match=r"cut\.pth"):
    readers.read_state_dict(str(path))
