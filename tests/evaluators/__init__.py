"""Tests of fi_jax.evaluators: big_vision's evaluator API."""
