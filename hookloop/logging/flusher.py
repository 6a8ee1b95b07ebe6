"""The run's log files are flushed by a timer, not after every line.

A flush is a system call, and at a log event of a small model each one costs about as much as
the rest of the event (measured in a run: 15-35 µs, most of it the cache misses it leaves for
the next iteration). So the lines of the ``.log`` and ``.log.json`` files go into their file
buffers, and one daemon thread per process flushes every registered file every
:data:`FLUSH_SECONDS`; the log events' lines themselves, terminal included, are written by the
same thread in batches (:mod:`~hookloop.logging.line_batch`).

Nothing of a run that ends is lost: a file is flushed when it is unregistered (its owner closes
it), :func:`flush_logs` runs before the ``after_run`` hooks (which may copy or upload the logs),
before a ``fork`` (a child must not inherit unwritten lines it could write twice), and at the
interpreter's exit. A process killed with ``SIGKILL`` loses at most the last
:data:`FLUSH_SECONDS` of lines.

A registered object needs a thread-safe ``flush()``: a ``logging.Handler`` (its ``flush``
takes the handler's lock, which its writers hold too), a binary buffered file, or a
:class:`~hookloop.logging.line_batch.LineBatch`.
"""
import atexit
import os
import threading
import traceback

FLUSH_SECONDS = 1.0  # change it with set_period: the thread is waiting with the old one

_lock = threading.Lock()  # guards _files and _thread; held while flushing, so an unregistered file is never flushed after
_files = []
_thread = None
_stop = _wake = None


def register(target, first=False):
    """Flush ``target`` every :data:`FLUSH_SECONDS` from now until :func:`unregister`; with
    ``first``, before the targets registered so far (it writes into them)."""
    global _thread, _stop, _wake
    with _lock:
        if first:
            _files.insert(0, target)
        else:
            _files.append(target)
        if _thread is None:
            _stop, _wake = threading.Event(), threading.Event()
            _thread = threading.Thread(target=_run, args=(_stop, _wake), name='hookloop-log-flusher', daemon=True)
            _thread.start()


def set_period(seconds):
    """Flush every ``seconds`` from now on (also a thread already waiting with the old period)."""
    global FLUSH_SECONDS
    if not seconds > 0:
        raise ValueError(f'the flush period must be > 0 seconds, got {seconds!r}')
    FLUSH_SECONDS = float(seconds)
    wake = _wake
    if wake is not None:
        wake.set()


def unregister(target):
    """Flush ``target`` and stop flushing it; the thread ends with the last file."""
    thread = None
    with _lock:
        if target in _files:
            _files.remove(target)
            _flush(target)
        if not _files:
            thread = _stop_thread()
    if thread is not None and thread is not threading.current_thread():
        thread.join()


def flush_logs():
    """Flush every registered file now."""
    with _lock:
        _flush_all()


def _flush_all():  # (with _lock held)
    for target in _files:
        _flush(target)


def _stop_thread():
    """Tell the thread to end (with _lock held); returns it, to join outside the lock."""
    global _thread
    thread, _thread = _thread, None
    if thread is not None:
        _stop.set()
        _wake.set()
    return thread


def _run(stop, wake):
    while True:
        woken = wake.wait(FLUSH_SECONDS)
        if stop.is_set():
            return
        if woken:  # a new period: wait again, with it
            wake.clear()
            continue
        flush_logs()


def _flush(target):
    try:
        target.flush()
    except (OSError, ValueError):  # a full disk, a closed file: its owner reports it on its next write
        pass
    except Exception:  # a bug: say so, and go on flushing (the thread must not die of it)
        traceback.print_exc()


def _stop_at_exit():
    """At the interpreter's exit (before ``logging.shutdown``, registered after it): everything
    written, and the thread stopped, so it never holds a lock that the shutdown waits for."""
    with _lock:
        _flush_all()
        thread = _stop_thread()
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout=10)


def _before_fork():
    """Everything written, and the lock held across the fork: the flusher's thread is then
    between two flushes, holding no lock that a child (which has no such thread) would wait for."""
    _lock.acquire()
    _flush_all()


def _after_fork_in_child():
    global _lock, _thread
    _lock, _thread = threading.Lock(), None  # (the parent's thread is not in the child)
    for target in _files:
        reinit = getattr(target, '_at_fork_reinit', None)
        if reinit is not None:
            reinit()


atexit.register(_stop_at_exit)
os.register_at_fork(before=_before_fork, after_in_parent=_lock.release, after_in_child=_after_fork_in_child)
