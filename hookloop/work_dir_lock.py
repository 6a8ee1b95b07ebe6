"""One run per work dir: an exclusive ``flock`` on ``<work_dir>/.hookloop.lock``.

Rank 0 takes the lock when a run starts and holds it until the run ends. ``flock`` is
released by the kernel when the process dies, ``kill -9`` included, so a stale lock
never blocks the next run. The file holds the holder's pid and host, for the error a
second run gets.
"""
import os
import socket

from .errors import ConfigError

LOCK_NAME = '.hookloop.lock'


class WorkDirLock:
    def __init__(self, work_dir):
        self.path = os.path.join(work_dir, LOCK_NAME)
        self._fd = None

    @property
    def held(self):
        return self._fd is not None

    def acquire(self):
        """Take the lock or raise ConfigError naming the run that holds it."""
        import fcntl
        if self._fd is not None:
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 256).decode('utf-8', 'replace').strip() or 'another process'
            os.close(fd)
            raise ConfigError(f'work_dir {os.path.dirname(self.path)!r} is in use by another run '
                              f'({holder}); wait for it to finish or give another --work-dir') from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f'pid {os.getpid()} on host {socket.gethostname()}\n'.encode(), 0)
        self._fd = fd
        return self

    def release(self):
        if self._fd is not None:
            import fcntl
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
