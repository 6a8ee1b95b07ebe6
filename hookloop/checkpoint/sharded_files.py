"""The files of a sharded (FSDP / DCP) checkpoint directory, checked without torch.distributed.

A sharded checkpoint is a directory: the ``*.distcp`` shards and ``.metadata`` that
``torch.distributed.checkpoint`` writes, ``shards.sha256`` (the SHA-256 of each, ``sha256sum``
format) and ``hookloop.pth`` (everything else, with the manifest's own digest). Writing the shards
is :mod:`hookloop.dist.fsdp`'s; recognising the directory and verifying its files is here, so
resume search needs no process group. Reading ``.metadata`` needs DCP's classes: that is
:mod:`hookloop.dist.dcp_metadata`'s.
"""
import os
import stat

from ..errors import CheckpointError
from . import integrity
from .atomic import atomic_write
from .checksum import file_checksum
from .format import load_checkpoint

META_FILE = 'hookloop.pth'
METADATA_FILE = '.metadata'  # DCP's index of the shards
SHARD_CHECKSUMS = 'shards.sha256'
MANIFEST_DIGEST = 'shards_digest'  # the key in hookloop.pth that holds shards.sha256's own digest
MAX_METADATA_BYTES = 256 << 20  # a .metadata larger than this is refused unread
SHARD_SLACK = 1 << 20  # bytes a shard file may hold beyond its last storage entry (DCP writes none)


def read_regular_file(path, limit, what):
    """The bytes of ``path``, a regular file (not a symlink, FIFO or device) of at most
    ``limit`` bytes; CheckpointError otherwise. Never blocks on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_NONBLOCK', 0))
    except OSError as exc:
        if os.path.islink(path):
            raise CheckpointError(f'{what} {path!r} is a symbolic link: refusing to follow it out of the '
                                  'checkpoint') from None
        raise CheckpointError(f'cannot read {what} {path!r}: {exc.strerror or exc}') from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f'{what} {path!r} is not a regular file')
        if info.st_size > limit:
            raise CheckpointError(f'{what} {path!r} is {info.st_size} bytes, more than the {limit} a '
                                  'checkpoint of this kind can hold: refusing to read it')
        with os.fdopen(fd, 'rb', closefd=False) as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)


def is_sharded_checkpoint(path):
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, META_FILE))


def _shard_files(path):
    return sorted(name for name in os.listdir(path) if name.endswith('.distcp') or name == METADATA_FILE)


def write_shard_checksums(path):
    """``<path>/shards.sha256``: the checksum of every file DCP wrote (rank 0, after the shards).
    Returns the manifest's own checksum (recorded in ``hookloop.pth``)."""
    lines = ''.join(f'{file_checksum(os.path.join(path, name))}  {name}\n' for name in _shard_files(path))
    atomic_write(os.path.join(path, SHARD_CHECKSUMS), lambda f: f.write(lines.encode()))
    return file_checksum(os.path.join(path, SHARD_CHECKSUMS))


def _read_manifest(path, manifest):
    """``{file name: digest}`` from ``shards.sha256``; only plain names of shard files
    (``*.distcp``, ``.metadata``) directly inside ``path``."""
    try:
        text = read_regular_file(manifest, 16 << 20, 'shard checksum list').decode('ascii')
        expected = {}
        for line in text.splitlines():
            if line.strip():
                digest, name = line.split(None, 1)
                expected[name.strip().lstrip('*')] = digest.lower()
    except (UnicodeDecodeError, ValueError):
        raise CheckpointError(f'{manifest!r} is damaged') from None
    for name in expected:
        if name != METADATA_FILE and not (name.endswith('.distcp') and os.path.basename(name) == name
                                          and name not in ('.', '..') and '\\' not in name):
            raise CheckpointError(f'{manifest!r} lists {name!r}, which is not a shard file inside the checkpoint '
                                  'directory: refusing it')
    return expected


def verify_shard_files(path, shard_sizes=None):
    """Check the files of a sharded checkpoint directory without running anything from it:
    ``hookloop.pth`` with ``weights_only`` (and its sidecar), the manifest against the digest
    ``hookloop.pth`` records, every shard file against the manifest. Returns ``hookloop.pth``'s
    dict; CheckpointError names what is wrong.

    ``shard_sizes(path)``, when given, is called once ``.metadata`` has matched its digest and
    returns ``{shard file name: the bytes its storage entries span}``: a listed file larger than
    that (by more than :data:`SHARD_SLACK`) is refused before it is hashed, so a huge file named
    in the manifest costs nothing. :func:`hookloop.dist.fsdp.verify_sharded` passes it (reading
    ``.metadata`` needs DCP's classes)."""
    if not is_sharded_checkpoint(path):
        raise CheckpointError(f'{path!r} is not a sharded hookloop checkpoint (no {META_FILE} inside)')
    meta_file = os.path.join(path, META_FILE)
    if os.path.islink(meta_file):
        raise CheckpointError(f'{meta_file!r} is a symbolic link: refusing to follow it out of the checkpoint')
    rest = load_checkpoint(meta_file)
    integrity.check_sidecar(meta_file)
    manifest = os.path.join(path, SHARD_CHECKSUMS)
    recorded = rest.get(MANIFEST_DIGEST)
    if integrity.sidecar_state(manifest) != 'file':
        integrity.missing(path, f'its {SHARD_CHECKSUMS} is {integrity.sidecar_state(manifest)}')
        return rest
    if recorded is not None and file_checksum(manifest) != str(recorded).lower():
        raise CheckpointError(f'{manifest!r} is damaged: its SHA-256 does not match the one {META_FILE} records')
    if recorded is None:
        integrity.missing(path, f'{META_FILE} records no digest of {SHARD_CHECKSUMS} (an older checkpoint)')
    expected = _read_manifest(path, manifest)
    names = sorted(set(expected) | set(_shard_files(path)), key=lambda name: name != METADATA_FILE)
    limits = None
    for name in names:  # .metadata first: what it says bounds the other files
        if name != METADATA_FILE and limits is None and shard_sizes is not None:
            limits = shard_sizes(path)
        limit = MAX_METADATA_BYTES if name == METADATA_FILE else None if limits is None else \
            limits.get(name, 0) + SHARD_SLACK
        _check_listed_file(path, name, expected, limit)
    return rest


def _check_listed_file(path, name, expected, limit):
    """``name`` is listed, a regular file of at most ``limit`` bytes, and matches its digest."""
    file = os.path.join(path, name)
    if name not in expected:
        raise CheckpointError(f'{file!r} is not listed in {SHARD_CHECKSUMS}: not part of this checkpoint')
    state = integrity.sidecar_state(file)
    if state == 'missing':
        raise CheckpointError(f'{file!r} is missing from the sharded checkpoint')
    if state != 'file':
        raise CheckpointError(f'{file!r} is {state}, not a shard file: refusing it')
    size = os.lstat(file).st_size
    if limit is not None and size > limit:
        raise CheckpointError(f'{file!r} is {size} bytes, more than the {limit} its metadata accounts for: '
                              'refusing to hash it')
    if file_checksum(file) != expected[name]:
        raise CheckpointError(f'{file!r} is damaged: its SHA-256 does not match {SHARD_CHECKSUMS}')
