"""When a checkpoint must carry its digest: the policy around :mod:`hookloop.checkpoint.format`'s checksums.

Every checkpoint hookloop writes has one: ``<file>.sha256`` beside a file checkpoint, and in
a sharded directory ``shards.sha256`` (every shard and ``.metadata``), whose own digest is
recorded inside ``hookloop.pth`` (itself with a sidecar). Removing a digest must not switch
the check off, so a hookloop checkpoint (a dict with a ``meta`` entry, or any sharded
directory) whose digest is missing, or is not a regular file, is refused, in one line.

Checkpoints written before hookloop recorded digests can still be resumed with the
environment variable ``HOOKLOOP_ALLOW_UNVERIFIED=1`` (a warning says so, per file).
"""
import os
import warnings

from ..fileio import storage
from .checksum import CHECKSUM_SUFFIXES, UnverifiedCheckpointError, checksum_path, sidecar_state

SWITCH = 'HOOKLOOP_ALLOW_UNVERIFIED'


def unverified_allowed():
    return os.environ.get(SWITCH, '').strip().lower() in ('1', 'true', 'yes')


def missing(path, what):
    """``path``'s digest ``what`` is missing: an error, or with the switch a warning."""
    if unverified_allowed():
        warnings.warn(f'{path}: {what}; resuming without an integrity check ({SWITCH} is set)', stacklevel=3)
        return
    raise UnverifiedCheckpointError(f'{path!r} has no valid checksum ({what}): it cannot be checked for damage. '
                                    f'A checkpoint from an older hookloop can be resumed with {SWITCH}=1')


def check_sidecar(path):
    """Refuse (or with the switch, warn about) ``path`` when it has no sidecar (``.xxh128``,
    ``.sha256``) or one that is not a regular file (whatever sits beside it)."""
    states = {suffix: sidecar_state(path + suffix) for suffix in CHECKSUM_SUFFIXES}
    odd = next(((s, v) for s, v in states.items() if v not in ('file', 'missing')), None)
    if odd is None and 'file' in states.values():
        return
    suffix, state = odd or (checksum_path(path)[len(path):], 'missing')
    missing(path, f'its {storage.basename(path + suffix)} is {state}')


def require_sidecar(path, checkpoint):
    """Refuse a hookloop file checkpoint (it has a ``meta`` dict) whose checksum sidecar is
    missing or not a regular file (called after the load verified a present sidecar)."""
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get('meta'), dict):
        return  # not a hookloop checkpoint (plain weights): nothing says it had a digest
    check_sidecar(path)
