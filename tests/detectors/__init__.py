"""Tests of fi_jax.detectors (the stage package of the same name)."""
