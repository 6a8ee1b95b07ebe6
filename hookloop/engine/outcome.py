"""How a run ends: ``trainer.outcome``, the one thing hooks read to know it.

The trainer builds it from its own record of the run (``exception``, ``stop_reason``, whether
``train()`` is running); hooks read it, mostly in ``after_run`` (a tracker marks a failed run,
``PreemptionHook`` saves only after a clean stop, ``SavePipelineHook`` exports only a finished
run). ``trainer.exception`` and ``trainer.stop_reason`` stay readable for MMCV-style user hooks;
only the trainer writes them (``request_stop(reason)`` is how a hook asks for a stop).
"""

NOT_STARTED, RUNNING, FINISHED, STOPPED, FAILED = 'not started', 'running', 'finished', 'stopped', 'failed'


class Outcome:
    """``state``: one of ``'not started'``, ``'running'``, ``'finished'`` (reached ``max_iters``
    or the loop ended without a stop), ``'stopped'`` (``reason``: what ``request_stop`` was given),
    ``'failed'`` (``exception``: what ended it; a stop requested before the failure keeps its
    ``reason``)."""

    __slots__ = ('state', 'reason', 'exception')

    def __init__(self, state, reason=None, exception=None):
        for name, value in (('state', state), ('reason', reason), ('exception', exception)):
            object.__setattr__(self, name, value)

    @classmethod
    def of(cls, started, running, stop_reason, exception):
        if exception is not None:
            return cls(FAILED, stop_reason, exception)
        if running:
            return cls(RUNNING, stop_reason)
        if stop_reason is not None:
            return cls(STOPPED, stop_reason)
        return cls(FINISHED if started else NOT_STARTED)

    @property
    def finished(self):
        return self.state == FINISHED

    @property
    def stopped(self):
        return self.state == STOPPED

    @property
    def failed(self):
        return self.state == FAILED

    def __setattr__(self, name, value):  # a value: hooks read it, nobody edits it
        raise AttributeError('an Outcome is read-only; a hook asks for a stop with trainer.request_stop(reason)')

    def __eq__(self, other):
        return isinstance(other, Outcome) and (self.state, self.reason, self.exception) == \
            (other.state, other.reason, other.exception)

    __hash__ = None

    def __repr__(self):
        detail = f', reason={self.reason!r}' if self.reason is not None else ''
        detail += f', exception={self.exception!r}' if self.exception is not None else ''
        return f'Outcome({self.state!r}{detail})'


__all__ = ['Outcome', 'NOT_STARTED', 'RUNNING', 'FINISHED', 'STOPPED', 'FAILED']
