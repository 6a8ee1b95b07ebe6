"""Record who writes the state hooks share during a run (tests/test_contracts.py).

The trainer, its ``position`` and ``step`` get a subclass of their own class swapped in
(``obj.__class__ = Traced``) whose ``__setattr__`` notes the module of the frame doing the write;
the optimizer's parameter groups become dicts that note writes of the hyper-parameter keys
(re-wrapped whenever a ``load_state_dict`` replaces them), and modules with MMCV's
``fp16_enabled`` switch note who turns it on. Nothing else changes: every write still happens.
"""
import sys

from hookloop.optim.param_groups import HYPER_PARAMETERS

PARAM_GROUPS_OWNER = 'hookloop.optim.param_groups'


class WriteLog:
    """``writes[name] = {writer module: 'file:line in function'}`` (the first place seen)."""

    def __init__(self):
        self.writes = {}

    def note(self, name, writer, frame):
        where = f'{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}'
        self.writes.setdefault(name, {}).setdefault(writer, where)

    def note_frame(self, name, frame):
        self.note(name, frame.f_globals.get('__name__', '?'), frame)

    def note_group_write(self, key, frame):
        # The param groups' one writer is optim/param_groups.py: a write counts as its own when
        # it happens inside one of its functions (torch's schedulers write inside step_scheduler).
        # Otherwise the writer is the innermost frame outside torch.
        innermost = None
        while frame is not None:
            module = frame.f_globals.get('__name__', '?')
            if module == PARAM_GROUPS_OWNER:
                self.note(f'param_group.{key}', module, frame)
                return
            if innermost is None and not module.startswith('torch'):
                innermost = frame
            frame = frame.f_back
        if innermost is not None:
            self.note_frame(f'param_group.{key}', innermost)


def _traced_class(base, prefix, log):
    def __setattr__(self, name, value):
        log.note_frame(f'{prefix}.{name}', sys._getframe(1))
        base.__setattr__(self, name, value)

    return type(f'Traced{base.__name__}', (base,), {'__slots__': (), '__setattr__': __setattr__,
                                                    '__module__': __name__})


class TracedGroup(dict):
    log = None

    def __setitem__(self, key, value):
        if key in HYPER_PARAMETERS:
            self.log.note_group_write(key, sys._getframe(1))
        super().__setitem__(key, value)

    def setdefault(self, key, default=None):
        if key not in self and key in HYPER_PARAMETERS:
            self.log.note_group_write(key, sys._getframe(1))
        return super().setdefault(key, default)

    def update(self, *args, **kwargs):
        for key in dict(*args, **kwargs):
            if key in HYPER_PARAMETERS:
                self.log.note_group_write(key, sys._getframe(1))
        super().update(*args, **kwargs)


def _wrap_groups(optimizer, log):
    group_class = type('TracedGroup', (TracedGroup,), {'log': log})
    optimizer.param_groups[:] = [g if isinstance(g, TracedGroup) else group_class(g) for g in optimizer.param_groups]


def _traced_optimizer_class(base, log):
    def __setstate__(self, state):  # load_state_dict builds new groups: trace them too
        base.__setstate__(self, state)
        _wrap_groups(self, log)

    return type(f'Traced{base.__name__}', (base,), {'__setstate__': __setstate__, '__module__': __name__})


def _traced_fp16_module_class(base, log):
    def __setattr__(self, name, value):
        if name == 'fp16_enabled':
            log.note_frame('module.fp16_enabled', sys._getframe(1))
        base.__setattr__(self, name, value)

    return type(f'Traced{base.__name__}', (base,), {'__setattr__': __setattr__, '__module__': __name__})


def trace(trainer, log=None):
    """Swap the traced classes in; returns the :class:`WriteLog`."""
    log = log or WriteLog()
    trainer.position.__class__ = _traced_class(type(trainer.position), 'position', log)
    trainer.step.__class__ = _traced_class(type(trainer.step), 'step', log)
    trainer.__class__ = _traced_class(type(trainer), 'trainer', log)
    if trainer.optimizer is not None:
        _wrap_groups(trainer.optimizer, log)
        trainer.optimizer.__class__ = _traced_optimizer_class(type(trainer.optimizer), log)
    for module in trainer.model.modules():
        if hasattr(module, 'fp16_enabled'):
            module.__class__ = _traced_fp16_module_class(type(module), log)
    return log
