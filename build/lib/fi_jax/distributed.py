"""Process and device setup: jax.distributed, the data mesh, global batches.

One mesh axis, ``"data"``, spans every device of every process; batches are sharded along it
and parameters are replicated. Single-process runs need nothing; multi-host runs call
`initialize()` first (before any other JAX call), either with explicit coordinates or with
what the cluster environment provides (TPU pods, SLURM, ...).
"""
from __future__ import annotations

from typing import Optional

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None, timeout_s: int = 300) -> None:
  """Starts jax.distributed; a no-op when nothing asks for it (single process)."""
  if coordinator_address is None and num_processes is None:
    return
  kw = {}
  if coordinator_address and coordinator_address.startswith("127.0.0.1"):
    kw["coordinator_bind_address"] = coordinator_address  # never bind all interfaces locally
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id,
                             initialization_timeout=timeout_s, **kw)


def data_mesh() -> Mesh:
  """A 1-D mesh over all devices (all processes) with classic (Auto) sharding semantics."""
  return jax.make_mesh((jax.device_count(),), (DATA_AXIS,), axis_types=(AxisType.Auto,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(mesh: Mesh, local: dict[str, np.ndarray]) -> dict[str, jax.Array]:
  """Turns each process's local batch into one global array sharded along the data axis."""
  sharding = batch_sharding(mesh)
  n_local = jax.local_device_count()
  for k, v in local.items():
    if v.shape[0] % n_local:
      raise ValueError(f"Local batch of {v.shape[0]} ({k!r}) does not divide over "
                       f"{n_local} local devices; choose batch_size as a multiple of "
                       f"{jax.device_count()}.")
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local.items()}
