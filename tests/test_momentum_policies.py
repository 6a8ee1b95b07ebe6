"""Every momentum policy, by epoch and by iteration, with warm-up, for SGD ``momentum``
and Adam ``betas[0]``: the full sequence applied to two parameter groups, against
MMCV 1.x's formulas written out here (6 epochs of 5 iterations)."""
import math

import pytest

from schedule_recording import ADAM_BETAS, ITERS_PER_EPOCH, SGD_MOMENTA, assert_sequence, record

EPOCHS = 6
ITERS = EPOCHS * ITERS_PER_EPOCH
BASES = {'SGD': SGD_MOMENTA, 'Adam': tuple(b[0] for b in ADAM_BETAS)}


def cos_anneal(start, end, factor):
    return end + 0.5 * (start - end) * (math.cos(math.pi * factor) + 1)


POLICIES = {
    'Step': (lambda s: dict(policy='Step', step=[2 * s, 4 * s], gamma=0.5, min_momentum=0.3),
             lambda p, P, b, s: max(b * 0.5 ** ((p >= 2 * s) + (p >= 4 * s)), 0.3)),
    'CosineAnnealing': (lambda s: dict(policy='CosineAnnealing', min_momentum_ratio=0.5),
                        lambda p, P, b, s: cos_anneal(b, 0.5 * b, p / P)),
    'LinearAnnealing': (lambda s: dict(policy='LinearAnnealing', min_momentum=0.5),
                        lambda p, P, b, s: b + (0.5 - b) * p / P),
}


def cyclic_expected(i, b):
    """Defaults target_ratio (0.85 / 0.95, 1), step_ratio_up 0.4; cyclic_times 2:
    cycles of 15 iterations, 6 going down."""
    r = i % 15
    if r < 6:
        return cos_anneal(b, b * 0.85 / 0.95, r / 6)
    return cos_anneal(b * 0.85 / 0.95, b * 1, (r - 6) / 9)


LOW, HIGH = (0.8, 0.85), (0.9, 0.93)


def one_cycle_expected(i, g):
    """pct_start 0.25 of max_iters 30: down from max to base by 6.5, back up by 29."""
    if i <= 6.5:
        return cos_anneal(HIGH[g], LOW[g], i / 6.5)
    return cos_anneal(LOW[g], HIGH[g], (i - 6.5) / (29 - 6.5))


ITER_POLICIES = {
    'Cyclic': (dict(policy='Cyclic', cyclic_times=2), lambda i, g, b: cyclic_expected(i, b)),
    'OneCycle': (dict(policy='OneCycle', base_momentum=list(LOW), max_momentum=list(HIGH), pct_start=0.25),
                 lambda i, g, b: one_cycle_expected(i, g)),
}

# momentum warm-up divides the regular value by the LR warm-up factor
WARMUPS = {
    None: None,
    'constant': lambda i, W, r: r,
    'linear': lambda i, W, r: 1 - (1 - i / W) * (1 - r),
    'exp': lambda i, W, r: r ** (1 - i / W),
}
WARMUP_ITERS, WARMUP_RATIO = 7, 0.95  # 0.9 would start beta1 = 0.9 / 0.9 = 1: Adam divides by zero


def expected_momenta(regular, warmup, groups=2):
    rows = []
    for i in range(ITERS):
        row = [regular(i, g) for g in range(groups)]
        if warmup is not None and i < WARMUP_ITERS:
            row = [m / WARMUPS[warmup](i, WARMUP_ITERS, WARMUP_RATIO) for m in row]
        rows.append(row)
    return rows


def warmup_cfg(warmup):
    return {} if warmup is None else dict(warmup=warmup, warmup_iters=WARMUP_ITERS, warmup_ratio=WARMUP_RATIO)


CASES = [(policy, warmup, optimizer) for policy in POLICIES for warmup in WARMUPS
         for optimizer in (['SGD', 'Adam'] if warmup in (None, 'linear') else ['SGD'])]


@pytest.mark.parametrize('by_epoch', [True, False], ids=['by_epoch', 'by_iter'])
@pytest.mark.parametrize('policy,warmup,optimizer', CASES)
def test_momentum_policy_applies_mmcv_values(tmp_path, policy, warmup, optimizer, by_epoch):
    make_cfg, formula = POLICIES[policy]
    unit = 1 if by_epoch else ITERS_PER_EPOCH
    recorder = record(tmp_path, optimizer=optimizer,
                      momentum_config=dict(make_cfg(unit), by_epoch=by_epoch, **warmup_cfg(warmup)))

    def regular(i, g):
        p, P = (i // ITERS_PER_EPOCH, EPOCHS) if by_epoch else (i, ITERS)
        return formula(p, P, BASES[optimizer][g], unit)
    assert_sequence(recorder.momenta, expected_momenta(regular, warmup))
    if optimizer == 'Adam':  # beta2 is left alone
        assert all(row == [b[1] for b in ADAM_BETAS] for row in recorder.beta2)


@pytest.mark.parametrize('optimizer', ['SGD', 'Adam'])
@pytest.mark.parametrize('warmup', [None, 'linear'])
@pytest.mark.parametrize('policy', list(ITER_POLICIES))
def test_iteration_momentum_policy_applies_mmcv_values(tmp_path, policy, warmup, optimizer):
    cfg, formula = ITER_POLICIES[policy]
    recorder = record(tmp_path, optimizer=optimizer, momentum_config=dict(cfg, **warmup_cfg(warmup)))
    expected = expected_momenta(lambda i, g: formula(i, g, BASES[optimizer][g]), warmup)
    assert_sequence(recorder.momenta, expected)


def test_one_cycle_lr_and_momentum_together(tmp_path):
    # the usual pairing: momentum is lowest where the learning rate peaks
    recorder = record(tmp_path, lr_config=dict(policy='OneCycle', max_lr=0.05, pct_start=0.25),
                      momentum_config=dict(policy='OneCycle', base_momentum=list(LOW), max_momentum=list(HIGH),
                                           pct_start=0.25))
    peak = max(range(ITERS), key=lambda i: recorder.lrs[i][0])
    low = min(range(ITERS), key=lambda i: recorder.momenta[i][0])
    assert peak == low == 7  # the first iteration past the phase end 6.5
    assert_sequence(recorder.momenta, expected_momenta(lambda i, g: one_cycle_expected(i, g), None))
