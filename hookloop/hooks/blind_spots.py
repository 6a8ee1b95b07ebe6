"""Which methods of a hook (or optimizer processor) class the ``next_call`` it inherits cannot
know about: a class with any is called at every iteration (docs/hooks.md, "Subclasses").

hookloop's own classes are trusted: each ``next_call`` is written and tested (tests/
test_schedule_property.py) with the classes that inherit it. A user's class that overrides a
method below (before, in the MRO) the class of the ``next_call`` it inherits is not, unless
the method is one of the stages outside the iteration, a state method, or an extension
method a hookloop class lists in ``NEXT_CALL_COVERS`` (one its schedule accounts for).

"Method" means anything dispatch could call there: a function, a staticmethod or classmethod, a
``functools.partialmethod`` or ``singledispatchmethod`` (descriptors that are not callable
themselves), a property, a callable object; at a stage name, any attribute at all. A method set
on a hook *instance* counts as an override in a class of its own (:func:`hook_blind_spots`).
"""
import weakref

from .base import ITERATION_STAGES, STAGES

# Methods whose override cannot change what a hook does at a training iteration: the other
# stages (the trainer asks again after them during an epoch, and at every epoch's start) and
# the state methods.
_SAFE = frozenset(STAGES) - frozenset(ITERATION_STAGES) - {'before_iter', 'after_iter'} | {
    'before_epoch', 'after_epoch', 'state_dict', 'load_state_dict', 'next_call', 'name', 'output_dirs'}
_STAGE_NAMES = frozenset(ITERATION_STAGES) | {'before_iter', 'after_iter'}
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
    covered = _covered(cls, safe)
    found = []
    for klass in mro[:mro.index(owner)] if owner is not None else ():
        if _trusted(klass):
            continue
        found += [f'{klass.__name__}.{name}' for name, value in vars(klass).items() if _unknown(name, value, covered)]
    found = tuple(found)
    try:
        _blind_spots.setdefault(cls, {})[safe] = found
    except TypeError:
        pass
    return found


def _covered(cls, safe):
    """The names whose override a schedule accounts for: the safe ones and the extension
    methods hookloop's classes of ``cls``'s MRO list."""
    covered = set(_SAFE) | set(safe)
    for klass in cls.__mro__:
        if _trusted(klass):
            covered.update(vars(klass).get('NEXT_CALL_COVERS', ()))
    return covered


def _is_method(value):
    """Something dispatch can call: a callable, or a descriptor it binds (a partialmethod, a
    singledispatchmethod, a staticmethod, a property, ...); plain data is neither."""
    return callable(value) or hasattr(type(value), '__get__')


def _unknown(name, value, covered):
    """True when ``name = value`` (in a class body or on an instance) is a method a schedule must know of."""
    if name in covered or (name.startswith('__') and name.endswith('__')):
        return False
    return name in _STAGE_NAMES or _is_method(value)


def hook_blind_spots(obj, safe=()):
    """:func:`schedule_blind_spots` of ``obj``'s class, plus the methods set on ``obj`` itself
    that shadow a method of its class or sit at an iteration stage (``hook.after_train_iter =
    fn``): those count as overrides in a class of their own, so only a ``next_call`` that the
    object's own user class defines answers for them."""
    cls = type(obj)
    found = schedule_blind_spots(cls, safe)
    own = vars(obj) if hasattr(obj, '__dict__') else {}
    if not own or ('next_call' in vars(cls) and not _trusted(cls)):
        return found
    covered = _covered(cls, safe)
    shadowed = [f'{cls.__name__} instance.{name}' for name, value in own.items()
                if (name in _STAGE_NAMES or _is_method(getattr(cls, name, None))) and _unknown(name, value, covered)]
    return found + tuple(shadowed)


__all__ = ['hook_blind_spots', 'schedule_blind_spots']
