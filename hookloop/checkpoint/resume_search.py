"""``--resume auto``: the newest checkpoint of a work dir that loads and verifies.

The pointer's target is tried first; when it is damaged (zero bytes, truncated, a flipped
byte, missing), the other checkpoints of the work dir are tried from the newest back, newest
by what they record, never by their names: the run that wrote them (``meta['run']``: when its
lineage of resumes began, its count in it, its start), then the position in that run. A resume
that re-based the iteration counter (another batch size) reaches names an older run used, and
the newer run is the one to continue.
Every skipped file is logged with the reason and renamed aside (``iter_9.pth.damaged``, its
sidecar with it) by rank 0, never deleted: damaged files are evidence, and the resumed run
would otherwise overwrite them under the same name. Symbolic links (and anything whose real
path lies outside the directory listed) are not candidates: the walk-back never continues
another run's lineage. The work dir may be an fsspec URL: the candidates are listed and read
through :mod:`hookloop.fileio.storage`.
"""
import os

import torch

from ..fileio import storage

from .atomic import TMP_SUFFIX
from .checksum import CHECKSUM_SUFFIXES, HashPackageMissingError
from .format import POINTER_NAME, inside, load_checkpoint, read_pointer
from ..errors import CheckpointError
from .sharded_files import META_FILE, is_sharded_checkpoint, verify_shard_files
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


UNREADABLE = 'unreadable'


def recorded_order(path):
    """What a checkpoint records to order candidates by, from ``meta['run']`` (see
    ``hookloop/engine/run_lineage.py``): ``(lineage start, run count, run start, iteration)``;
    None when it records no run (an older hookloop's, a foreign file), :data:`UNREADABLE` when
    it cannot be read at all.

    Only ``meta`` is needed, so a local file is read with ``mmap`` (its tensors are not loaded);
    a URL is read whole. The file is verified later, when it is tried."""
    source = os.path.join(path, META_FILE) if is_sharded_checkpoint(path) else path
    try:
        if storage.is_url(source):
            checkpoint = load_checkpoint(source, verify=False)
        else:
            checkpoint = torch.load(source, map_location='cpu', weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - damaged: tried first, to be reported and set aside
        return UNREADABLE
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    run = meta.get('run') if isinstance(meta, dict) else None
    if not isinstance(run, dict):
        return None
    key = (run.get('first_started'), run.get('count'), run.get('started'), meta.get('iter'))
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in key):
        return None
    return key


def _newest_first(paths, iters_per_epoch):
    """``paths`` in the order a walk-back tries them: the unreadable ones first (they are reported
    and set aside), then from the newest by what they record (:func:`recorded_order`), then those
    that record no run, by the position in their name and their modification time."""
    recorded = {path: recorded_order(path) for path in paths}
    unreadable = [p for p in paths if recorded[p] == UNREADABLE]
    known = sorted((p for p in paths if recorded[p] not in (None, UNREADABLE)), key=recorded.get, reverse=True)
    others = sorted((p for p in paths if recorded[p] is None),
                    key=lambda p: (_position(p, max(iters_per_epoch, 1)), storage.mtime(p)), reverse=True)
    return unreadable + known + others


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

    def candidates():  # the others are listed (and their meta read) only when the pointer's target fails
        if target is not None:
            yield target
        yield from (p for p in _newest_first(checkpoints_in([work_dir, *directories]), iters_per_epoch) if p != target)
    for path in candidates():
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
        if target is None and not skipped:
            logger.warning('--resume auto: %s has no %s pointer: continuing from %s, the newest checkpoint by the '
                           'run and position it records', work_dir, POINTER_NAME, path)
        return path, checkpoint
    if not skipped:
        return None
    reasons = '; '.join(f'{storage.basename(p)}: {why}' for p, why in skipped)
    raise CheckpointError(f'--resume auto: no usable checkpoint in {work_dir} (tried {len(skipped)}: {reasons})')
