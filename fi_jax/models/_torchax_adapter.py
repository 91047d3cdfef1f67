"""Every workaround fi_jax needs to run torchax (PyPI `torchax`, Google's PyTorch-on-JAX) with the
torch it pins, in one place.

Pinned: torchax 0.0.13 beside torch 2.13 (CPU). What this module works around:

- torchax 0.0.13 looks up 22 named-tensor ("Dimname") overloads of aten ops at import and
  when its environment loads its op tables (`aten::prod.dim_Dimname`, `aten::std.names_dim`,
  ...); torch 2.13 dropped them, so `import torchax` raises AttributeError. While torchax
  imports and builds its environment, a missing overload resolves to a placeholder that
  matches no real op (no model calls a named-tensor overload: torch removed them), and the
  placeholders are listed in `MISSING_OVERLOADS`.
- torchax's `torch.nn.functional.linear` names its arguments `(self, weights, bias)`, torch
  `(input, weight, bias)`: a call by keyword (timm's BEiT, EVA and Swin-V2 pass `weight=`)
  fails. `_torch_argument_names` registers it again under torch's names.
- torchvision (hence timm) needs the import shim on CPU torch (`torchvision_shim`).

`environment()` is the torchax environment every caller uses; `op_name(error)` the operator
named by torchax's `OperatorNotFound` (for one-line errors).
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

TORCHAX_VERSION = "0.0.13"   # the version this adapter is written for and tested with

MISSING_OVERLOADS: list[str] = []


class _MissingOverload:
  """Stands for an aten overload torch no longer has; calling it says which."""

  def __init__(self, name: str):
    self.name = name

  def __repr__(self) -> str:
    return f"<overload {self.name} missing in this torch>"

  def __call__(self, *args, **kwargs):
    raise RuntimeError(f"{self.name} does not exist in this torch")


@functools.lru_cache(maxsize=None)
def environment() -> Any:
  """(torchax module, its default environment), imported once with the workarounds above.

  Raises ImportError with the install command when torch or torchax is missing, and
  RuntimeError when the installed torchax is not `TORCHAX_VERSION`."""
  from fi_jax.models import torchvision_shim
  try:
    import torch
    import torch._ops as torch_ops
  except ImportError:
    raise ImportError("The torchax route needs torch: pip install 'fi_jax[torch]' (or "
                      "requirements-test.txt).") from None
  torchvision_shim.install()
  lookup = torch_ops.OpOverloadPacket.__getattr__

  def tolerant(packet, key):
    try:
      return lookup(packet, key)
    except AttributeError:
      if key.startswith("__"):
        raise
      name = f"{packet._qualified_op_name}.{key}"
      MISSING_OVERLOADS.append(name)
      return _MissingOverload(name)

  torch_ops.OpOverloadPacket.__getattr__ = tolerant
  try:
    try:
      import torchax
    except ImportError:
      raise ImportError("The torchax route needs torchax: pip install 'fi_jax[torch]' (or "
                        f"torchax=={TORCHAX_VERSION}).") from None
    version = getattr(torchax, "VERSION", getattr(torchax, "__version__", "?"))
    if str(version) != TORCHAX_VERSION:
      raise RuntimeError(f"fi_jax's torchax route is written for torchax {TORCHAX_VERSION}, "
                         f"found {version}: pip install torchax=={TORCHAX_VERSION}.")
    env = torchax.default_env()   # loads the op tables (more Dimname look-ups)
  finally:
    torch_ops.OpOverloadPacket.__getattr__ = lookup
  _torch_argument_names(env, torch)
  return torchax, env


def _torch_argument_names(env: Any, torch: Any) -> None:
  """`F.linear` as torch spells its arguments (see the module docstring)."""
  linear = torch.nn.functional.linear
  op = env._ops[linear]
  inner = op.func

  def torch_linear(input, weight, bias=None):   # noqa: A002 (torch's name)
    return inner(input, weight, bias)
  env._ops[linear] = dataclasses.replace(op, func=torch_linear)


def op_name(error: BaseException) -> str:
  """The operator a torchax `OperatorNotFound` names ("aten::foo.bar"), else ''."""
  m = re.search(r"Operator with name (\S+) has no lowering", str(error))
  return m[1] if m else ""
