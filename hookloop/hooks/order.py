"""Hook ordering: sort by priority, then apply the declared constraints per stage.

Both steps are pure functions of the hooks, so they are tested without a trainer.
"""
from ..errors import ConfigError
from .base import STAGES, overrides

# (earlier role, later role): in any stage both implement, every hook of the earlier
# role runs before the first hook of the later role, whatever their priorities.
# '*' stands for every role other than the later one.
ORDER_CONSTRAINTS = (
    ('lr', 'optimizer'),            # the step uses this iteration's learning rate
    ('momentum', 'optimizer'),
    ('invalid_loss', 'optimizer'),  # a bad loss is caught before it reaches the weights
    ('optimizer', 'ema'),           # the average takes in this iteration's step
    ('optimizer', 'evaluation'),    # what is evaluated and saved is the stepped model
    ('optimizer', 'checkpoint'),
    ('ema', 'evaluation'),          # evaluation may use the averaged weights
    ('ema', 'checkpoint'),          # the checkpoint holds the up-to-date average
    ('evaluation', 'checkpoint'),   # save_best needs this round's metric
    ('*', 'logger'),                # loggers see everything the other hooks produced
)


def role_of(hook):
    return getattr(hook, 'ROLE', None)


def sort_by_priority(entries):
    """``entries``: (priority, registration index, hook) -> hooks, lowest priority first,
    ties in registration order."""
    return [hook for _, _, hook in sorted(entries, key=lambda e: (e[0], e[1]))]


def _matches(hook, role, later_role):
    if role == '*':
        return role_of(hook) != later_role
    return role_of(hook) == role


def apply_constraints(hooks, constraints=ORDER_CONSTRAINTS):
    """Move each constrained hook just ahead of the first hook it must precede.

    Repeats until no constraint is violated; a cycle raises ConfigError.
    """
    hooks = list(hooks)
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
    raise ConfigError('hook ordering constraints form a cycle: ' + ', '.join(f'{a}<{b}' for a, b in constraints))


def stage_table(hooks, constraints=ORDER_CONSTRAINTS):
    """stage -> the hooks that implement it, in the order they run."""
    return {stage: apply_constraints([h for h in hooks if overrides(h, stage)], constraints)
            for stage in STAGES}


def format_stage_table(table, priority_of):
    """A readable per-stage listing: ``priority_of(hook)`` gives the number to show."""
    from ..priority import Priority
    lines = []
    for stage, hooks in table.items():
        if not hooks:
            continue
        lines.append(f'{stage}:')
        for hook in hooks:
            value = priority_of(hook)
            label = Priority(value).name if value in Priority._value2member_map_ else str(value)
            lines.append(f'  ({label:<12}) {hook.name}')
    return '\n'.join(lines)
