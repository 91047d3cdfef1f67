"""Process and device setup: jax.distributed, the data mesh, global batches.

One mesh axis, ``"data"``, spans every device of every process; batches are sharded along it
and parameters are replicated. Single-process runs need nothing; multi-host runs call
`initialize()` first (before any other JAX call), either with explicit coordinates or with
what the cluster environment provides (TPU pods, SLURM, ...).
"""
from __future__ import annotations

import json
from typing import Any, Optional

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

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


def rows_sharding(mesh: Mesh) -> NamedSharding:
  """Rows split over every device of `mesh` (all its axes): how batches go in and how the
  extracted rows come out, so that each process holds only its own rows."""
  names = tuple(mesh.axis_names)
  return NamedSharding(mesh, P(names[0] if len(names) == 1 else names))


def local_rows(x: jax.Array) -> np.ndarray:
  """This process's rows of an array split along its first axis: its addressable shards in
  row order (one replica of each), copied to the host. Nothing of other processes is read."""
  shards = {}
  for s in x.addressable_shards:
    start = (s.index[0].start or 0) if s.index else 0
    shards.setdefault(start, s)   # a replicated shard once
  return np.concatenate([np.asarray(jax.device_get(shards[k].data)) for k in sorted(shards)])


def all_agree(flag: bool) -> bool:
  """Whether `flag` is true on every process (all must take the same branch)."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(multihost_utils.process_allgather(np.int32(bool(flag))).min())


def agree_min(n: int) -> int:
  """The smallest value of `n` over all processes."""
  if jax.process_count() == 1:
    return int(n)
  return int(multihost_utils.process_allgather(np.int64(n)).min())


def sync(name: str) -> None:
  """A barrier across all processes (a no-op with one)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def _identity(x):
  return x


def _process_mesh() -> Mesh:
  """One device per process (its first local device): a gather through it moves each row once
  per process, not once per device."""
  devices = [min((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id)
             for p in range(jax.process_count())]
  return Mesh(np.asarray(devices), ("process",))


def allgather_rows(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Every process's rows of a set on every process: {key: rows of process 0, 1, ...}
  concatenated (each process's part padded to the longest for the collective, padding
  dropped again). Used where every process needs the whole set (the big_vision evaluator)."""
  if jax.process_count() == 1:
    return dict(arrays)
  with jax.transfer_guard("allow"):   # an explicit gather (train.py disallows implicit moves)
    return _allgather_rows(arrays)


def _allgather_rows(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  counts = multihost_utils.process_allgather(np.int64(len(next(iter(arrays.values())))))
  counts = [int(c) for c in np.asarray(counts).reshape(-1)]
  width = max(counts)
  mesh = _process_mesh()
  sharding = NamedSharding(mesh, P("process"))
  mine = mesh.devices.reshape(-1)[jax.process_index()]
  gather = jax.jit(_identity, out_shardings=NamedSharding(mesh, P()))
  out = {}
  for k in sorted(arrays):   # the same order on every process
    v = np.asarray(arrays[k])
    padded = np.zeros((width, *v.shape[1:]), v.dtype)
    padded[:len(v)] = v
    g = jax.make_array_from_single_device_arrays(
        (width * len(counts), *v.shape[1:]), sharding, [jax.device_put(padded, mine)])
    full = np.asarray(jax.device_get(gather(g).addressable_data(0)))
    out[k] = np.concatenate([full[i * width:i * width + c] for i, c in enumerate(counts)]
                            ).astype(v.dtype, copy=False)   # (int64 ids with x64 off)
  return {k: out[k] for k in arrays}


def _plain(x: Any) -> Any:
  """numpy / jax scalars and arrays as Python numbers and lists (for json.dumps)."""
  return x.tolist() if hasattr(x, "tolist") else str(x)


def broadcast_json(obj: Any) -> Any:
  """Process 0's `obj` (JSON-able, numpy values allowed) on every process, as JSON gives it
  back (tuples become lists); the other processes pass anything."""
  if jax.process_count() == 1:
    return obj
  blob = np.frombuffer(json.dumps(obj, default=_plain).encode(), np.uint8) if jax.process_index() == 0 else None
  n = int(multihost_utils.broadcast_one_to_all(np.int64(0 if blob is None else len(blob))))
  buf = blob if blob is not None else np.zeros(n, np.uint8)
  return json.loads(bytes(np.asarray(multihost_utils.broadcast_one_to_all(buf))).decode())
