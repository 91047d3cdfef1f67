"""Tests of fi_jax.common (the stage package of the same name)."""
