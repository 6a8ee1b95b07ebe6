"""Learning-rate and momentum schedules as pure functions of training progress.

Every function here maps (base value, progress, schedule arguments) to the value
for that point of training, with no hidden state: the hooks in
``hookloop.hooks.lr_updater`` and ``hookloop.hooks.momentum_updater`` call them at
each epoch or iteration, so a resumed run applies exactly the values of an
uninterrupted one. The arithmetic follows MMCV 1.x operation for operation, so
the values agree with MMCV's to the last bit in practice (see ``docs/schedules.md``).

``progress`` is the 0-based epoch (``by_epoch=True``) or the 0-based global
iteration (``by_epoch=False``); ``max_progress`` is ``max_epochs`` or ``max_iters``.
"""
import math

WARMUP_KINDS = ('constant', 'linear', 'exp')


def annealing_cos(start, end, factor, weight=1.0):
    """Cosine from ``start`` (factor 0) to ``end`` (factor 1); ``weight`` scales the
    distance above ``end`` (CosineRestart's restart weights)."""
    cos_out = math.cos(math.pi * factor) + 1
    return end + 0.5 * weight * (start - end) * cos_out


def annealing_linear(start, end, factor):
    """Straight line from ``start`` (factor 0) to ``end`` (factor 1)."""
    return start + (end - start) * factor


ANNEALERS = {'cos': annealing_cos, 'linear': annealing_linear}


# -- warm-up -------------------------------------------------------------------------------
def warmup_factor(kind, cur_iter, warmup_iters, ratio):
    """The factor warm-up applies at iteration ``cur_iter`` (< ``warmup_iters``).

    The learning rate is ``regular * factor``; momentum is ``regular / factor``
    (momentum warms up *down* to its regular value, as in MMCV).
    ``constant``: ``ratio``; ``linear``: from ``ratio`` towards 1 in a straight line;
    ``exp``: ``ratio ** (1 - cur_iter / warmup_iters)``.
    """
    if kind == 'constant':
        return ratio
    if kind == 'linear':
        return 1 - (1 - cur_iter / warmup_iters) * (1 - ratio)
    if kind == 'exp':
        return ratio ** (1 - cur_iter / warmup_iters)
    raise ValueError(f'unknown warm-up {kind!r}; use one of {", ".join(WARMUP_KINDS)}')


# -- regular values -------------------------------------------------------------------------
def step_value(base, progress, step, gamma, min_value=None):
    """``base * gamma ** k``: ``k = progress // step`` for an int ``step``, or the number of
    milestones in the (increasing) list ``step`` already reached; then at least ``min_value``."""
    if isinstance(step, int):
        exponent = progress // step
    else:
        exponent = sum(1 for milestone in step if progress >= milestone)
    value = base * (gamma ** exponent)
    if min_value is not None:
        value = max(value, min_value)
    return value


def exp_value(base, progress, gamma):
    return base * gamma ** progress


def poly_value(base, progress, max_progress, power, min_value):
    coeff = (1 - progress / max_progress) ** power
    return (base - min_value) * coeff + min_value


def inv_value(base, progress, gamma, power):
    return base * (1 + gamma * progress) ** (-power)


def cosine_value(base, progress, max_progress, target):
    return annealing_cos(base, target, progress / max_progress)


def linear_annealing_value(base, progress, max_progress, target):
    return annealing_linear(base, target, progress / max_progress)


def flat_cosine_value(base, progress, max_progress, start_percent, target):
    """``base`` until ``round(max_progress * start_percent)`` (Python's round: halves go to
    the even number), then cosine to ``target`` over the rest."""
    start = round(max_progress * start_percent)
    if progress < start:
        return base
    return annealing_cos(base, target, (progress - start) / (max_progress - start))


def cosine_restart_value(base, progress, periods, restart_weights, target):
    """Cosine over each period in turn; period ``i`` starts at ``target +
    restart_weights[i] * (base - target)``. ``progress`` past the last period is an error."""
    end = 0
    for period, weight in zip(periods, restart_weights):
        start, end = end, end + period
        if progress < end:
            alpha = min((progress - start) / period, 1)
            return annealing_cos(base, target, alpha, weight)
    raise ValueError(f'progress {progress} is past the end of the periods {list(periods)} '
                     f'(they cover {end})')


def cyclic_phases(max_iters, cyclic_times, step_ratio_up):
    """``(iterations per cycle, iterations going up)`` of a Cyclic schedule."""
    per_cycle = max_iters // cyclic_times
    return per_cycle, int(step_ratio_up * per_cycle)


def cyclic_value(base, cur_iter, max_iters, target_ratio, cyclic_times, step_ratio_up, anneal='cos',
                 gamma=1.0):
    """MMCV's Cyclic schedule: each of ``cyclic_times`` cycles goes from ``base`` to
    ``base * target_ratio[0]`` and then to ``base * target_ratio[1]``; with ``gamma < 1``
    cycle ``c`` swings only ``gamma ** c`` of the way to ``target_ratio[0]``."""
    per_cycle, up = cyclic_phases(max_iters, cyclic_times, step_ratio_up)
    in_cycle, cycle = cur_iter % per_cycle, cur_iter // per_cycle
    scale = gamma ** cycle
    anneal = ANNEALERS[anneal]
    if in_cycle < up:
        start_ratio, end_ratio = 1, 1 - scale + target_ratio[0] * scale
        return anneal(base * start_ratio, base * end_ratio, in_cycle / up)
    start_ratio, end_ratio = 1 - scale + target_ratio[0] * scale, target_ratio[1]
    return anneal(base * start_ratio, base * end_ratio, (in_cycle - up) / (per_cycle - up))


def one_cycle_phases(total_steps, pct_start, three_phase):
    """The last iteration of each OneCycle phase (MMCV's float arithmetic)."""
    if three_phase:
        return [float(pct_start * total_steps) - 1, float(2 * pct_start * total_steps) - 2, total_steps - 1]
    return [float(pct_start * total_steps) - 1, total_steps - 1]


def _phased(cur_iter, ends, values, anneal):
    """Anneal between ``values[i]`` and ``values[i + 1]`` over the phase ending at ``ends[i]``;
    the last phase extends past its end."""
    start = 0
    for i, end in enumerate(ends):
        if cur_iter <= end or i == len(ends) - 1:
            return anneal(values[i], values[i + 1], (cur_iter - start) / (end - start))
        start = end


def one_cycle_lr(initial, cur_iter, total_steps, pct_start=0.3, div_factor=25, final_div_factor=1e4,
                 three_phase=False, anneal='cos'):
    """OneCycle learning rate; ``initial = max_lr / div_factor``. Rises to ``max_lr`` by
    ``pct_start * total_steps``, then falls to ``initial / final_div_factor`` (with
    ``three_phase``: falls back to ``initial`` first, then to the minimum)."""
    ends = one_cycle_phases(total_steps, pct_start, three_phase)
    if three_phase:
        factors = [1, div_factor, 1, 1 / final_div_factor]
    else:
        factors = [1, div_factor, 1 / final_div_factor]
    return _phased(cur_iter, ends, [initial * f for f in factors], ANNEALERS[anneal])


def one_cycle_momentum(cur_iter, max_iters, base_momentum, max_momentum, pct_start=0.3, three_phase=False,
                       anneal='cos'):
    """OneCycle momentum, the mirror of the learning rate: from ``max_momentum`` down to
    ``base_momentum`` at the peak, then back up (it stays at ``max_momentum`` in the third phase)."""
    ends = one_cycle_phases(max_iters, pct_start, three_phase)
    if three_phase:
        values = [max_momentum, base_momentum, max_momentum, max_momentum]
    else:
        values = [max_momentum, base_momentum, max_momentum]
    return _phased(cur_iter, ends, values, ANNEALERS[anneal])


__all__ = ['WARMUP_KINDS', 'ANNEALERS', 'annealing_cos', 'annealing_linear', 'warmup_factor', 'step_value',
           'exp_value', 'poly_value', 'inv_value', 'cosine_value', 'linear_annealing_value',
           'flat_cosine_value', 'cosine_restart_value', 'cyclic_phases', 'cyclic_value', 'one_cycle_phases',
           'one_cycle_lr', 'one_cycle_momentum']
