"""Tests of fi_jax.data (the stage package of the same name)."""
