"""The gate every file that holds trained weights passes: checkpoints (sync, async, sharded's
metadata, best, preemption), safetensors exports, DreamBooth / LoRA pipelines, ModelScope's
``output/``, MMCV's ``save_checkpoint``.

Its rules, the same for every writer:

1. **Finite.** The trained numbers the file will hold are checked first
   (:mod:`hookloop.checkpoint.finite_state`; values non-finite by design pass through the
   run's :class:`~hookloop.checkpoint.finite_state.FiniteBaseline`); a non-finite one is one
   ``InvalidLossError`` line and nothing is written.
2. **Atomic.** A file is written to a temporary beside its target, fsynced and renamed over
   it; a directory is written whole into a temporary sibling and swapped into place. A
   failure or a kill leaves the previous file (directory) as it was.
3. **Sidecar.** Every file gets its checksum sidecar (``<file>.xxh128`` or ``<file>.sha256``,
   :mod:`hookloop.checkpoint.checksum`), in place before the file it describes.

The engine's entry points (``trainer.checkpointer.export_file`` / ``export_directory``) add
the work dir and the run's baseline. Nothing here is a collective: rank 0 alone may call it.
"""
import ctypes
import errno
import os
import shutil
import tempfile
import weakref

from ..errors import CheckpointError
from ..fileio import hashing, storage
from . import atomic, checksum
from .atomic import DirectorySyncError, io_reason
from .finite_state import FiniteBaseline, check_finite_state

_BASELINES = weakref.WeakKeyDictionary()  # model -> the FiniteBaseline of the run training it


def remember_baseline(model, baseline):
    """Record ``baseline`` as the one of the run that trains ``model`` (see :func:`baseline_of`)."""
    _BASELINES[model] = baseline


def baseline_of(model):
    """The baseline for a writer given a model but no trainer (MMCV's ``save_checkpoint``): the
    one of the run training ``model`` (or the module a wrapper holds); for a model no run has
    trained, its buffers as they are now (a mask's ``-inf`` is by design; its parameters must be
    finite)."""
    module = getattr(model, 'module', model)
    for candidate in (model, module):
        try:
            found = _BASELINES.get(candidate)
        except TypeError:  # not weakly referenceable: no run took a baseline of it
            found = None
        if found is not None:
            return found
    return FiniteBaseline.of(dict(module.named_buffers()), keys=None)


def check_weights(state, path, baseline=None):
    """Rule 1 for an export: ``InvalidLossError`` when ``state`` (a mapping, possibly nested,
    of the tensors the file holds) has a NaN/inf that ``baseline`` does not allow."""
    check_finite_state(state, path, baseline=baseline, keys=None)


def _failed(path, what, exc):
    # torch's zip writer reports a failed write as RuntimeError ("enforce fail ... unexpected
    # pos"), with the file's OSError (ENOSPC, EIO) as its context
    cause = exc.__context__ if isinstance(exc, RuntimeError) and isinstance(exc.__context__, OSError) else exc
    reason = io_reason(cause)
    if isinstance(exc, RuntimeError) and 'No space left' not in reason and _disk_full(path):
        reason = os.strerror(errno.ENOSPC)
    return CheckpointError(f'could not write {what} {path}: {reason}; the previous '
                           f'{"checkpoint" if what == "checkpoint" else "file"} is kept')


def _disk_full(path):
    if storage.is_url(path):
        return False
    try:
        stats = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    return stats.f_bavail == 0


def write_file(path, write, what='file'):
    """Rules 2 and 3 for one file: ``write(fileobj)`` writes its bytes to a temporary beside
    ``path`` (hashed as they pass), the sidecar goes in place, then the file. Returns ``path``.
    ``CheckpointError`` on an I/O failure (the previous file at ``path`` is kept)."""
    algorithm, digest = hashing.default_algorithm(), []

    def hashed_write(file):  # the checksum is computed as the bytes are written: no second read
        hashed = hashing.HashingWriter(file, algorithm)
        write(hashed)
        digest.append(hashed.hexdigest())

    try:
        tmp_path = atomic.write_temporary(path, hashed_write)
        synced = None
        try:
            checksum.write_checksum(path, digest[0], algorithm)
        except DirectorySyncError as exc:  # the new sidecar is in place: the file must join it
            synced = exc
        except BaseException:
            atomic.discard(tmp_path)
            raise
        atomic.commit(tmp_path, path)
        checksum.remove_other_checksums(path, algorithm)
        if synced is not None:
            raise DirectorySyncError(f'{path} was written and renamed into place, but syncing its directory failed '
                                     f'({io_reason(synced.__cause__)}): it may not survive a crash of the machine')
    except (OSError, RuntimeError) as exc:
        raise _failed(path, what, exc) from exc
    return path


def _seal_tree(directory):
    """A sidecar for every file under ``directory``, every file and directory fsynced.
    Symbolic links are refused: a weights directory holds its files."""
    algorithm = hashing.default_algorithm()
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            if os.path.islink(os.path.join(root, name)):
                raise CheckpointError(f'{os.path.join(root, name)} is a symbolic link: a weights directory must '
                                      'hold its own files')
        for name in files:
            if name.endswith(checksum.CHECKSUM_SUFFIXES):
                continue
            file_path = os.path.join(root, name)
            with open(file_path, 'rb') as f:
                digest = hashing.digest_stream(f, algorithm)
                os.fsync(f.fileno())
            with open(file_path + hashing.SUFFIXES[algorithm], 'wb') as f:
                f.write(hashing.sidecar_line(digest, name))
                os.fsync(f.fileno())
        atomic.fsync_dir(root)


_RENAME_EXCHANGE = 2


def _exchange(a, b):
    """Swap the directories ``a`` and ``b`` in one atomic step (Linux ``renameat2``); False
    where the system or the filesystem cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), b)


def _swap_into_place(tmp_dir, path):
    """Put the finished ``tmp_dir`` at ``path``; the directory that was there is removed after."""
    if not os.path.lexists(path):
        os.rename(tmp_dir, path)
    elif os.path.islink(path) or not os.path.isdir(path):
        raise CheckpointError(f'{path} exists and is not a directory: not replacing it with a weights directory')
    elif _exchange(tmp_dir, path):
        shutil.rmtree(tmp_dir, ignore_errors=True)  # now the previous directory
    else:  # two renames: a crash between them leaves the previous directory under a hidden name
        old = tempfile.mkdtemp(prefix='.' + os.path.basename(path) + '.', suffix='.old' + atomic.TMP_SUFFIX,
                               dir=os.path.dirname(path))
        os.rmdir(old)
        os.rename(path, old)
        os.rename(tmp_dir, path)
        shutil.rmtree(old, ignore_errors=True)
    atomic.fsync_dir(os.path.dirname(path))


def write_directory(path, write, what='directory'):
    """Rules 2 and 3 for a directory: ``write(tmp_dir)`` fills a temporary sibling of
    ``path`` (``.<name>.<random>.tmp``), each file gets its sidecar, and the whole is swapped
    into place. For a URL (an object store has no directories to swap) the files are filled
    in a local temporary directory and uploaded one by one, each written as :func:`write_file`
    writes. Returns ``path``."""
    if storage.is_url(path):
        return _upload_directory(path, write, what)
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp_dir = tempfile.mkdtemp(prefix='.' + os.path.basename(path) + '.', suffix=atomic.TMP_SUFFIX, dir=parent)
    try:
        os.chmod(tmp_dir, 0o777 & ~atomic.umask())
        write(tmp_dir)
        _seal_tree(tmp_dir)
        _swap_into_place(tmp_dir, path)
    except BaseException as exc:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if isinstance(exc, (OSError, RuntimeError)) and not isinstance(exc, CheckpointError):
            raise _failed(path, what, exc) from exc
        raise
    return path


def _upload_directory(url, write, what):
    with tempfile.TemporaryDirectory() as local:
        write(local)
        for root, _, files in os.walk(local):
            for name in files:
                source = os.path.join(root, name)
                target = storage.join(url, os.path.relpath(source, local).replace(os.sep, '/'))
                with open(source, 'rb') as f:
                    write_file(target, lambda out, f=f: shutil.copyfileobj(f, out, hashing.CHUNK), what)
    return url


def export_file(path, write, state, baseline=None, what='weights'):
    """The gate for one file: ``state`` checked (rule 1), then :func:`write_file`."""
    check_weights(state, path, baseline)
    return write_file(path, write, what)


def export_directory(path, write, state, baseline=None):
    """The gate for a directory: ``state`` checked (rule 1), then :func:`write_directory`."""
    check_weights(state, path, baseline)
    return write_directory(path, write, 'weights directory')


__all__ = ['baseline_of', 'check_weights', 'export_directory', 'export_file', 'remember_baseline', 'write_directory',
           'write_file']
