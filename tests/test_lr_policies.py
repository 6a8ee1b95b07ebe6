"""Every LR policy, by epoch and by iteration, with every warm-up kind: the full sequence
of learning rates applied to two parameter groups, against MMCV 1.x's formulas written
out here in closed form (6 epochs of 5 iterations; progress p of P)."""
import math

import pytest

from schedule_recording import ITERS_PER_EPOCH, LRS, assert_sequence, record

EPOCHS = 6
ITERS = EPOCHS * ITERS_PER_EPOCH


def cos_anneal(start, end, factor, weight=1.0):
    return end + 0.5 * weight * (start - end) * (math.cos(math.pi * factor) + 1)


# name -> (config given the unit s: 1 per epoch, 5 per iteration, expected(p, P, base, s))
POLICIES = {
    'Fixed': (lambda s: dict(policy='Fixed'), lambda p, P, b, s: b),
    'Step-int': (lambda s: dict(policy='Step', step=2 * s, gamma=0.5),
                 lambda p, P, b, s: b * 0.5 ** (p // (2 * s))),
    # min_lr is absolute: it clips group 1 (0.002 -> 2e-5) but not group 0 (1e-4)
    'Step-list-min_lr': (lambda s: dict(policy='step', step=[2 * s, 4 * s], gamma=0.1, min_lr=5e-5),
                         lambda p, P, b, s: max(b * 0.1 ** ((p >= 2 * s) + (p >= 4 * s)), 5e-5)),
    'Exp': (lambda s: dict(policy='Exp', gamma=0.9), lambda p, P, b, s: b * 0.9 ** p),
    'Poly': (lambda s: dict(policy='Poly', power=2.0, min_lr=1e-4),
             lambda p, P, b, s: (b - 1e-4) * (1 - p / P) ** 2 + 1e-4),
    'Inv': (lambda s: dict(policy='Inv', gamma=0.5, power=0.75), lambda p, P, b, s: b * (1 + 0.5 * p) ** -0.75),
    'CosineAnnealing-ratio': (lambda s: dict(policy='CosineAnnealing', min_lr_ratio=0.1),
                              lambda p, P, b, s: 0.1 * b + 0.5 * (b - 0.1 * b) * (1 + math.cos(math.pi * p / P))),
    'CosineAnnealing-min_lr': (lambda s: dict(policy='cosineannealing', min_lr=1e-4),
                               lambda p, P, b, s: 1e-4 + 0.5 * (b - 1e-4) * (1 + math.cos(math.pi * p / P))),
    # the flat part ends at round(0.75 * P): 4 of 6 epochs (4.5 rounds to even), 22 of 30 iterations
    'FlatCosineAnnealing': (lambda s: dict(policy='FlatCosineAnnealing', start_percent=0.75, min_lr=1e-4),
                            lambda p, P, b, s: b if p < {6: 4, 30: 22}[P]
                            else cos_anneal(b, 1e-4, (p - {6: 4, 30: 22}[P]) / (P - {6: 4, 30: 22}[P]))),
    'CosineRestart': (lambda s: dict(policy='CosineRestart', periods=[2 * s, 4 * s], restart_weights=[1, 0.5],
                                     min_lr_ratio=0.01),
                      lambda p, P, b, s: cos_anneal(b, 0.01 * b, p / (2 * s)) if p < 2 * s
                      else cos_anneal(b, 0.01 * b, (p - 2 * s) / (4 * s), 0.5)),
    'LinearAnnealing': (lambda s: dict(policy='LinearAnnealing', min_lr_ratio=0.05),
                        lambda p, P, b, s: b + (0.05 * b - b) * p / P),
}


def cyclic_expected(i, b, per_cycle=15, up=6, high=10, low=1e-4, gamma=0.5, anneal=cos_anneal):
    cycle, r = divmod(i, per_cycle)
    peak = 1 - gamma ** cycle + high * gamma ** cycle
    if r < up:
        return anneal(b, b * peak, r / up)
    return anneal(b * peak, b * low, (r - up) / (per_cycle - up))


def linear(start, end, factor):
    return start + (end - start) * factor


MAX_LRS = (0.05, 0.01)


def one_cycle_expected(i, g):
    """pct_start 0.25 of 30 steps: the peak phase ends at 0.25 * 30 - 1 = 6.5."""
    initial, peak = MAX_LRS[g] / 25, MAX_LRS[g]
    if i <= 6.5:
        return cos_anneal(initial, peak, i / 6.5)
    return cos_anneal(peak, initial / 1e4, (i - 6.5) / (29 - 6.5))


def one_cycle_three_phase_expected(i, g):
    """total_steps 40 (longer than the run), linear: ends at 11, 22, 39."""
    initial, peak = MAX_LRS[g] / 10, MAX_LRS[g]
    if i <= 11:
        return linear(initial, peak, i / 11)
    if i <= 22:
        return linear(peak, initial, (i - 11) / 11)
    return linear(initial, initial / 100, (i - 22) / 17)


# iteration-only policies: config and expected(i, group index, base)
ITER_POLICIES = {
    'Cyclic-cos-gamma': (dict(policy='Cyclic', target_ratio=(10, 1e-4), cyclic_times=2, step_ratio_up=0.4,
                              gamma=0.5),
                         lambda i, g, b: cyclic_expected(i, b)),
    'Cyclic-linear-float': (dict(policy='Cyclic', target_ratio=5.0, cyclic_times=3, step_ratio_up=0.3,
                                 anneal_strategy='linear'),
                            lambda i, g, b: cyclic_expected(i, b, per_cycle=10, up=3, high=5.0, low=5.0 / 1e5,
                                                            gamma=1, anneal=linear)),
    'OneCycle': (dict(policy='OneCycle', max_lr=list(MAX_LRS), pct_start=0.25),
                 lambda i, g, b: one_cycle_expected(i, g)),
    'OneCycle-three-phase': (dict(policy='OneCycle', max_lr=list(MAX_LRS), total_steps=40, pct_start=0.3,
                                  anneal_strategy='linear', div_factor=10, final_div_factor=100,
                                  three_phase=True),
                             lambda i, g, b: one_cycle_three_phase_expected(i, g)),
}

# warm-up kind -> factor(i, W, ratio) on the regular learning rate for i < W
WARMUPS = {
    None: None,
    'constant': lambda i, W, r: r,
    'linear': lambda i, W, r: 1 - (1 - i / W) * (1 - r),
    'exp': lambda i, W, r: r ** (1 - i / W),
}
WARMUP_ITERS, WARMUP_RATIO = 7, 0.25  # 7 iterations: the warm-up crosses an epoch boundary


def expected_lrs(regular, warmup, warmup_iters=WARMUP_ITERS, ratio=WARMUP_RATIO):
    """regular(i, group) -> the applied sequence: warm-up scales the regular value for i < W."""
    rows = []
    for i in range(ITERS):
        row = [regular(i, g) for g in range(len(LRS))]
        if warmup is not None and i < warmup_iters:
            row = [lr * WARMUPS[warmup](i, warmup_iters, ratio) for lr in row]
        rows.append(row)
    return rows


def warmup_cfg(warmup):
    return {} if warmup is None else dict(warmup=warmup, warmup_iters=WARMUP_ITERS, warmup_ratio=WARMUP_RATIO)


def combinations(policies, full=()):
    """Each policy without warm-up and with one warm-up kind (taking turns); the policies in
    ``full`` with every kind. (The warm-up code is shared by all policies; the full cross
    product would only repeat it at 0.3 s a run.)"""
    kinds = [k for k in WARMUPS if k is not None]
    for n, policy in enumerate(policies):
        for warmup in list(WARMUPS) if policy in full else [None, kinds[n % len(kinds)]]:
            yield policy, warmup


@pytest.mark.parametrize('by_epoch', [True, False], ids=['by_epoch', 'by_iter'])
@pytest.mark.parametrize('policy,warmup', list(combinations(POLICIES, full=('Step-list-min_lr',
                                                                           'CosineAnnealing-ratio'))))
def test_policy_applies_mmcv_learning_rates(tmp_path, policy, by_epoch, warmup):
    make_cfg, formula = POLICIES[policy]
    unit = 1 if by_epoch else ITERS_PER_EPOCH
    cfg = dict(make_cfg(unit), by_epoch=by_epoch, **warmup_cfg(warmup))
    recorder = record(tmp_path, lr_config=cfg)

    def regular(i, g):
        p, P = (i // ITERS_PER_EPOCH, EPOCHS) if by_epoch else (i, ITERS)
        return formula(p, P, LRS[g], unit)
    assert_sequence(recorder.lrs, expected_lrs(regular, warmup))


@pytest.mark.parametrize('policy,warmup', list(combinations(ITER_POLICIES, full=('OneCycle',))))
def test_iteration_policy_applies_mmcv_learning_rates(tmp_path, policy, warmup):
    cfg, formula = ITER_POLICIES[policy]
    recorder = record(tmp_path, lr_config=dict(cfg, by_epoch=False, **warmup_cfg(warmup)))
    assert_sequence(recorder.lrs, expected_lrs(lambda i, g: formula(i, g, LRS[g]), warmup))


@pytest.mark.parametrize('by_epoch', [True, False], ids=['by_epoch', 'by_iter'])
@pytest.mark.parametrize('warmup', ['constant', 'linear', 'exp'])
def test_warmup_by_epoch_counts_epochs_of_iterations(tmp_path, warmup, by_epoch):
    # warmup_iters=2 with warmup_by_epoch means 2 * 5 = 10 iterations
    cfg = dict(policy='Step', step=[3 * (1 if by_epoch else ITERS_PER_EPOCH)], gamma=0.1, by_epoch=by_epoch,
               warmup=warmup, warmup_iters=2, warmup_ratio=0.1, warmup_by_epoch=True)
    recorder = record(tmp_path, lr_config=cfg)

    def regular(i, g):
        return LRS[g] * (0.1 if i >= 15 else 1)
    assert_sequence(recorder.lrs, expected_lrs(regular, warmup, warmup_iters=10, ratio=0.1))


def test_iteration_based_run_with_a_shortened_last_epoch(tmp_path):
    # max_iters=23: epochs of 5, the last one 3 long; by_epoch progress uses max_epochs = 5
    recorder = record(tmp_path, max_iters=23, lr_config=dict(policy='CosineAnnealing', min_lr=0.0, by_epoch=True,
                                                             warmup='linear', warmup_iters=3))
    expected = []
    for i in range(23):
        row = [0.5 * b * (1 + math.cos(math.pi * (i // 5) / 5)) for b in LRS]
        if i < 3:
            row = [lr * (1 - (1 - i / 3) * 0.9) for lr in row]
        expected.append(row)
    assert_sequence(recorder.lrs, expected)


def test_type_form_equals_policy_form(tmp_path):
    by_type = record(tmp_path / 'a', lr_config=dict(type='PolyLrUpdaterHook', power=1.5, by_epoch=False))
    by_policy = record(tmp_path / 'b', lr_config=dict(policy='Poly', power=1.5, by_epoch=False))
    assert by_type.lrs == by_policy.lrs
    assert by_type.lrs[-1][0] == pytest.approx(LRS[0] * (1 / ITERS) ** 1.5, rel=1e-12)
