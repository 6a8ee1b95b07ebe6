"""The work dir of a run: where its checkpoints go, where its log files are written, its lock.

``storage_dir`` is where checkpoints and the ``last_checkpoint`` pointer go (a local path or
an fsspec URL); ``local_dir`` is a local directory for files written with ``open()`` (logs,
event files): the same path unless ``storage_dir`` is a URL, then a local mirror whose files
:meth:`WorkDir.upload_logs` copies there at the end. Nothing is created when the trainer is
built (a failed build leaves nothing behind): rank 0 creates the directory and takes its
lock (:mod:`hookloop.fileio.work_dir_lock`) when a run starts, and releases it when it ends.
"""
import os

from ..errors import ConfigError
from . import storage
from .paths import check_can_create_dir, ensure_writable_dir
from .work_dir_identity import lock_identity, resolve_location
from .work_dir_lock import WorkDirLock


class WorkDir:
    """``WorkDir(work_dir, rank)``: checks that rank 0 can create ``work_dir`` (a path or an
    fsspec URL; ``file:``/``local:`` URLs are local paths, protocol aliases one spelling: see
    :mod:`hookloop.fileio.work_dir_identity`) and knows where its parts go; creates nothing."""

    def __init__(self, work_dir, rank=0):
        if not isinstance(work_dir, (str, os.PathLike)):
            raise ConfigError(f'work_dir must be a path, got {work_dir!r}')
        self.rank = rank
        work_dir = resolve_location(work_dir)  # one spelling per place: file:/DIR -> /DIR, s3a:// -> s3://
        if storage.is_url(work_dir):
            # Created when the run starts too (claim); the protocol is checked now.
            storage.check_url(work_dir, 'work_dir')  # s3://b/x/../run is a key of its own, never s3://b/run
            self.storage_dir = work_dir.rstrip('/')
            # The lock lives in the local mirror, which is one per store and prefix (work_dir_identity).
            self.local_dir = storage.local_mirror(lock_identity(self.storage_dir))
            if rank == 0:
                check_can_create_dir(self.local_dir, 'local mirror of work_dir')
        else:
            self.storage_dir = self.local_dir = os.path.abspath(work_dir)
            if rank == 0:  # created when the run starts, so a failed build leaves nothing behind
                check_can_create_dir(self.local_dir, 'work_dir')
        self._lock = WorkDirLock(self.local_dir)  # the local dir (for a URL run: its local mirror)
        self._outside = []  # (directory, its lock): outputs named outside the work dir (lock_outside)

    @property
    def mirrored(self):
        """True when ``storage_dir`` is a URL and ``local_dir`` its local mirror."""
        return self.storage_dir != self.local_dir

    def lock_outside(self, directories):
        """Directories outside the work dir this run will write into (an absolute ``out_dir`` a
        user gave a hook; local paths or URLs): :meth:`claim` creates and locks each as it does
        the work dir, so two runs never write into one, and :meth:`release` frees them."""
        held = {}
        for directory in directories:
            location = resolve_location(directory, 'output directory')
            local = storage.local_mirror(lock_identity(location)) if storage.is_url(location) else location
            held.setdefault(os.path.realpath(local), WorkDirLock(local))  # one lock per place
        self._outside = list(held.items())

    def claim(self):
        """Rank 0: create the work dir (and the directories of :meth:`lock_outside`) and take
        their locks for the whole run (one run per dir; a ConfigError naming the holder when
        another run has one). Other ranks: nothing."""
        if self.rank != 0:
            return
        ensure_writable_dir(self.local_dir, 'local mirror of work_dir' if self.mirrored else 'work_dir')
        self._lock.acquire()
        try:
            for directory, lock in self._outside:
                ensure_writable_dir(directory, 'output directory')
                lock.acquire()
            if self.mirrored:  # a URL: not locked across machines (see docs/checkpoints.md)
                storage.makedirs(self.storage_dir)
        except BaseException:
            self.release()
            raise

    def release(self):
        """Release the locks (no effect on those not held)."""
        for _, lock in self._outside:
            lock.release()
        self._lock.release()

    def check_lock(self):
        """A ConfigError when a lock file held was deleted or replaced (another run may own
        the dir now); called before each checkpoint write and by ``WorkDirLockHook`` at every log event."""
        self._lock.check()
        for _, lock in self._outside:
            lock.check()

    def join(self, path):
        """``path`` (absolute, or relative to ``storage_dir``; a local path or a URL) as written to."""
        return storage.join(self.storage_dir, path)

    def upload_logs(self, logger):
        """For a URL work dir: flush ``logger``'s files and copy the local mirror to
        ``storage_dir``. A failed copy is logged, not raised (the run's outcome stands; the
        logs stay in the local mirror)."""
        if not self.mirrored:
            return
        for handler in logger.handlers:
            handler.flush()
        try:
            storage.upload_tree(self.local_dir, self.storage_dir)
        except Exception as exc:
            logger.error('could not copy the logs in %s to %s: %r', self.local_dir, self.storage_dir, exc)


__all__ = ['WorkDir']
