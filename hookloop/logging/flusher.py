"""The run's log files are flushed by a timer, not after every line.

A flush is a system call, and at a log event of a small model each one costs about as much as
the rest of the event (measured in a run: 15-35 µs, most of it the cache misses it leaves for
the next iteration). So the lines of the ``.log`` and ``.log.json`` files go into their file
buffers, and one daemon thread per process flushes every registered file every
:data:`FLUSH_SECONDS`; the log events' lines themselves, terminal included, are written by the
same thread in batches (:mod:`~hookloop.logging.line_batch`).

Nothing of a run that ends is lost: a file is flushed when it is unregistered (its owner closes
it), :func:`flush_logs` runs before the ``after_run`` hooks (which may copy or upload the logs),
and before a ``fork`` (a child must not inherit unwritten lines it could write twice). A
process killed with ``SIGKILL`` loses at most the last :data:`FLUSH_SECONDS` of lines.

A registered object needs a thread-safe ``flush()``: a ``logging.Handler`` (its ``flush``
takes the handler's lock, which its writers hold too), a binary buffered file, or a
:class:`~hookloop.logging.line_batch.LineBatch`.
"""
import os
import threading

FLUSH_SECONDS = 1.0

_lock = threading.Lock()  # guards _files and _thread; held while flushing, so an unregistered file is never flushed after
_files = []
_thread = None
_stop = None


def register(target, first=False):
    """Flush ``target`` every :data:`FLUSH_SECONDS` from now until :func:`unregister`; with
    ``first``, before the targets registered so far (it writes into them)."""
    global _thread, _stop
    with _lock:
        if first:
            _files.insert(0, target)
        else:
            _files.append(target)
        if _thread is None:
            _stop = threading.Event()
            _thread = threading.Thread(target=_run, args=(_stop,), name='hookloop-log-flusher', daemon=True)
            _thread.start()


def unregister(target):
    """Flush ``target`` and stop flushing it; the thread ends with the last file."""
    global _thread
    thread = None
    with _lock:
        if target in _files:
            _files.remove(target)
            _flush(target)
        if not _files and _thread is not None:
            thread, _thread = _thread, None
            _stop.set()
    if thread is not None and thread is not threading.current_thread():
        thread.join()


def flush_logs():
    """Flush every registered file now."""
    with _lock:
        for target in _files:
            _flush(target)


def _run(stop):
    while not stop.wait(FLUSH_SECONDS):
        flush_logs()


def _flush(target):
    try:
        target.flush()
    except (OSError, ValueError):  # a full disk, a closed file: its owner reports it on its next write
        pass


os.register_at_fork(before=flush_logs)
