"""Tests of fi_jax.metrics (the stage package of the same name)."""
