"""Checksum sidecars: ``<file>.xxh128`` / ``<file>.sha256`` beside a checkpoint, written before
it is renamed into place and compared when it is read (``sha256sum -c`` / ``xxh128sum -c`` check
them too). The digests themselves are :mod:`hookloop.fileio.hashing`'s.
"""
import os

from ..errors import CheckpointError
from ..fileio import hashing
from ..fileio import storage
from . import atomic

CHECKSUM_SUFFIX = '.sha256'  # the SHA-256 sidecar (every sidecar before XXH128 came)
CHECKSUM_SUFFIXES = tuple(hashing.SUFFIXES.values())  # every kind of sidecar (see hookloop.fileio.hashing)


def file_checksum(path, chunk=1 << 22, algorithm='sha256'):
    """The digest of a file's bytes (SHA-256 unless ``algorithm`` says otherwise), as hex."""
    with storage.open_read(path) as f:
        return hashing.digest_stream(f, algorithm, chunk)


def checksum_path(path, algorithm=None):
    """The sidecar of ``path`` for ``algorithm`` (default: the one new checkpoints get,
    :func:`hookloop.fileio.hashing.default_algorithm`): ``<path>.xxh128`` or ``<path>.sha256``."""
    return path + hashing.SUFFIXES[algorithm or hashing.default_algorithm()]


def find_checksum(path):
    """``(algorithm, sidecar path)`` of the sidecar beside ``path``, or None when it has none.
    The current algorithm's sidecar is looked for first."""
    first = hashing.default_algorithm()
    for algorithm in [first] + [a for a in hashing.SUFFIXES if a != first]:
        sidecar = path + hashing.SUFFIXES[algorithm]
        if storage.isfile(sidecar):
            return algorithm, sidecar
    return None


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
        if other != algorithm and storage.isfile(path + suffix):
            try:
                if storage.is_url(path):
                    storage.remove(path + suffix)
                else:
                    os.remove(path + suffix)
            except OSError:
                pass


def verify_checksum(path):
    """Compare ``path`` with its sidecar (``.xxh128`` or ``.sha256``). Returns False when there
    is no sidecar (a file hookloop did not write, e.g. a plain ``torch.save``); CheckpointError
    on a mismatch. :func:`hookloop.checkpoint.format.load_checkpoint` verifies while it reads instead."""
    expected = expected_checksum(path)
    if expected is None:
        return False
    algorithm, sidecar, digest = expected
    compare(path, sidecar, algorithm, digest, file_checksum(path, algorithm=algorithm))
    return True


def expected_checksum(path):
    """``(algorithm, sidecar, hex digest)`` from the sidecar of ``path``, None without one."""
    found = find_checksum(path)
    if found is None:
        return None
    algorithm, sidecar = found
    try:
        digest = hashing.parse_sidecar(storage.read_bytes(sidecar))
    except (OSError, IndexError, ValueError):  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f'{sidecar!r}, the checksum of {path!r}, is damaged') from None
    if not hashing.available(algorithm):
        raise CheckpointError(f'{path!r} has an {hashing.NAMES[algorithm]} checksum ({storage.basename(sidecar)}) '
                              'and the xxhash package is not installed to check it: pip install xxhash '
                              '(or load it with verify=False)')
    return algorithm, sidecar, digest


def compare(path, sidecar, algorithm, expected, actual):
    """CheckpointError naming ``path`` and its sidecar when the digests differ."""
    if actual != expected:
        raise CheckpointError(f'{path!r} is damaged: its {hashing.NAMES[algorithm]} does not match '
                              f'{storage.basename(sidecar)} (changed or corrupted after it was written)')
