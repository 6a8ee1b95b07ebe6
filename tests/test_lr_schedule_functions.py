"""The pure schedule functions, without a trainer: landmarks each policy must hit."""
import math

import pytest

from hookloop.optim import schedules


def test_annealing_endpoints_and_restart_weight():
    assert schedules.annealing_cos(1.0, 0.1, 0) == 1.0
    assert schedules.annealing_cos(1.0, 0.1, 1) == pytest.approx(0.1, abs=1e-15)
    assert schedules.annealing_cos(1.0, 0.1, 0.5) == pytest.approx(0.55)
    # weight scales the distance above the end value
    assert schedules.annealing_cos(1.0, 0.1, 0, weight=0.5) == pytest.approx(0.1 + 0.5 * 0.9)
    assert schedules.annealing_linear(2.0, 1.0, 0.25) == 1.75


@pytest.mark.parametrize('kind,expected', [('constant', [0.2, 0.2, 0.2, 0.2]),
                                           ('linear', [0.2, 0.4, 0.6, 0.8]),
                                           ('exp', [0.2 ** 1, 0.2 ** 0.75, 0.2 ** 0.5, 0.2 ** 0.25])])
def test_warmup_factor_rises_towards_one(kind, expected):
    assert [schedules.warmup_factor(kind, i, 4, 0.2) for i in range(4)] == pytest.approx(expected, rel=1e-12)


def test_warmup_factor_refuses_unknown_kind():
    with pytest.raises(ValueError, match="unknown warm-up 'cosine'"):
        schedules.warmup_factor('cosine', 0, 4, 0.2)


def test_step_list_counts_reached_milestones_and_clips_to_min():
    values = [schedules.step_value(1.0, p, [2, 5], 0.1) for p in range(7)]
    assert values == pytest.approx([1, 1, 0.1, 0.1, 0.1, 0.01, 0.01])
    assert schedules.step_value(1.0, 6, [2, 5], 0.1, min_value=0.05) == 0.05
    assert [schedules.step_value(1.0, p, 3, 0.5) for p in (0, 2, 3, 6, 8)] == [1, 1, 0.5, 0.25, 0.25]


def test_flat_cosine_uses_python_rounding_for_the_flat_part():
    # round(0.25 * 10) = round(2.5) = 2 (halves round to even), so progress 2 is the first annealed one
    values = [schedules.flat_cosine_value(1.0, p, 10, 0.25, 0.0) for p in range(4)]
    assert values[:2] == [1.0, 1.0]
    assert values[2] == 1.0  # factor 0: cosine starts at the base
    assert values[3] == pytest.approx(0.5 * (1 + math.cos(math.pi / 8)))


def test_cosine_restart_restarts_at_the_weight_and_refuses_progress_past_the_periods():
    values = [schedules.cosine_restart_value(1.0, p, [4, 4], [1.0, 0.5], 0.0) for p in range(8)]
    assert values[0] == 1.0 and values[4] == 0.5
    assert values[3] == pytest.approx(0.5 * (1 + math.cos(math.pi * 3 / 4)))
    with pytest.raises(ValueError, match='past the end of the periods'):
        schedules.cosine_restart_value(1.0, 8, [4, 4], [1.0, 0.5], 0.0)


def test_cyclic_cycles_peak_and_decay_with_gamma():
    # 20 iterations, 2 cycles of 10, 4 going up: peaks (approached) at 4 and 14
    lr = [schedules.cyclic_value(1.0, i, 20, (10, 1e-4), 2, 0.4, 'linear', gamma=0.5) for i in range(20)]
    assert lr[0] == 1.0 and lr[4] == pytest.approx(10) and lr[10] == 1.0
    assert lr[14] == pytest.approx(1 - 0.5 + 10 * 0.5)  # the second cycle reaches only half-way up
    assert lr[9] == pytest.approx(10 + (1e-4 - 10) * 5 / 6)


def test_one_cycle_lr_starts_at_initial_peaks_at_max_ends_at_minimum():
    lr = [schedules.one_cycle_lr(0.04, i, 101, pct_start=0.3, div_factor=25, final_div_factor=1e4) for i in range(101)]
    assert lr[0] == pytest.approx(0.04)
    assert max(lr) == pytest.approx(1.0, rel=1e-3)
    assert lr[-1] == pytest.approx(0.04 / 1e4)


def test_one_cycle_three_phase_returns_to_initial_before_the_final_fall():
    lr = [schedules.one_cycle_lr(1.0, i, 21, pct_start=0.5, div_factor=10, three_phase=True, anneal='linear')
          for i in range(21)]
    # phase ends at 9.5, 19, 20
    assert lr[19] == pytest.approx(1.0)
    assert lr[20] == pytest.approx(1e-4)


def test_one_cycle_momentum_mirrors_the_learning_rate():
    momentum = [schedules.one_cycle_momentum(i, 11, 0.85, 0.95, pct_start=0.5, anneal='linear') for i in range(11)]
    # phase ends at 4.5 and 10
    assert momentum[0] == 0.95 and momentum[10] == pytest.approx(0.95)
    assert momentum[4] == pytest.approx(0.95 + (0.85 - 0.95) * 4 / 4.5)
    assert momentum[5] == pytest.approx(0.85 + 0.1 * 0.5 / 5.5)
