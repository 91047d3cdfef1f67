"""Tests of fi_jax.run: the CLI, configs, the demo training, compile-ahead, XLA options, recovery from faults, the bench scripts."""
