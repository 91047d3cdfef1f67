"""The test suite, one folder per stage of fi_jax (tests/<stage>/test_*.py), shared reference code in tests/helpers/; `pytest -m "not slow"` is the fast lane."""
