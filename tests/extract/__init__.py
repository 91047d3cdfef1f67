"""Tests of fi_jax.extract (the stage package of the same name)."""
