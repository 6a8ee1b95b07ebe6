"""The hook life cycle and the contracts between hooks (issue 11): set-up once per trainer,
``train()`` again after a stop, the step state, the resume point, ordering, and the MMCV
semantics the seams used to miss. Each test names the behaviour it pins down."""
import glob
import json
import math
import os
import weakref

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data, train_and_close
from hookloop import ConfigError, Hook, Trainer, auto_fp16, force_fp32
from hookloop.engine.evaluator import take_first
from hookloop.hooks import CheckInvalidLossHook, EMAHook
from hookloop.hooks.timer import IterTimerHook


def make(work_dir, model=None, epochs=2, batch_size=4, **kwargs):
    """40 samples / batch 4 = 10 iterations per epoch, shuffled, SGD with momentum."""
    return Trainer(model or Regressor(), optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
                   train_dataloader=DataLoader(regression_data(), batch_size=batch_size, shuffle=True),
                   max_epochs=epochs, work_dir=work_dir, seed=3, device='cpu', log_level='WARNING', **kwargs)


def ema_of(trainer):
    return next(h for h in trainer.hooks if isinstance(h, EMAHook)).ema_state_dict()


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def text_log(work_dir):
    return ''.join(open(p, encoding='utf-8').read() for p in glob.glob(os.path.join(work_dir, '*.log')))


def json_events(work_dir):
    records = []
    for path in sorted(glob.glob(os.path.join(work_dir, '*.log.json'))):
        records += [json.loads(line) for line in open(path, encoding='utf-8') if '"mode"' in line]
    return records


class StopAt(Hook):
    """Requests a stop after global iteration ``at`` (0-based), once; ``None`` never stops."""

    def __init__(self, at):
        self.at = at

    def after_train_iter(self, trainer):
        if trainer.iter == self.at:
            self.at = None
            trainer.request_stop('test stop')


# -- set-up once, run many ------------------------------------------------------------------
def test_train_again_after_a_stop_is_bitwise_one_uninterrupted_run_with_ema_fp16_and_accumulation(tmp_path):
    # fp16 on the CPU: autocast(float16) + GradScaler('cpu'), the path test_amp.py checks.
    options = dict(lr_config=dict(policy='CosineAnnealing', min_lr=0, warmup='linear', warmup_iters=3, by_epoch=False),
                   optimizer_config=dict(cumulative_iters=4, precision='fp16',
                                         loss_scale=dict(init_scale=2. ** 10, growth_interval=2)),
                   custom_hooks=[dict(type='EMAHook', momentum=0.1, warm_up=1)])
    results = []
    for name, stop_at in (('whole', None), ('stopped', 5)):  # 5: the middle of the window 4..7
        torch.manual_seed(0)
        trainer = make(tmp_path / name, **options)
        trainer.register_hook(StopAt(stop_at))
        trainer.train()
        if stop_at is not None:
            assert trainer.iter == stop_at + 1 and trainer.stop_reason == 'test stop'
            trainer.train()
        trainer.close()
        assert trainer.iter == 20
        optimizer_hook = next(h for h in trainer.hooks if type(h).__name__ == 'OptimizerHook')
        results.append((trainer.model.state_dict(), ema_of(trainer), optimizer_hook.state_dict()['scaler'],
                        trainer.optimizer.state_dict()['state']))
    (weights, ema, scaler, state), (weights2, ema2, scaler2, state2) = results
    assert same(weights, weights2)
    assert same(ema, ema2)
    assert scaler == scaler2 and scaler['_growth_tracker'] is not None
    assert all(torch.equal(state[k]['momentum_buffer'], state2[k]['momentum_buffer']) for k in state)


def test_setup_runs_once_per_trainer_and_before_run_once_per_train_call(tmp_path):
    calls = []

    class Counted(Hook):
        def setup(self, trainer):
            calls.append('setup')

        def before_run(self, trainer):
            calls.append('before_run')
    trainer = make(tmp_path, epochs=1, val_dataloader=DataLoader(regression_data(n=4), batch_size=4),
                   val_evaluator=lambda outputs, batch: {'mse': 1.0})
    trainer.register_hook(Counted())
    trainer.register_hook(StopAt(3))
    trainer.val()  # validation before training sets the hooks up too (autocast for its forward)
    trainer.train()
    train_and_close(trainer)
    assert calls == ['setup', 'before_run', 'before_run']


def test_ema_added_on_a_resume_without_ema_state_starts_from_the_resumed_weights(tmp_path):
    source = train_and_close(make(tmp_path / 'a', checkpoint_config=dict(interval=1)))
    resumed = make(tmp_path / 'b', model=Regressor(), custom_hooks=[dict(type='EMAHook', momentum=0.5)],
                   resume_from=str(tmp_path / 'a' / 'epoch_2.pth'))  # nothing left to train
    train_and_close(resumed)
    assert same(ema_of(resumed), source.model.state_dict())


def test_registering_a_hook_during_a_run_is_refused_and_works_between_runs(tmp_path):
    late = []

    class Late(Hook):
        def after_train_iter(self, trainer):
            late.append(trainer.iter)

    class RegistersInRun(Hook):
        tried = False

        def after_train_iter(self, trainer):
            if not self.tried:
                self.tried = True
                trainer.register_hook(Late())
    trainer = make(tmp_path, epochs=1)
    trainer.register_hook(RegistersInRun())
    with pytest.raises(ConfigError, match=r'cannot register Late while train\(\) runs: the hooks of a run are '
                                          r'fixed'):
        trainer.train()
    trainer.register_hook(Late())  # between runs: taken in by the next train()
    train_and_close(trainer)
    assert late == list(range(10))  # the failed iteration 0 runs again


def test_ema_state_dict_averages_tied_weights_under_every_name(tmp_path):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.encode = nn.Linear(4, 4, bias=False)
            self.decode = nn.Linear(4, 4, bias=False)
            self.decode.weight = self.encode.weight  # one tensor, two names
            self.head = nn.Linear(4, 1)

        def forward(self, x, y):
            return nn.functional.mse_loss(self.head(torch.tanh(self.decode(torch.tanh(self.encode(x))))), y)
    model = Tied()
    trainer = train_and_close(make(tmp_path, model=model, epochs=1,
                                   custom_hooks=[dict(type='EMAHook', momentum=0.5, warm_up=1)]))
    ema = ema_of(trainer)
    assert set(ema) == set(model.state_dict()) >= {'encode.weight', 'decode.weight'}
    assert torch.equal(ema['encode.weight'], ema['decode.weight'])
    assert not torch.equal(ema['decode.weight'], model.decode.weight)  # the average, not the raw weight


# -- the best checkpoint --------------------------------------------------------------------
def scripted_evaluator(values):
    """An evaluator returning the next of ``values`` as ``mse`` at each validation."""
    scores = iter(values)

    class Scripted:
        def reset(self):
            pass

        def update(self, outputs, batch):
            pass

        def compute(self):
            value = next(scores)
            return {} if value is None else {'mse': value}
    return Scripted()


def test_a_nan_first_score_never_becomes_the_best(tmp_path):
    trainer = make(tmp_path, epochs=3, val_dataloader=DataLoader(regression_data(n=8), batch_size=4),
                   val_evaluator=scripted_evaluator([math.nan, 2.0, 3.0]),
                   evaluation=dict(interval=1, save_best='mse', rule='less'))
    train_and_close(trainer)
    assert sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / 'best_*.pth'))) == ['best_mse_epoch_2.pth']
    assert 'mse = nan is not finite; it is ignored for the best checkpoint' in text_log(tmp_path)


def test_save_best_meeting_an_empty_result_warns(tmp_path):
    trainer = make(tmp_path, epochs=2, val_dataloader=DataLoader(regression_data(n=8), batch_size=4),
                   val_evaluator=scripted_evaluator([None, 1.0]),
                   checkpoint_config=dict(interval=1, save_best='mse'))
    train_and_close(trainer)
    assert "save_best='mse': the evaluation returned no metrics" in text_log(tmp_path)
    assert [os.path.basename(p) for p in glob.glob(str(tmp_path / 'best_*.pth'))] == ['best_mse_epoch_2.pth']


# -- logging and timing ---------------------------------------------------------------------
class RecordLoss(Hook):
    def __init__(self):
        self.losses = {}

    def after_train_iter(self, trainer):
        self.losses[(trainer.epoch, trainer.inner_iter)] = trainer.outputs['loss'].item()


def test_logged_averages_restart_with_every_epoch(tmp_path):
    recorder = RecordLoss()
    trainer = make(tmp_path, log_config=dict(interval=3, hooks=[dict(type='TextLoggerHook')]))
    trainer.register_hook(recorder)
    train_and_close(trainer)
    first_of_epoch_2 = next(r for r in json_events(tmp_path) if r['mode'] == 'train' and r['epoch'] == 2)
    assert first_of_epoch_2['inner_iter'] == 3
    expected = sum(recorder.losses[(1, i)] for i in range(3)) / 3  # not the ignored 10th of epoch 1
    assert first_of_epoch_2['loss'] == pytest.approx(expected, rel=1e-5)


class FakeClock:
    """Seconds that pass only when a test says so (no wall-clock assertions)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Ticks(Hook):
    """Every training iteration takes ``seconds`` on the fake clock."""
    PRIORITY = 'HIGHEST'

    def __init__(self, clock, seconds):
        self.clock, self.seconds = clock, seconds

    def after_train_iter(self, trainer):
        self.clock.now += self.seconds


def test_iteration_time_leaves_validation_out(tmp_path):
    clock = FakeClock()

    def slow_metric(outputs, batch):
        clock.now += 5.0  # a validation 500 times as long as an iteration
        return {'mse': 1.0}
    trainer = make(tmp_path, epochs=1, val_dataloader=DataLoader(regression_data(n=4), batch_size=4),
                   val_evaluator=slow_metric, evaluation=dict(interval=2, by_epoch=False),
                   custom_hooks=[IterTimerHook(clock=clock), Ticks(clock, 0.01)],
                   log_config=dict(interval=1, hooks=[dict(type='TextLoggerHook', by_epoch=False)]))
    train_and_close(trainer)
    train = [r for r in json_events(tmp_path) if r['mode'] == 'train']
    assert len(train) == 10 and all(r['time'] == pytest.approx(0.01) for r in train)


def test_validation_inside_an_iteration_is_logged_after_that_iterations_train_record(tmp_path):
    trainer = make(tmp_path, epochs=1, val_dataloader=DataLoader(regression_data(n=4), batch_size=4),
                   val_evaluator=lambda outputs, batch: {'mse': 1.0}, evaluation=dict(interval=2, by_epoch=False),
                   log_config=dict(interval=2, hooks=[dict(type='TextLoggerHook', by_epoch=False)]))
    train_and_close(trainer)
    order = [(r['mode'], r['iter']) for r in json_events(tmp_path)]
    assert order == [(mode, n) for n in (2, 4, 6, 8, 10) for mode in ('train', 'val')]


# -- the skip policy frees the dropped iteration at once ------------------------------------
class WatchedModel(Regressor):
    """Keeps a weak reference to each forward's hidden activation (saved by tanh for backward)
    and returns a NaN loss at call ``bad``."""

    def __init__(self, bad):
        super().__init__()
        self.bad, self.calls, self.activation = bad, 0, None

    def forward(self, x, y):
        hidden = torch.tanh(self.net[0](x))
        self.activation = weakref.ref(hidden)
        loss = nn.functional.mse_loss(self.net[2](hidden), y)
        self.calls += 1
        return loss * math.nan if self.calls == self.bad + 1 else loss


def test_skip_policy_frees_the_dropped_iterations_graph_before_the_next_forward(tmp_path):
    model = WatchedModel(bad=3)
    alive = []

    class Watch(Hook):
        def before_train_iter(self, trainer):
            if model.activation is not None:
                alive.append(model.activation() is not None)
    trainer = make(tmp_path, model=model, epochs=1, custom_hooks=[CheckInvalidLossHook(on_invalid='skip')])
    trainer.register_hook(Watch())
    train_and_close(trainer)
    assert alive == [False] * 9  # the skipped iteration 3 included


# -- distributed padding removal --------------------------------------------------------------
def test_padding_removal_cuts_lists_and_tuples_of_per_sample_values():
    batch = {'x': torch.arange(8.).reshape(4, 2), 'names': ['a', 'b', 'c', 'd'], 'ids': (10, 11, 12, 13),
             'shape': [2, 2]}
    outputs = {'logits': torch.ones(4, 3), 'tokens': ['t0', 't1', 't2', 't3']}
    kept_outputs, kept, left = take_first(outputs, batch, 3)
    assert left == 0 and kept['names'] == ['a', 'b', 'c'] and kept['ids'] == (10, 11, 12)
    assert kept['shape'] == [2, 2] and kept['x'].shape == (3, 2)  # not per sample: the length differs
    assert kept_outputs['tokens'] == ['t0', 't1', 't2'] and kept_outputs['logits'].shape == (3, 3)
    fields = (torch.zeros(3, 2), torch.arange(3))  # a tuple batch holds fields, even when len == batch size
    _, (x, y), _ = take_first(None, fields, 2)
    assert x.shape == (2, 2) and y.tolist() == [0, 1]


# -- MMCV semantics -------------------------------------------------------------------------------
class Validations(Hook):
    def __init__(self):
        self.seen = []

    def after_val_epoch(self, trainer):
        self.seen.append((trainer.epoch, trainer.iter))


def validating(work_dir, epochs, start, **kwargs):
    watch = Validations()
    trainer = make(work_dir, epochs=epochs, val_dataloader=DataLoader(regression_data(n=4), batch_size=4),
                   val_evaluator=lambda outputs, batch: {'mse': 1.0}, evaluation=dict(interval=1, start=start),
                   **kwargs)
    trainer.register_hook(watch)
    train_and_close(trainer)
    return watch.seen


def test_evaluation_start_evaluates_before_training_when_the_run_begins_at_or_past_it(tmp_path):
    # (epoch, iter) at each validation; epoch-end ones see the index of the epoch just completed
    assert validating(tmp_path / 'a', 2, start=0, checkpoint_config=dict(interval=1)) == [(0, 0), (0, 10), (1, 20)]
    resumed = dict(resume_from=str(tmp_path / 'a' / 'epoch_2.pth'))
    assert validating(tmp_path / 'b', 3, start=1, **resumed) == [(2, 20), (2, 30)]
    assert validating(tmp_path / 'c', 3, start=3, **resumed) == [(2, 30)]  # begins before start
    assert validating(tmp_path / 'd', 1, start=None) == [(0, 10)]


def test_ema_warm_up_zero_is_accepted_and_means_no_warm_up(tmp_path):
    model = Regressor()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = make(tmp_path, model=model, epochs=1, custom_hooks=[EMAHook(momentum=0.5, warm_up=0)])
    recorded = []
    # between the optimizer step (ABOVE_NORMAL=40) and the EMA update (NORMAL=50)
    trainer.register_hook(type('Snap', (Hook,), {'PRIORITY': 45, 'after_train_iter': lambda self, t: recorded.append(
        {k: v.clone() for k, v in t.model.state_dict().items()})})())
    train_and_close(trainer)
    expected = start
    for weights in recorded:  # every iteration: ema = 0.5 * ema + 0.5 * weights
        expected = {k: expected[k] * 0.5 + weights[k] * 0.5 for k in expected}
    assert all(torch.allclose(ema_of(trainer)[k], expected[k], atol=1e-6) for k in expected)


def test_fp16_decorators_on_a_method_of_a_non_module_raise_type_error():
    class NotAModule:
        fp16_enabled = True

        @auto_fp16()
        def forward(self, x):
            return x

        @force_fp32()
        def loss(self, x):
            return x
    with pytest.raises(TypeError, match='auto_fp16 can only be used to decorate the method of an nn.Module'):
        NotAModule().forward(torch.ones(1))
    with pytest.raises(TypeError, match='force_fp32 can only be used'):
        NotAModule().loss(torch.ones(1))


# -- ordering and the run's own report ------------------------------------------------------------
def test_the_start_banner_is_short_and_the_summary_names_best_and_last_checkpoints(tmp_path):
    trainer = make(tmp_path, epochs=2, val_dataloader=DataLoader(regression_data(n=8), batch_size=4),
                   val_evaluator=scripted_evaluator([2.0, 1.0]), checkpoint_config=dict(interval=1, save_best='mse'))
    trainer.logger.setLevel('INFO')
    train_and_close(trainer)
    log = text_log(tmp_path)
    assert 'hookloop run: seed 3, device cpu, world size 1, work dir ' + str(tmp_path) in log
    assert 'after_train_iter:' not in log  # the hook table is at DEBUG only
    summary = log.split('run summary:')[1]
    assert 'iterations       20 run (now at 20 of 20, epoch 2 of 2)' in summary
    assert 'best mse         1 (best_mse_epoch_2.pth)' in summary
    assert 'last checkpoint  epoch_2.pth' in summary
    assert '.log.json' in summary.split('log files')[1]


def test_hooks_command_builds_no_data_and_writes_nothing(tmp_path, capsys):
    from hookloop import DATASETS
    from hookloop.cli import main

    @DATASETS.register_module(force=True)
    class ExplodingDataset(torch.utils.data.Dataset):
        def __init__(self):
            raise AssertionError('the hooks command built a dataset')
    config = tmp_path / 'cfg.py'
    config.write_text("model = dict(type='Unbuilt')\n"
                      "train_dataloader = dict(dataset=dict(type='ExplodingDataset'), batch_size=4)\n"
                      "optimizer = dict(type='SGD', lr=0.1)\nmax_epochs = 1\n"
                      f"work_dir = {str(tmp_path / 'never')!r}\n"
                      "custom_hooks = [dict(type='EMAHook', priority='LOWEST')]\n")
    with pytest.warns(UserWarning, match=r'EMAHook \(priority LOWEST\) runs before TextLoggerHook'):
        assert main(['hooks', str(config)]) == 0
    out = capsys.readouterr().out
    assert '(LOWEST      ) EMAHook  [after optimizer; before evaluation, checkpoint]' in out
    assert out.index('EMAHook', out.index('after_train_iter:')) < out.index('TextLoggerHook',
                                                                             out.index('after_train_iter:'))
    mmcv = tmp_path / 'mmcv_cfg.py'  # MMCV 1.x shape: data=, runner=, fp16=, evaluation with a dataset metric
    mmcv.write_text("model = dict(type='Unbuilt')\noptimizer = dict(type='SGD', lr=0.1)\n"
                    "data = dict(samples_per_gpu=4, workers_per_gpu=0, train=dict(type='ExplodingDataset'), "
                    "val=dict(type='ExplodingDataset'))\nfp16 = dict(loss_scale=512.)\n"
                    "runner = dict(type='IterBasedRunner', max_iters=10)\nevaluation = dict(interval=5, metric='acc')\n"
                    f"work_dir = {str(tmp_path / 'never')!r}\n")
    assert main(['hooks', str(mmcv)]) == 0
    assert '(LOW         ) EvaluationHook' in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path)) == ['cfg.py', 'mmcv_cfg.py']


def test_plot_stitches_every_json_log_of_a_work_dir_and_names_what_it_skipped(tmp_path, capsys):
    pytest.importorskip('matplotlib', reason='matplotlib is not installed')
    from hookloop.cli import main
    work_dir = tmp_path / 'run'
    work_dir.mkdir()

    def write(name, lines):
        (work_dir / name).write_text(''.join(json.dumps(line) + '\n' for line in lines))
    header = {'hookloop': True, 'seed': 0}
    write('20260101_000000.log.json', [header] + [{'mode': 'train', 'epoch': 1, 'iter': n, 'loss': 1.0 / n}
                                                  for n in (2, 4, 6)])
    write('20260101_010000.log.json', [header] + [{'mode': 'train', 'epoch': 2, 'iter': n, 'loss': 1.0 / n}
                                                  for n in (6, 8)])
    write('20260101_020000.log.json', [header])  # --resume auto on the finished run: nothing logged
    (work_dir / '20260101_015000.log.json').write_text('{"mode": "train", "iter": 9, "lo')  # cut by a crash
    assert main(['plot', str(work_dir), '-o', str(tmp_path / 'c.png')]) == 0
    out = capsys.readouterr().out
    assert 'skipped ' + str(work_dir / '20260101_015000.log.json') + ': line 1 is not JSON' in out
    assert 'skipped ' + str(work_dir / '20260101_020000.log.json') + ': no train or val records' in out
    from hookloop.commands.plot import curve, read_json_logs
    records, _ = read_json_logs(str(work_dir))
    assert curve(records, 'loss')[:2] == ([2, 4, 6, 8], [1 / 2, 1 / 4, 1 / 6, 1 / 8])  # 6 once, from the later run
