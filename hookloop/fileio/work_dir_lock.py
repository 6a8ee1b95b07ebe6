"""One run per work dir: an exclusive ``flock`` on ``<work_dir>/.hookloop.lock``.

Rank 0 takes the lock when a run starts and holds it until the run ends. ``flock`` is
released by the kernel when the process dies, ``kill -9`` included, so a stale lock
never blocks the next run. The file holds the holder's pid and host, for the error a
second run gets.

The lock cannot be aimed at another file: it lives in the work dir's *resolved* path (two
spellings of one directory share it), it is opened with ``O_NOFOLLOW`` and must be a
regular file with one link whose content is a hookloop lock line (anything else is refused,
never truncated). :meth:`WorkDirLock.check` tells whether the file is still the one held
(deleting or replacing it under a live run lets a second run in): the trainer calls it
before each checkpoint write, and ``WorkDirLockHook`` at every log event.
"""
import os
import re
import socket
import stat

from ..errors import ConfigError

LOCK_NAME = '.hookloop.lock'
_LOCK_LINE = re.compile(rb'^(pid \d+ on host [^\n]*\n?)?$')


class WorkDirLock:
    def __init__(self, work_dir):
        self.path = os.path.join(os.path.realpath(os.fspath(work_dir)), LOCK_NAME)
        self._fd = None
        self._inode = None

    @property
    def held(self):
        return self._fd is not None

    def _refuse(self, why):
        raise ConfigError(f'{self.path!r} {why}: refusing to use it as the work dir lock (remove it if it is '
                          'yours, or give another --work-dir)')

    def _open(self):
        flags = os.O_RDWR | os.O_CREAT | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_NONBLOCK', 0)
        try:
            fd = os.open(self.path, flags, 0o666)
        except OSError as exc:
            if os.path.islink(self.path):
                self._refuse('is a symbolic link')
            if os.path.isdir(self.path):
                self._refuse('is a directory')
            raise ConfigError(f'cannot open the work dir lock {self.path!r}: {exc.strerror or exc}') from None
        info = os.fstat(fd)
        why = (None if stat.S_ISREG(info.st_mode) else 'is not a regular file') or \
            (None if info.st_nlink == 1 else 'has other hard links (it may be another file)') or \
            (None if info.st_size <= 4096 and _LOCK_LINE.match(os.pread(fd, 4097, 0)) else
             'is not a hookloop lock file')
        if why is not None:
            os.close(fd)
            self._refuse(why)
        return fd, info.st_ino

    def acquire(self):
        """Take the lock or raise ConfigError naming the run that holds it."""
        import fcntl
        if self._fd is not None:
            return self
        fd, inode = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode('utf-8', 'replace').strip() or 'another process'
            os.close(fd)
            raise ConfigError(f'work_dir {os.path.dirname(self.path)!r} is in use by another run '
                              f'({holder}); wait for it to finish or give another --work-dir') from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)  # a lock line (checked above), ours now
        os.pwrite(fd, f'pid {os.getpid()} on host {socket.gethostname()}\n'.encode(), 0)
        self._fd, self._inode = fd, inode
        return self

    def check(self):
        """ConfigError when the held lock file was deleted or replaced (another run may
        have taken the work dir since); nothing when no lock is held."""
        if self._fd is None:
            return
        try:
            current = os.lstat(self.path).st_ino
        except OSError:
            current = None
        if current != self._inode:
            raise ConfigError(f'the work dir lock {self.path!r} was {"deleted" if current is None else "replaced"} '
                              'while this run held it: another run may be using the work dir; this run stops and '
                              'writes no checkpoint there')

    def release(self):
        if self._fd is not None:
            import fcntl
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = self._inode = None
