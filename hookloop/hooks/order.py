"""Hook ordering: sort by priority, then apply the dependencies hook classes declare.

A hook class declares ``RUNS_AFTER`` / ``RUNS_BEFORE`` as roles; in every stage two hooks
both implement, a declared dependency wins over the priorities (the dependent hook is moved
just ahead of its partner). Everything here is a pure function of the hooks, tested without
a trainer.
"""
import warnings

from ..errors import ConfigError
from ..priority import Priority
from .base import STAGES, overrides


class HookOrderWarning(UserWarning):
    """A priority given by the user contradicts a dependency a hook class declares."""


def role_of(hook):
    return getattr(hook, 'ROLE', None)


def sort_by_priority(entries):
    """``entries``: (priority, registration index, hook) -> hooks, lowest priority first,
    ties in registration order."""
    return [hook for _, _, hook in sorted(entries, key=lambda e: (e[0], e[1]))]


def declared_constraints(hooks):
    """``(earlier role, later role)`` pairs the classes of ``hooks`` declare, in a stable order.
    ``'*'`` as the earlier role stands for every role other than the later one."""
    pairs = []
    for hook in hooks:
        role = role_of(hook)
        if role is None:
            continue
        for other in getattr(hook, 'RUNS_AFTER', ()):
            pairs.append((other, role))
        for other in getattr(hook, 'RUNS_BEFORE', ()):
            pairs.append((role, other))
    return list(dict.fromkeys(pairs))


def must_precede(first, second, constraints):
    """True when a declared dependency puts ``first`` before ``second``."""
    early, late = role_of(first), role_of(second)
    if early is None and late is None:
        return False
    return any(b == late and (a == early or (a == '*' and early != late)) for a, b in constraints)


def _matches(hook, role, later_role):
    if role == '*':
        return role_of(hook) != later_role
    return role_of(hook) == role


def apply_constraints(hooks, constraints=None):
    """Move each constrained hook just ahead of the first hook it must precede.

    ``constraints`` default to those the hooks declare. Repeats until none is violated;
    a cycle raises ConfigError.
    """
    hooks = list(hooks)
    if constraints is None:
        constraints = declared_constraints(hooks)
    for _ in range(len(hooks) * len(constraints) + 1):
        moved = False
        for early, late in constraints:
            first_late = next((i for i, h in enumerate(hooks) if role_of(h) == late), None)
            if first_late is None:
                continue
            movers = [h for h in hooks[first_late + 1:] if _matches(h, early, late)]
            for hook in movers:
                hooks.remove(hook)
                hooks.insert(first_late, hook)
                first_late += 1
                moved = True
        if not moved:
            return hooks
    raise ConfigError('hook ordering dependencies form a cycle: ' + ', '.join(f'{a}<{b}' for a, b in constraints))


def stage_table(hooks, constraints=None):
    """stage -> the hooks that implement it, in the order they run."""
    if constraints is None:
        constraints = declared_constraints(hooks)
    return {stage: apply_constraints([h for h in hooks if overrides(h, stage)], constraints)
            for stage in STAGES}


def warn_contradictions(hook, priority, user_set, entries):
    """Warn when ``hook`` (registered at ``priority``) and an already registered hook are in
    the opposite order by priority from what a declared dependency says, and one of the two
    priorities was set by the user (``user_set`` for ``hook``; ``entries`` hold
    ``(priority, index, hook, user_set)``). Returns the warnings' texts."""
    texts = []
    for other_priority, _, other, other_user_set in entries:
        if not (user_set or other_user_set):
            continue
        constraints = declared_constraints([hook, other])
        for first, first_p, second, second_p in ((hook, priority, other, other_priority),
                                                 (other, other_priority, hook, priority)):
            if first_p > second_p and must_precede(first, second, constraints):
                declarer = first if must_precede(first, second, declared_constraints([first])) else second
                texts.append(f'{first.name} (priority {priority_label(first_p)}) runs before {second.name} '
                             f'(priority {priority_label(second_p)}) wherever both act, as '
                             f'{type(declarer).__name__} declares; the declared dependency wins over the priorities')
    for text in texts:
        warnings.warn(text, HookOrderWarning, stacklevel=4)
    return texts


def priority_label(value):
    return Priority(value).name if value in Priority._value2member_map_ else str(value)


def dependencies_of(hook):
    """``'after optimizer; before checkpoint'`` for the table, or ``''``."""
    parts = []
    if getattr(hook, 'RUNS_AFTER', ()):
        parts.append('after ' + ', '.join('all others' if r == '*' else r for r in hook.RUNS_AFTER))
    if getattr(hook, 'RUNS_BEFORE', ()):
        parts.append('before ' + ', '.join(hook.RUNS_BEFORE))
    return '; '.join(parts)


def format_stage_table(table, priority_of):
    """A readable per-stage listing: ``priority_of(hook)`` gives the number to show, and each
    hook's declared dependencies follow its name."""
    lines = []
    for stage, hooks in table.items():
        if not hooks:
            continue
        lines.append(f'{stage}:')
        for hook in hooks:
            deps = dependencies_of(hook)
            lines.append(f'  ({priority_label(priority_of(hook)):<12}) {hook.name}' + (f'  [{deps}]' if deps else ''))
    return '\n'.join(lines)
