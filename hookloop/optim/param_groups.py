"""The one writer of parameter-group hyper-parameters: every change to ``lr``, ``momentum`` /
``betas`` and their base values in ``optimizer.param_groups`` during a run goes through here.

Who calls it (docs/hooks.md, the contract table):

* per iteration or epoch, the schedule of the role: the LR / momentum updater hooks
  (``ParamScheduleHook.write``: :func:`set_lr`, :func:`set_momentum`; their base values:
  :func:`base_values`), ``TorchSchedulerHook`` (its torch scheduler is built with
  :func:`build_scheduler` and stepped with :func:`step_scheduler`; ModelScope's warm-up
  scheduler writes with :func:`set_lr` inside that step);
* at a resume, the trainer: the hyper-parameters a changed config sets (:func:`set_value`,
  through ``checkpoint.resume_changes``);
* at a rollback, ``CheckInvalidLossHook``: :func:`hyper_parameters` before loading the good
  optimizer state and :func:`restore_hyper_parameters` after, so the schedule stays where it is.

Optimizers (``step``, ``load_state_dict``) and torch's own schedulers write the groups too; that
is torch's business and happens inside the calls above. Nothing here syncs the device.
"""

# The keys a schedule or a config change writes (momentum: SGD's ``momentum`` or Adam's ``betas[0]``).
HYPER_PARAMETERS = ('lr', 'initial_lr', 'momentum', 'betas', 'initial_momentum', 'base_momentum', 'max_momentum')


def set_lr(groups, values):
    """``group['lr'] = value`` for each group and value."""
    for group, lr in zip(groups, values):
        group['lr'] = lr


def momentum_of(group):
    """SGD's ``momentum`` or the first of Adam-family ``betas``."""
    if 'momentum' in group:
        return group['momentum']
    return group['betas'][0]


def set_momentum(groups, values):
    """The momentum of each group (``momentum``, or ``betas[0]`` keeping ``betas[1]``)."""
    for group, momentum in zip(groups, values):
        if 'momentum' in group:
            group['momentum'] = momentum
        else:
            group['betas'] = (momentum, group['betas'][1])


def set_values(groups, key, values):
    """``group[key] = value`` for each group and value (a schedule's bounds, e.g. ``max_momentum``)."""
    for group, value in zip(groups, values):
        group[key] = value


def set_value(group, key, value):
    """One group's ``key`` (a resume's config change)."""
    group[key] = value


def base_values(groups, key, current):
    """The base value ``group[key]`` of each group (``initial_lr``, ``initial_momentum``), set to
    ``current(group)`` (or ``current[i]`` when a list) where the group has none."""
    for index, group in enumerate(groups):
        if key not in group:
            group[key] = current[index] if isinstance(current, (list, tuple)) else current(group)
    return [group[key] for group in groups]


def hyper_parameters(groups):
    """Everything but the parameters of each group (a copy, to restore later)."""
    return [{k: v for k, v in group.items() if k != 'params'} for group in groups]


def restore_hyper_parameters(groups, saved):
    """Put back what :func:`hyper_parameters` returned (after a ``load_state_dict`` brought older values)."""
    for group, values in zip(groups, saved):
        group.update(values)


def build_scheduler(build, optimizer):
    """``build(optimizer)``: a torch scheduler's construction sets ``initial_lr`` and makes its first step."""
    return build(optimizer)


def step_scheduler(scheduler):
    """One step of a torch LR scheduler (it writes the groups' ``lr``)."""
    scheduler.step()


__all__ = ['HYPER_PARAMETERS', 'set_lr', 'momentum_of', 'set_momentum', 'set_values', 'set_value', 'base_values',
           'hyper_parameters', 'restore_hyper_parameters', 'build_scheduler', 'step_scheduler']
