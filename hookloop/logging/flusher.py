"""What a run's trackers keep for a while, handed over at the points where it must not wait.

The text and JSON lines of a run are written at their events (:mod:`~hookloop.logging.logger`,
``TextLoggerHook``). A tracker's records may wait a little (a tracker library's call costs one to
several milliseconds inside the loop: :mod:`~hookloop.logging.record_batch`); what waits is
registered here and handed over

* by its owner, at its first event :data:`FLUSH_SECONDS` after its last hand-over, and when it
  stops (its logger closes: a finished, failed or stopped run);
* at the flush points, :func:`flush_logs`: before the ``after_train_epoch``,
  ``after_val_epoch`` and ``before_save_checkpoint`` hooks and before ``after_run``;
* at every exit of the interpreter that Python sees (a normal end, ``sys.exit``, an uncaught
  exception, ``KeyboardInterrupt``), for a script that never closes its trainer.

No thread: everything here runs on the thread that logs. A forked child forgets what its parent
registered (the parent hands it over; the child never sends it a second time).

A registered object has a ``flush()`` that hands over what waits.
"""
import atexit
import os
import traceback

FLUSH_SECONDS = 1.0  # how long a tracker's records may wait for the next event (set_period)

_targets = []


def register(target):
    """Flush ``target`` at the flush points and at exit until :func:`unregister`."""
    if target not in _targets:
        _targets.append(target)


def unregister(target):
    """Flush ``target`` and forget it."""
    if target in _targets:
        _targets.remove(target)
        _flush(target)


def registered():
    """What waits for the next flush point (a copy)."""
    return list(_targets)


def set_period(seconds):
    """Let a tracker's records wait up to ``seconds`` from its last hand-over."""
    global FLUSH_SECONDS
    if not seconds > 0:
        raise ValueError(f'the flush period must be > 0 seconds, got {seconds!r}')
    FLUSH_SECONDS = float(seconds)


def flush_logs():
    """Hand over everything that waits, now."""
    for target in list(_targets):
        _flush(target)


def _flush(target):
    try:
        target.flush()
    except Exception:  # a bug (a target reports its own failures): say so, and flush the others
        traceback.print_exc()


def _forget_in_child():
    _targets.clear()


atexit.register(flush_logs)
os.register_at_fork(after_in_child=_forget_in_child)
