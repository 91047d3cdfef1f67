"""The torchvision import shim for the tests: `fi_jax.models.torchvision_shim` (see there).

Used by tests/conftest.py (for the whole test session): `torchvision_shim.install()` before
importing timm or open_clip.
"""
from fi_jax.models.torchvision_shim import install

__all__ = ["install"]
