"""Matching archive members to the images a list asks for, each exactly once."""
from __future__ import annotations

from typing import Callable, Hashable, Iterable, Iterator, Mapping, Optional

from tfds_fi_imagenet import archives, images


def index_members(names: Iterable[str], key_of: Callable[[str], Optional[Hashable]],
                  where: str) -> dict[Hashable, str]:
  """{key: member name} for every member that `key_of` maps to a key.

  Raises:
    ValueError: when two members map to the same key (e.g. the same image twice).
  """
  index: dict[Hashable, str] = {}
  for name in names:
    key = key_of(name)
    if key is None:
      continue
    if key in index:
      raise ValueError(f"{where} holds the same image twice: {index[key]!r} and {name!r}. "
                       "Remove one of them.")
    index[key] = name
  return index


def raise_if_missing(wanted: Iterable[Hashable], found: Iterable[Hashable],
                     describe: Callable[[Hashable], str], where: str) -> None:
  """FileNotFoundError listing (up to 5 of) the wanted keys absent from `found`."""
  found = set(found)
  missing = [k for k in wanted if k not in found]
  if missing:
    shown = "; ".join(describe(k) for k in missing[:5])
    more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
    raise FileNotFoundError(f"{len(missing)} listed image(s) are missing from {where}: "
                            f"{shown}{more}. Check that the archive is complete.")


def iter_wanted(archive: archives.ImageArchive, key_of: Callable[[str], Optional[Hashable]],
                wanted: Iterable[Hashable], describe: Callable[[Hashable], str],
                index: Optional[Mapping[Hashable, str]] = None,
                ) -> Iterator[tuple[Hashable, str, bytes]]:
  """(key, member name, checked image bytes) for each wanted key, each exactly once.

  Random-access archives read only the wanted members (via `index`, computed when not
  given), in storage order; compressed tars are streamed once. Callers key examples by
  `key`, so the yield order does not matter. Missing keys raise FileNotFoundError and
  duplicate members ValueError, both naming the files.
  """
  wanted = list(wanted)
  wanted_set = set(wanted)
  where = str(archive.path)
  if archive.random_access:
    if index is None:
      index = index_members(archive.names(), key_of, where)
    raise_if_missing(wanted, index, describe, where)
    for key in sorted(wanted, key=lambda k: archive.position(index[k])):
      name = index[key]
      yield key, name, images.checked_image(archive.read(name), f"{name} in {where}")
    return
  seen: dict[Hashable, str] = {}
  for name, data in archive.iter_files():
    key = key_of(name)
    if key is None or key not in wanted_set:
      continue
    if key in seen:
      raise ValueError(f"{where} holds the same image twice: {seen[key]!r} and {name!r}. "
                       "Remove one of them.")
    seen[key] = name
    yield key, name, images.checked_image(data, f"{name} in {where}")
  raise_if_missing(wanted, seen, describe, where)


def suffix_key(wanted_paths: Iterable[str]) -> Callable[[str], Optional[str]]:
  """Maps an archive member to the wanted relative path it ends with (or None).

  Lets a builder find `a/b.jpg` whether the archive stores it as `a/b.jpg`,
  `dataset/a/b.jpg` or `images_largescale/dataset/a/b.jpg`.
  """
  wanted = set(wanted_paths)

  def key_of(name: str) -> Optional[str]:
    parts = name.split("/")
    for i in range(len(parts)):
      cand = "/".join(parts[i:])
      if cand in wanted:
        return cand
    return None
  return key_of
