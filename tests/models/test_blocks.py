"""The shared transformer pieces of `_blocks`: the attention's CPU chunking and the exact GELU."""
import jax
import numpy as np
import pytest
import scipy.special
import torch

from fi_jax.models import _blocks, vit

B, H, N, D = 3, 5, 40, 8


def _reference(q, k, v, bias=None, mask=None):
  """float64 textbook softmax attention (masked logits -> weight 0)."""
  s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k)
  if bias is not None:
    s = s + bias
  if mask is not None:
    s = np.where(mask, s, -np.inf)
  e = np.exp(s - s.max(-1, keepdims=True))
  return np.einsum("bhqk,bhkd->bhqd", e / e.sum(-1, keepdims=True), v)


_rng = np.random.default_rng(0)
_CAUSAL = np.tril(np.ones((N, N), bool))
_BIASES = {"none": None, "per-head": _rng.standard_normal((1, H, N, N)).astype(np.float32),
           "per-image": _rng.standard_normal((B, 1, N, N)).astype(np.float32),
           "full": _rng.standard_normal((B, H, N, N)).astype(np.float32)}
_MASKS = {"none": None, "causal 2-D": _CAUSAL,
          "per-image": (_CAUSAL[None, None] & (_rng.random((B, 1, 1, N)) > 0.3)) | np.eye(N, dtype=bool)}


@pytest.mark.parametrize("rows", [None, 4])
@pytest.mark.parametrize("bias", list(_BIASES))
@pytest.mark.parametrize("mask", list(_MASKS))
def test_attention_equals_reference_chunked_or_not(monkeypatch, rows, bias, mask):
  """Unchunked (rows None), and chunked over the 15 (batch, head) pairs 4 at a time (a
  remainder chunk), with bias / mask broadcast over batch or heads: the same numbers."""
  if rows is not None:
    monkeypatch.setattr(_blocks, "ATTENTION_CHUNK_BYTES", rows * N * N * 4)
  q, k, v = (np.random.default_rng(s).standard_normal((B, H, N, D)).astype(np.float32)
             for s in (1, 2, 3))
  b, m = _BIASES[bias], _MASKS[mask]
  out = jax.jit(lambda q, k, v: _blocks.attention(q, k, v, bias=b, mask=m))(q, k, v)
  assert out.dtype == np.float32 and out.shape == (B, H, N, D)
  np.testing.assert_allclose(out, _reference(q, k, v, b, m), rtol=0, atol=2e-6)


def test_attention_chunks_are_lax_map_steps_on_cpu(monkeypatch):
  """The chunking really happens on the CPU (a while loop in the program) and not when every
  pair fits one chunk."""
  q = np.zeros((B, H, N, D), np.float32)
  hlo = lambda: jax.jit(lambda q: _blocks.attention(q, q, q)).lower(q).as_text()
  assert "while" not in hlo()
  monkeypatch.setattr(_blocks, "ATTENTION_CHUNK_BYTES", 2 * N * N * 4)
  assert "while" in hlo()


@pytest.mark.parametrize("scan", [False, True])
def test_vit_forward_same_with_and_without_chunks(monkeypatch, scan):
  model = vit.Model(7, patch_size=(8, 8), width=32, depth=2, mlp_dim=64, num_heads=4, scan=scan)
  x = np.random.default_rng(0).uniform(-1, 1, (3, 32, 32, 3)).astype(np.float32)
  params = model.init(jax.random.PRNGKey(0), x)
  whole = np.asarray(jax.jit(model.apply)(params, x)[0])
  monkeypatch.setattr(_blocks, "ATTENTION_CHUNK_BYTES", 5 * 17 * 17 * 4)   # 12 pairs -> 5, 5, 2
  chunked = np.asarray(jax.jit(model.apply)(params, x)[0])
  np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-5)


def test_gelu_exact_equals_erfc_form_and_torch():
  x = np.concatenate([np.linspace(-12, 12, 4001), [0.0, -0.0, 1e-30, -1e-30]]).astype(np.float32)
  ours = np.asarray(jax.jit(_blocks.gelu_exact)(x))
  exact = 0.5 * x.astype(np.float64) * scipy.special.erfc(-x.astype(np.float64) / np.sqrt(2))
  np.testing.assert_allclose(ours, exact, rtol=0, atol=2e-6)
  np.testing.assert_allclose(ours, torch.nn.GELU()(torch.from_numpy(x)).numpy(), rtol=0, atol=1e-6)
  assert ours.dtype == np.float32


@pytest.mark.parametrize("images", [None, 2])
@pytest.mark.parametrize("bias", ["none", "per-head", "per-image"])
@pytest.mark.parametrize("mask", ["none", "per-image"])
def test_attention_bnhd_layout_equals_reference(monkeypatch, images, bias, mask):
  """layout="bnhd": [B, N, H, d] in and out; unchunked, and on the CPU 2 images a step (3
  images: a remainder step), bias / mask slices gathered per image."""
  if images is not None:
    monkeypatch.setattr(_blocks, "ATTENTION_CHUNK_BYTES", images * H * N * N * 4)
  q, k, v = (np.random.default_rng(s).standard_normal((B, H, N, D)).astype(np.float32)
             for s in (1, 2, 3))
  b, m = _BIASES[bias], _MASKS[mask]
  bnhd = lambda t: np.swapaxes(t, 1, 2)
  fn = jax.jit(lambda q, k, v: _blocks.attention(q, k, v, bias=b, mask=m, layout="bnhd"))
  out = fn(bnhd(q), bnhd(k), bnhd(v))
  assert out.shape == (B, N, H, D)
  np.testing.assert_allclose(out, bnhd(_reference(q, k, v, b, m)), rtol=0, atol=2e-6)
  if images is not None:
    assert "while" in fn.lower(bnhd(q), bnhd(k), bnhd(v)).as_text()
