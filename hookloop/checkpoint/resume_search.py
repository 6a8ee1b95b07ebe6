"""``--resume auto``: the newest checkpoint of a work dir that loads and verifies.

The pointer's target is tried first; when it is damaged (zero bytes, truncated, a flipped
byte, missing), the other checkpoints of the work dir are tried from the newest back.
Every skipped file is logged with the reason and renamed aside (``iter_9.pth.damaged``, its
sidecar with it) by rank 0, never deleted: damaged files are evidence, and the resumed run
would otherwise overwrite them under the same name. Symbolic links (and anything whose real
path lies outside the directory listed) are not candidates: the walk-back never continues
another run's lineage. The work dir may be an fsspec URL: the candidates are listed and read
through :mod:`hookloop.fileio.storage`.
"""
import os

from ..fileio import storage

from .atomic import TMP_SUFFIX
from .checksum import CHECKSUM_SUFFIXES, HashPackageMissingError
from .format import POINTER_NAME, inside, load_checkpoint, read_pointer
from ..errors import CheckpointError
from .sharded_files import is_sharded_checkpoint, verify_shard_files
from .integrity import UnverifiedCheckpointError, require_sidecar
from .restore_checks import named_position


def load_verified(path, map_location='cpu', verify_sharded=verify_shard_files):
    """The checkpoint dict at ``path`` (a file, or a sharded directory's ``hookloop.pth``),
    checksums verified; CheckpointError when it is damaged or not a checkpoint.
    ``verify_sharded(path)`` checks a sharded directory (the engine passes
    :func:`hookloop.dist.fsdp.verify_sharded`, which also reads ``.metadata``)."""
    if is_sharded_checkpoint(path):
        return verify_sharded(path)
    checkpoint = load_checkpoint(path, map_location=map_location)
    require_sidecar(path, checkpoint)  # a hookloop checkpoint without its digest is not trusted
    return checkpoint


def _position(path, iters_per_epoch):
    """Where a checkpoint's name says it stands, in iterations (-1 when the name does not say)."""
    named = named_position(path)
    if named is None:
        return -1
    kind, n = named
    return n * iters_per_epoch if kind == 'epoch' else n


def checkpoints_in(directories):
    """Checkpoint files and sharded checkpoint directories in ``directories`` (not recursive)."""
    found = []
    for directory in directories:
        directory = os.fspath(directory)
        if not storage.isdir(directory):
            continue
        for name in sorted(storage.listdir(directory)):
            path = storage.join(directory, name)
            if name.startswith('.') or name.endswith((TMP_SUFFIX,) + CHECKSUM_SUFFIXES) or name == POINTER_NAME \
                    or '.damaged' in name:
                continue
            if storage.is_url(path):  # sharded checkpoints are local-only
                if name.endswith('.pth') and storage.isfile(path):
                    found.append(path)
            elif os.path.islink(path) or not inside(path, directory):
                continue  # iter_9.pth -> ../other/iter_5.pth would continue another run's lineage
            elif (name.endswith('.pth') and os.path.isfile(path)) or is_sharded_checkpoint(path):
                found.append(path)
    return found


DAMAGED_SUFFIX = '.damaged'


def set_aside(path):
    """Rename a damaged checkpoint (and its sidecar) to ``<name>.damaged`` (``.damaged.1``, ...
    when taken); returns the new name, or None when it could not be renamed."""
    for n in range(100):
        target = path + DAMAGED_SUFFIX + (f'.{n}' if n else '')
        if not storage.exists(target):
            break
    else:
        return None
    try:
        if storage.is_url(path):
            storage.move(path, target)
        else:
            os.rename(path, target)
        for suffix in CHECKSUM_SUFFIXES:
            if storage.exists(path + suffix):
                (storage.move if storage.is_url(path) else os.rename)(path + suffix, target + suffix)
    except OSError:
        return None
    return target


def find_resumable(work_dir, directories, iters_per_epoch, logger, map_location='cpu', rename_damaged=False,
                   verify_sharded=verify_shard_files):
    """``(path, checkpoint)`` of the newest good checkpoint (verified by :func:`load_verified`),
    or ``None`` when the work dir has no checkpoint at all. CheckpointError when checkpoints
    exist but none is usable, or when the pointer names a path outside the work dir and ``directories``."""
    work_dir = os.fspath(work_dir)
    pointer = storage.join(work_dir, POINTER_NAME)
    skipped = []
    try:
        target = read_pointer(work_dir, also_inside=directories)
    except CheckpointError as exc:
        if 'outside the work dir' in str(exc):
            raise
        skipped.append((pointer, str(exc)))
        target = None
    others = sorted(checkpoints_in([work_dir, *directories]),
                    key=lambda p: (_position(p, max(iters_per_epoch, 1)), storage.mtime(p)), reverse=True)
    candidates = ([target] if target is not None else []) + [p for p in others if p != target]
    for path in candidates:
        if not storage.exists(path):
            skipped.append((path, f'{POINTER_NAME} names it but it does not exist (moved or deleted?)'))
            continue
        try:
            checkpoint = load_verified(path, map_location, verify_sharded)
        except HashPackageMissingError:
            raise  # every checkpoint of the run has that kind of digest: install the package, touch nothing
        except CheckpointError as exc:
            moved = set_aside(path) if rename_damaged and not isinstance(exc, UnverifiedCheckpointError) else None
            skipped.append((path, str(exc) + (f' (renamed to {storage.basename(moved)})' if moved else '')))
            continue
        meta = checkpoint.get('meta')
        if not isinstance(meta, dict) or not all(isinstance(meta.get(k), int) for k in ('epoch', 'iter', 'inner_iter')):
            skipped.append((path, 'not a hookloop checkpoint (no usable "meta" entry)'))
            continue
        for bad, why in skipped:
            logger.warning('--resume auto: skipped %s: %s', bad, why)
        return path, checkpoint
    if not skipped:
        return None
    reasons = '; '.join(f'{storage.basename(p)}: {why}' for p, why in skipped)
    raise CheckpointError(f'--resume auto: no usable checkpoint in {work_dir} (tried {len(skipped)}: {reasons})')
