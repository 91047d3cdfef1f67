"""Tests of the pipeline core (fi_jax.pipeline): end to end runs, multi-host."""
