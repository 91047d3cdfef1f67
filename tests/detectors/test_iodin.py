"""i-ODIN vs an independent torch reference of OpenOOD v1.5's iodin postprocessor (read for
facts: OpenOOD @ 3c35632ee91b54b09d1f085d04f94744cece7d0b, openood/postprocessors/
iodin_postprocessor.py, configs/postprocessors/iodin.yml): ODIN's signed, std-scaled step on
only the one input entry of largest |gradient| per image (argmax over the NCHW-flattened
gradient)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax import detectors
from tests.helpers.detector_reference import assert_scores

torch = pytest.importorskip("torch")


def _case(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(6, 5, 4, 3)).astype(np.float32)           # NHWC
  a = rng.normal(size=(3, 16)).astype(np.float32)
  bmat = rng.normal(size=(16, 7)).astype(np.float32)

  def logits_fn(img):                                             # 1x1 conv, ReLU, GAP, linear
    return jnp.mean(jax.nn.relu(img @ a), axis=(1, 2)) @ bmat
  model = lambda t: torch.relu(torch.einsum("nchw,ck->nkhw", t, torch.tensor(a))).mean(
      (2, 3)) @ torch.tensor(bmat)
  return x, logits_fn, model


def torch_iodin(model, x, std, temp, eps):
  """OpenOOD's postprocess: CE loss of z/T at the argmax label, grad, one-entry mask."""
  xt = torch.tensor(x.transpose(0, 3, 1, 2), requires_grad=True)   # NCHW
  out = model(xt)
  loss = torch.nn.functional.cross_entropy(out / temp, out.detach().argmax(1))
  loss.backward()
  grad = xt.grad.detach()
  flat = grad.abs().reshape(len(x), -1)
  mask = torch.zeros_like(flat)
  mask.scatter_(1, flat.argmax(1, keepdim=True), 1.0)
  mask = mask.reshape(grad.shape)
  step = (torch.ge(grad, 0).float() - 0.5) * 2 / torch.tensor(std)[None, :, None, None]
  out2 = model(xt.detach() - eps * step * mask) / temp
  return torch.log_softmax(out2.double(), 1).max(1).values.numpy()


@pytest.mark.parametrize("temp,eps", [(10.0, 0.05), (1000.0, 0.0014)])
def test_iodin_equals_torch_reference(temp, eps):
  x, logits_fn, model = _case()
  std = np.array([0.229, 0.224, 0.225], np.float32)
  det = detectors.build("iodin", temperature=temp, epsilon=eps)
  got = np.asarray(det.score_inputs({}, logits_fn, x, input_std=std))
  assert_scores(got, torch_iodin(model, x, std, temp, eps))
  # one entry moved: differs from ODIN (all entries) and from no perturbation
  odin = np.asarray(detectors.build("odin", temperature=temp, epsilon=eps).score_inputs(
      {}, logits_fn, x, input_std=std))
  assert np.max(np.abs(got - odin)) > 1e-6
  jitted = jax.jit(lambda im: det.score_inputs({}, logits_fn, im, input_std=std))
  np.testing.assert_allclose(np.asarray(jitted(x)), got, rtol=1e-6)


def test_iodin_defaults_and_errors():
  assert detectors.hparams_of("iodin") == {"temperature": 1000.0, "epsilon": 0.0014}
  assert detectors.hparams_of("iodin", "openood") == detectors.hparams_of("iodin")
  det = detectors.build("iodin")
  assert "inputs" in det.needs and det.fit(None) == {}
  with pytest.raises(ValueError, match="iodin: hyper-parameter temperature"):
    detectors.build("iodin", temperature=0.0)
  with pytest.raises(ValueError, match="iodin perturbs the input images"):
    det.score({}, detectors.Outputs(np.zeros((2, 3)), np.zeros((2, 3))))
  with pytest.raises(ValueError, match="iodin: images must be NHWC"):
    det.score_inputs({}, lambda v: v, np.zeros((2, 3)))
