"""Tests of fi_jax.models (the stage package of the same name)."""
