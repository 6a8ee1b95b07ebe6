"""Checksum sidecars: ``<file>.xxh128`` / ``<file>.sha256`` beside a checkpoint, written before
it is renamed into place and compared when it is read (``sha256sum -c`` / ``xxh128sum -c`` check
them too). The digests themselves are :mod:`hookloop.fileio.hashing`'s.

The verdict depends on what is on disk, never on what is installed:

* **every** sidecar beside a file is checked, and each must agree: a stale digest is never
  skipped in favour of one that matches;
* a sidecar that is not a regular file (a symbolic link, a directory) is refused, whatever
  sits beside it;
* the file name a sidecar's line names must be the file's own;
* a sidecar whose hash cannot be computed here (``.xxh128`` without the ``xxhash`` package)
  is refused with one line naming the package to install (:class:`HashPackageMissingError`),
  and the file is left alone: it is not damaged as far as anyone knows.
"""
import os
import stat

from ..errors import CheckpointError
from ..fileio import hashing
from ..fileio import storage
from . import atomic

CHECKSUM_SUFFIX = '.sha256'  # the SHA-256 sidecar (every sidecar before XXH128 came)
CHECKSUM_SUFFIXES = tuple(hashing.SUFFIXES.values())  # every kind of sidecar (see hookloop.fileio.hashing)


class UnverifiedCheckpointError(CheckpointError):
    """A checkpoint that cannot be checked (no valid checksum, or none this installation can
    compute): not damaged as far as anyone knows, so ``--resume auto`` never renames it aside."""


class HashPackageMissingError(UnverifiedCheckpointError):
    """A sidecar whose hash needs a package that is not installed (``xxhash``)."""


def file_checksum(path, chunk=1 << 22, algorithm='sha256'):
    """The digest of a file's bytes (SHA-256 unless ``algorithm`` says otherwise), as hex."""
    with storage.open_read(path) as f:
        return hashing.digest_stream(f, algorithm, chunk)


def checksum_path(path, algorithm=None):
    """The sidecar of ``path`` for ``algorithm`` (default: the one new checkpoints get,
    :func:`hookloop.fileio.hashing.default_algorithm`): ``<path>.xxh128`` or ``<path>.sha256``."""
    return path + hashing.SUFFIXES[algorithm or hashing.default_algorithm()]


def sidecar_state(sidecar):
    """``'file'``, ``'missing'`` or a description of what else is there (a directory, a
    symlink, a device): only a regular file (no symlink, for a local path) is a checksum."""
    if storage.is_url(sidecar):
        return 'file' if storage.isfile(sidecar) else 'missing'
    try:
        mode = os.lstat(sidecar).st_mode
    except FileNotFoundError:
        return 'missing'
    except OSError as exc:
        return f'unreadable ({exc.strerror})'
    if stat.S_ISREG(mode):
        return 'file'
    return 'a symbolic link' if stat.S_ISLNK(mode) else 'a directory' if stat.S_ISDIR(mode) else 'not a regular file'


def write_checksum(path, digest, algorithm='sha256'):
    """The sidecar ``checksum_path(path, algorithm)``, ``<hex>  <name>`` as ``sha256sum`` /
    ``xxh128sum`` write it (``-c`` checks it), atomically.

    Written *before* the checkpoint is renamed into place: a kill between the two leaves
    a checksum for a file that is not there yet, never a checkpoint without its checksum."""
    sidecar = checksum_path(path, algorithm)
    line = hashing.sidecar_line(digest, storage.basename(path))
    atomic.commit(atomic.write_temporary(sidecar, lambda f: f.write(line)), sidecar)


def remove_other_checksums(path, algorithm):
    """After a save with ``algorithm``: drop the sidecars an earlier file at ``path`` had."""
    for other, suffix in hashing.SUFFIXES.items():
        if other != algorithm and sidecar_state(path + suffix) != 'missing':
            try:
                if storage.is_url(path):
                    storage.remove(path + suffix)
                else:
                    os.remove(path + suffix)
            except OSError:
                pass


def verify_checksum(path):
    """Compare ``path`` with every sidecar beside it. Returns False when there is none (a file
    hookloop did not write, e.g. a plain ``torch.save``); CheckpointError on a mismatch or a
    sidecar that cannot be trusted (see the module's rules). :func:`hookloop.checkpoint.format.load_checkpoint`
    verifies while it reads instead."""
    expected = expected_checksums(path)
    if not expected:
        return False
    with storage.open_read(path) as f:
        compare(path, expected, hashing.digest_stream(f, tuple(a for a, _, _ in expected)))
    return True


def expected_checksums(path):
    """``[(algorithm, sidecar, hex digest)]`` of every sidecar beside ``path`` (empty without
    one). Refuses, before any byte of ``path`` is read: a sidecar that is not a regular file
    (:class:`UnverifiedCheckpointError`), one that is damaged or names another file
    (CheckpointError), one whose hash this installation cannot compute
    (:class:`HashPackageMissingError`)."""
    found = []
    for algorithm, suffix in hashing.SUFFIXES.items():
        sidecar = path + suffix
        state = sidecar_state(sidecar)
        if state == 'missing':
            continue
        if state != 'file':
            raise UnverifiedCheckpointError(
                f'{path!r} has no valid checksum (its {storage.basename(sidecar)} is {state}; a checksum must be a '
                'regular file): refusing it, whatever other sidecar sits beside it')
        try:
            digest, name = hashing.parse_sidecar(storage.read_bytes(sidecar))
        except (OSError, IndexError, ValueError):  # UnicodeDecodeError is a ValueError
            raise CheckpointError(f'{sidecar!r}, the checksum of {path!r}, is damaged') from None
        if name != storage.basename(path):
            raise CheckpointError(f'{sidecar!r} is the checksum of {name!r}, not of {storage.basename(path)!r}: '
                                  'the file was renamed or swapped with another one')
        found.append((algorithm, sidecar, digest))
    for algorithm, sidecar, _ in found:
        if not hashing.available(algorithm):
            package = hashing.PACKAGES[algorithm]
            raise HashPackageMissingError(
                f'{path!r} has an {hashing.NAMES[algorithm]} checksum ({storage.basename(sidecar)}) and the {package} '
                f'package is not installed to check it: pip install {package} (the file was left as it is)')
    return found


def compare(path, expected, actual):
    """CheckpointError naming ``path`` and the first sidecar whose digest differs from
    ``actual`` (``{algorithm: hex}``): each of them must agree."""
    for algorithm, sidecar, digest in expected:
        if actual[algorithm] != digest:
            raise CheckpointError(f'{path!r} is damaged: its {hashing.NAMES[algorithm]} does not match '
                                  f'{storage.basename(sidecar)} (changed or corrupted after it was written)')
