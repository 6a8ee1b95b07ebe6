"""Atomic file writes: a temporary beside the target, fsynced, renamed over it, the directory fsynced.

Every file hookloop must not leave half-written (checkpoints, their checksum sidecars, the
``last_checkpoint`` pointer, exported weights) goes through :func:`write_temporary` then
:func:`commit`. Callers use these through the module (``atomic.commit``), not a copy of the
name, so one patch of a step is seen by every save path.
"""
import glob
import os
import shutil
import tempfile

from ..errors import CheckpointError
from ..fileio import storage

TMP_SUFFIX = storage.TMP_SUFFIX  # local temporaries are named like the object-store ones


def fsync_dir(directory):
    """fsync ``directory`` (its entries survive a crash of the machine), where the filesystem allows."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some filesystems do not open directories; the rename is still atomic
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def umask():
    # The only portable way to read the umask is to set it; put it straight back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def io_reason(exc):
    """The OS's words for an I/O error ("No space left on device"), else the message."""
    return getattr(exc, 'strerror', None) or str(exc).strip().splitlines()[0]


def write_temporary(path, write):
    """Call ``write(file)`` on a new temporary file beside ``path``, flush and fsync it;
    return the temporary's path. The file gets the permissions ``open()`` would give
    (``0o666`` less the umask), not ``mkstemp``'s private 0600. On error it is removed.

    For a URL the temporary is an object ``.<name>.<random>.tmp`` beside ``path``
    (see :func:`hookloop.fileio.storage.write_temporary_url`)."""
    if storage.is_url(path):
        return storage.write_temporary_url(path, write)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp_path = tempfile.mkstemp(prefix='.' + os.path.basename(path) + '.', suffix=TMP_SUFFIX, dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, 'wb') as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
    except BaseException:
        discard(tmp_path)
        raise
    return tmp_path


def discard(tmp_path):
    if storage.is_url(tmp_path):
        return storage.remove_quietly(tmp_path)
    try:
        os.unlink(tmp_path)
    except OSError:
        pass


class DirectorySyncError(CheckpointError):
    """The rename succeeded (the new file is in place) but the directory's fsync failed."""


def commit(tmp_path, path):
    """Rename the finished temporary over ``path`` (atomic on POSIX) and fsync the directory.
    For a URL the temporary object is moved to ``path`` (see :mod:`hookloop.fileio.storage`)."""
    if storage.is_url(path):
        try:
            storage.move(tmp_path, path)
        except BaseException:
            discard(tmp_path)
            raise
        return
    try:
        os.replace(tmp_path, path)
    except BaseException:
        discard(tmp_path)
        raise
    try:
        fsync_dir(os.path.dirname(os.path.abspath(path)))
    except OSError as exc:  # after the rename: the new file is in place, not the previous one
        raise DirectorySyncError(f'{path} was written and renamed into place, but syncing its directory failed '
                                 f'({io_reason(exc)}): it may not survive a crash of the machine') from exc


def atomic_write(path, write):
    """Call ``write(file)`` on a temporary file (or object, for a URL) beside ``path``,
    fsync it, rename (move) it to ``path``. On any error the temporary is removed and
    ``path`` is untouched."""
    commit(write_temporary(path, write), path)


def remove_stale_temporaries(directory):
    """Delete ``.<name>.<random>.tmp`` files (and directories) that a killed writer left in ``directory``.

    Only rank 0 of the run that owns ``directory`` (it holds the work dir's lock) calls this."""
    if storage.is_url(directory):
        return storage.remove_stale_temporaries_url(directory)
    removed = []
    for path in glob.glob(os.path.join(glob.escape(directory), '.*' + TMP_SUFFIX)):
        try:
            if os.path.isdir(path) and not os.path.islink(path):  # a weights directory's (checkpoint/gate.py)
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed
