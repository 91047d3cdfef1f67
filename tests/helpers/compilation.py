"""Counting XLA compilations in a test (the compile-once and compile-ahead tests)."""
import collections
import contextlib

import jax


@contextlib.contextmanager
def compilations():
  """Counts XLA compilations (or persistent-cache loads) by function name."""
  counts: collections.Counter = collections.Counter()

  def listener(event, duration, **kw):
    del duration
    if event == "/jax/core/compile/backend_compile_duration":
      counts[kw.get("fun_name", "?")] += 1
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield counts
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
