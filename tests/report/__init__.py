"""Tests of fi_jax.report (the stage package of the same name)."""
