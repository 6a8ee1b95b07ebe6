"""Which methods of a hook (or optimizer processor) class the ``next_call`` it inherits cannot
know about: a class with any is called at every iteration (docs/hooks.md, "Subclasses").

hookloop's own classes are trusted: each ``next_call`` is written and tested (tests/
test_schedule_property.py) with the classes that inherit it. A user's class that overrides a
method below (before, in the MRO) the class of the ``next_call`` it inherits is not, unless
the method is one of the stages outside the iteration, a state method, or an extension
method a hookloop class lists in ``NEXT_CALL_COVERS`` (one its schedule accounts for).
"""
import weakref

from .base import ITERATION_STAGES, STAGES

# Methods whose override cannot change what a hook does at a training iteration: the other
# stages (the trainer asks again after them during an epoch, and at every epoch's start) and
# the state methods.
_SAFE = frozenset(STAGES) - frozenset(ITERATION_STAGES) - {'before_iter', 'after_iter'} | {
    'before_epoch', 'after_epoch', 'state_dict', 'load_state_dict', 'next_call', 'name', 'output_dirs'}
_blind_spots = weakref.WeakKeyDictionary()  # class -> {safe: the overrides its schedule cannot know}


def _trusted(cls):
    """hookloop's own classes: their ``next_call`` is written (and tested) with them."""
    module = getattr(cls, '__module__', '') or ''
    return module == 'hookloop' or module.startswith('hookloop.')


def schedule_blind_spots(cls, safe=()):
    """The methods ``cls`` (a hook or an optimizer processor class) defines that the
    ``next_call`` it inherits cannot know: those of user classes that come before that
    ``next_call``'s class in the MRO, except the stages outside the iteration and the names
    in ``safe`` or in the ``NEXT_CALL_COVERS`` of hookloop's classes of the MRO (extension
    methods their schedules account for, e.g. a logger's ``log``). Empty: the schedule may
    be trusted; otherwise the object must run at every iteration."""
    safe = tuple(safe)
    try:
        return _blind_spots[cls][safe]
    except (KeyError, TypeError):
        pass
    mro = cls.__mro__
    owner = next((klass for klass in mro if 'next_call' in vars(klass)), None)
    covered = set(_SAFE) | set(safe)
    for klass in mro:
        if _trusted(klass):
            covered.update(vars(klass).get('NEXT_CALL_COVERS', ()))
    found = []
    for klass in mro[:mro.index(owner)] if owner is not None else ():
        if _trusted(klass):
            continue
        for name, value in vars(klass).items():
            if name in covered or (name.startswith('__') and name.endswith('__')):
                continue
            if callable(value) or isinstance(value, (staticmethod, classmethod, property)):
                found.append(f'{klass.__name__}.{name}')
    found = tuple(found)
    try:
        _blind_spots.setdefault(cls, {})[safe] = found
    except TypeError:
        pass
    return found


__all__ = ['schedule_blind_spots']
