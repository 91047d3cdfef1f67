"""The archives the downloading builders fetch: from `--manual_dir` when present there, else
downloaded; and a fast check that the network is there before TFDS's download retries start.

Every downloading builder lists its archives in `ARCHIVES` (or `archives()` per config).
`fetch` is what a builder's `_split_generators` calls: an archive whose file name is in the
manual dir is taken from there and checked against the recorded checksum (the publisher's MD5
where one is published, else the SHA-256 in the builder's `checksums.tsv`); otherwise TFDS's
download manager downloads it (or finds it in its download cache).

`require_network` is what `build_dataset` calls before preparing: when an archive is neither in
the manual dir nor in the download cache and its host does not answer within a few seconds, it
raises one FileNotFoundError naming every file to fetch, where from, and where to put it
(TFDS's own downloader would retry for minutes and end in a traceback).
"""
from __future__ import annotations

import dataclasses
import hashlib
import urllib.parse
from typing import Optional, Sequence

from etils import epath

from tfds_fi_imagenet import images

PROBE_TIMEOUT_S = 4.0


@dataclasses.dataclass(frozen=True)
class Archive:
  """One file a builder downloads."""
  url: str
  filename: str
  md5: Optional[str] = None   # the publisher's MD5; None: the SHA-256 in checksums.tsv applies

  def checksum_note(self) -> str:
    return "its published MD5" if self.md5 else "the SHA-256 in the builder's checksums.tsv"


def manual_dir_of(dl_manager) -> Optional[epath.Path]:
  """The download manager's manual dir, or None when there is none (or it is empty)."""
  try:
    return epath.Path(dl_manager.manual_dir)
  except (AssertionError, ValueError, AttributeError):
    return None


def _sha256(path: epath.Path, chunk: int = 1 << 22) -> tuple[int, str]:
  h, size = hashlib.sha256(), 0
  with path.open("rb") as f:
    while block := f.read(chunk):
      h.update(block)
      size += len(block)
  return size, h.hexdigest()


def verify(path: epath.PathLike, archive: Archive, registered_sha256: Optional[str], what: str,
           verify_md5: bool = True) -> None:
  """Checks a file against the archive's published MD5 or its registered SHA-256.

  Raises:
    ValueError: naming the file, the expected and the computed checksum.
  """
  path = epath.Path(path)
  if archive.md5:
    if verify_md5:
      images.verify_md5(path, archive.md5, what)
    return
  if registered_sha256:
    _, got = _sha256(path)
    if got != registered_sha256:
      raise ValueError(
          f"{what}: SHA-256 of {path} is {got}, the registered one (checksums.tsv) is "
          f"{registered_sha256}. The file is damaged or another release; fetch it again from "
          f"{archive.url}.")


def _registered_sha256(builder, url: str) -> Optional[str]:
  infos = type(builder).url_infos or {}
  info = infos.get(url)
  return info.checksum if info else None


def fetch(builder, dl_manager, archive: Archive, *, verify_md5: bool = True) -> epath.Path:
  """Local path of `archive`: `<manual dir>/<filename>` if it is there (checked against the
  recorded checksum), else TFDS's download (cached, checksum-checked)."""
  manual = manual_dir_of(dl_manager)
  what = f"{builder.name}: {archive.filename}"
  if manual is not None and (manual / archive.filename).exists():
    path = manual / archive.filename
    verify(path, archive, _registered_sha256(builder, archive.url), what, verify_md5)
    return path
  # a download: TFDS checks the SHA-256 of checksums.tsv itself, the MD5 is checked here
  path = epath.Path(dl_manager.download(archive.url))
  verify(path, archive, None, what, verify_md5)
  return path


def _cached(download_dir: epath.Path, dataset_name: str, archive: Archive,
            registered: Optional[str]) -> bool:
  """Whether TFDS's download manager would find `archive` in its cache (no network)."""
  from tensorflow_datasets.core.download import resource as resource_lib
  names = [resource_lib.get_dl_fname(archive.url)]
  if registered:
    names.append(resource_lib.get_dl_fname(archive.url, registered))
  return any(resource_lib.is_locally_cached(folder / n)
             for folder in (download_dir / dataset_name, download_dir) for n in names)


def unreachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> Optional[str]:
  """None when the url's server answers (any HTTP status) within `timeout` seconds, else why
  not. Honours the proxy environment variables as the download itself does (requests)."""
  import requests
  try:
    requests.head(url, timeout=(timeout, timeout), allow_redirects=False).close()
  except requests.RequestException as e:
    reason = str(e).split("(Caused by", 1)[-1].strip(" )")
    return f"{type(e).__name__}: {reason[:160]}"
  return None


def require_network(builder, archives: Sequence[Archive], *, manual_dir: Optional[str],
                    download_dir: epath.PathLike) -> None:
  """Raises one FileNotFoundError when an archive must be downloaded and its host is not
  reachable; does nothing when every archive is in the manual dir or the download cache."""
  needed = []
  for a in archives:
    if manual_dir and (epath.Path(manual_dir) / a.filename).exists():
      continue
    if _cached(epath.Path(download_dir), builder.name, a, _registered_sha256(builder, a.url)):
      continue
    needed.append(a)
  hosts: dict[str, Optional[str]] = {}
  failed = []
  for a in needed:
    host = urllib.parse.urlsplit(a.url).netloc
    if host not in hosts:
      hosts[host] = unreachable(a.url)
    if hosts[host]:
      failed.append((a, hosts[host]))
  if failed:
    files = "; ".join(f"{a.filename} from {a.url} (checked against {a.checksum_note()})"
                      for a, _ in failed)
    reason = failed[0][1]
    raise FileNotFoundError(
        f"{builder.name}: cannot download without network ({reason}). Fetch {files} on a "
        f"machine with internet and pass the folder that holds it as --manual_dir "
        f"(python -m tfds_fi_imagenet build {builder.name} --manual_dir=DIR ...).")
