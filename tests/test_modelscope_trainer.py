"""Issue 37 item 10: the trainer of a ModelScope configuration run answers to ModelScope's
``EpochBasedTrainer`` names (hookloop/compat/modelscope_trainer.py), written from what ModelScope's
hook tests (``tests/trainers/hooks/test_{lr_scheduler,optimizer,timer,evaluation}_hook.py``) and
trainer test check: the loop they drive by hand (``invoke_hook``, ``train_step(model, inputs)``,
``_build_dataloader_with_dataset``, ``_hooks``, ``_epoch`` / ``_iter``), the learning rate where
ModelScope's LR hooks step it (per iteration with ``cumulative_iters``, warm-up by epoch,
``ReduceLROnPlateau``), ``log_buffer``'s history, ``metric_values`` and ModelScope's ``'dummy'``
trainer."""
import json
import os

import pytest
import torch
from torch.utils.data import Dataset

from hookloop import METRICS, ConfigError, Hook, build_trainer
from hookloop.compat.modelscope_api import LogKeys, ModelFile, TrainerStages
from test_modelscope_hook_checks import Dummy


class Varied(Dataset):
    """``num`` rows ``{'feat': 5 floats, 'labels': [int]}`` drawn from ``seed``."""

    def __init__(self, num, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.feat = torch.rand(num, 5, generator=generator)
        self.labels = torch.randint(0, 4, (num, 1), generator=generator)

    def __len__(self):
        return len(self.feat)

    def __getitem__(self, index):
        return {'feat': self.feat[index], 'labels': self.labels[index]}


def write(tmp_path, train=None, evaluation=None, name=ModelFile.CONFIGURATION):
    cfg = {'task': 'image_classification',
           'train': {'work_dir': str(tmp_path / 'work'),
                     'dataloader': {'batch_size_per_gpu': 2, 'workers_per_gpu': 0, 'shuffle': False}, **(train or {})},
           'evaluation': {'dataloader': {'batch_size_per_gpu': 2, 'workers_per_gpu': 0, 'shuffle': False},
                          **(evaluation or {})}}
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


def build(path, work_dir, rows=6, **kwargs):
    torch.manual_seed(0)  # the same initial weights for every trainer of a test
    kwargs.setdefault('train_dataset', Varied(rows))
    return build_trainer('trainer', default_args=dict(cfg_file=path, model=Dummy(), device='cpu',
                                                      work_dir=str(work_dir), **kwargs))


def drive_by_hand(trainer, count=False, after_iteration=None):
    """ModelScope's tests' loop; ``count``: the caller counts iterations and epochs as ModelScope's
    loop does (``_iter += 1``, ``_epoch += 1``)."""
    loader = trainer._build_dataloader_with_dataset(trainer.train_dataset, **trainer.cfg.train.get('dataloader', {}))
    trainer.register_optimizers_hook()
    trainer.invoke_hook(TrainerStages.before_run)
    for _ in range(trainer._epoch, trainer._max_epochs):
        trainer.invoke_hook(TrainerStages.before_train_epoch)
        for batch in loader:
            trainer.invoke_hook(TrainerStages.before_train_iter)
            trainer.train_step(trainer.model, batch)
            trainer.invoke_hook(TrainerStages.after_train_iter)
            if after_iteration is not None:
                after_iteration(trainer)
            if count:
                trainer._iter += 1
        trainer.invoke_hook(TrainerStages.after_train_epoch)
        if count:
            trainer._epoch += 1
    trainer.invoke_hook(TrainerStages.after_run)


def lrs_after_each_iteration(trainer):
    seen = []
    drive_by_hand(trainer, after_iteration=lambda t: seen.append((t.log_buffer.output[LogKeys.LR],
                                                                  t.optimizer.param_groups[0]['lr'])))
    return seen


@pytest.mark.parametrize('count', [False, True], ids=['hookloop counts', 'caller counts'])
def test_a_loop_driven_by_invoke_hook_trains_as_train_does(tmp_path, count):
    path = write(tmp_path, {'optimizer': {'type': 'SGD', 'lr': 0.1},
                            'lr_scheduler': {'type': 'StepLR', 'step_size': 1, 'gamma': 0.5}})
    ran = build(path, tmp_path / 'ran', max_epochs=2)
    hand = build(path, tmp_path / 'hand', max_epochs=2)
    seen = []
    try:
        ran.train()
        drive_by_hand(hand, count, lambda t: seen.append((t.epoch, t.iter, t.log_buffer.output[LogKeys.LR])))
    finally:
        ran.close()
        hand.close()
    assert seen == [(0, 0, 0.1), (0, 1, 0.1), (0, 2, 0.1), (1, 3, 0.05), (1, 4, 0.05), (1, 5, 0.05)]
    assert (hand.epoch, hand.iter) == (ran.epoch, ran.iter) == (2, 6)
    for key, value in ran.model.state_dict().items():
        assert torch.equal(hand.model.state_dict()[key], value), key
    assert {'epoch_1.pth', 'epoch_2.pth'} <= set(os.listdir(tmp_path / 'hand'))
    [log] = [n for n in os.listdir(tmp_path / 'hand') if n.endswith('.log')]
    assert 'run driven by invoke_hook' in (tmp_path / 'hand' / log).read_text()


def test_lr_with_cumulative_iters_is_modelscopes(tmp_path):
    """ModelScope's LrSchedulerHook(by_epoch=False) steps after iteration i once i >= 3 (four
    iterations accumulated): read after the iteration, the LR is the next iteration's."""
    path = write(tmp_path, {'optimizer': {'type': 'SGD', 'lr': 0.01, 'options': {'cumulative_iters': 4}},
                            'lr_scheduler': {'type': 'LinearLR', 'start_factor': 1.0, 'end_factor': 0.0,
                                             'total_iters': 20, 'options': {'by_epoch': False}},
                            'hooks': [{'type': 'TextLoggerHook', 'interval': 1}]})
    steps_after = [max(0, i - 2) for i in range(20)]  # scheduler steps made when iteration i is over
    expected = [0.01 * (1 - n / 20) for n in steps_after]
    hand = build(path, tmp_path / 'hand', rows=10, max_epochs=4)
    try:
        seen = lrs_after_each_iteration(hand)
    finally:
        hand.close()
    assert [logged for logged, _ in seen] == pytest.approx(expected)
    assert [optimizer for _, optimizer in seen] == pytest.approx(expected)

    class TrainedLR(Hook):
        def __init__(self):
            self.lrs = []

        def before_train_iter(self, trainer):
            self.lrs.append(trainer.optimizer.param_groups[0]['lr'])

    probe = TrainedLR()
    ran = build(path, tmp_path / 'ran', rows=10, max_epochs=4, callbacks=[probe])
    try:
        ran.train()
    finally:
        ran.close()
    assert probe.lrs == pytest.approx([0.01] + expected[:-1])  # each iteration trains with the LR set before it
    [name] = [n for n in os.listdir(tmp_path / 'ran') if n.endswith('.log.json')]
    records = [json.loads(line) for line in (tmp_path / 'ran' / name).read_text().splitlines()]
    assert [r[LogKeys.LR] for r in records] == pytest.approx(expected)  # ModelScope logs after its step
    assert all({LogKeys.MODE, LogKeys.EPOCH, LogKeys.ITER, LogKeys.DATA_LOAD_TIME, LogKeys.ITER_TIME} <= set(r)
               for r in records)


def test_warmup_by_epoch_when_the_caller_does_not_count_epochs(tmp_path):
    path = write(tmp_path, {'optimizer': {'type': 'SGD', 'lr': 0.01},
                            'lr_scheduler': {'type': 'MultiStepLR', 'milestones': [4, 6],
                                             'options': {'warmup': {'type': 'LinearWarmup', 'warmup_iters': 3}}}})
    hand = build(path, tmp_path / 'hand', rows=4, max_epochs=7)
    try:
        seen = lrs_after_each_iteration(hand)
    finally:
        hand.close()
    per_epoch = [0.001, 0.004, 0.007, 0.01, 0.001, 0.001, 0.0001]  # ModelScope's test: warm-up, then the milestones
    assert [round(logged, 5) for logged, _ in seen] == [lr for lr in per_epoch for _ in range(2)]


class Scripted:
    """A ModelScope-style metric giving ``ACCURACY[n]`` at the n-th evaluation."""
    ACCURACY = [0.1, 0.1, 0.1, 0.1, 0.3]
    calls = 0

    def add(self, outputs, inputs):
        pass

    def evaluate(self):
        Scripted.calls += 1
        return {'accuracy': Scripted.ACCURACY[Scripted.calls - 1]}


def test_reduce_lr_on_plateau_steps_with_the_epochs_metric(tmp_path):
    METRICS.register_module(module=Scripted, force=True)
    Scripted.calls = 0
    plateau = {'lr_scheduler': {'type': 'ReduceLROnPlateau', 'mode': 'max', 'factor': 0.1, 'patience': 2},
               'lr_scheduler_hook': {'type': 'PlateauLrSchedulerHook', 'metric_key': 'accuracy'},
               'hooks': [{'type': 'EvaluationHook', 'interval': 1}]}
    path = write(tmp_path, plateau, {'metrics': ['Scripted']})
    model = Dummy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = build_trainer('trainer', default_args=dict(cfg_file=path, model=model, device='cpu',
                                                         work_dir=str(tmp_path / 'run'), train_dataset=Varied(2),
                                                         eval_dataset=Varied(2), optimizers=(optimizer, None),
                                                         max_epochs=5))
    try:
        seen = lrs_after_each_iteration(trainer)
        assert trainer.metric_values == {'accuracy': 0.3}
    finally:
        trainer.close()
    # best 0.1 at epoch 1, no gain for 3 epochs > patience 2: lower after epoch 4 (ModelScope's test)
    assert [optimizer_lr for _, optimizer_lr in seen] == pytest.approx([0.01] * 4 + [0.001])
    plateau['lr_scheduler_hook'] = {'type': 'LrSchedulerHook'}
    with pytest.raises(ConfigError, match="ReduceLROnPlateau needs train.lr_scheduler_hook"):
        build(write(tmp_path, plateau, {'metrics': ['Scripted']}), tmp_path / 'bad', eval_dataset=Varied(2),
              max_epochs=1)


def test_log_buffer_holds_the_values_of_the_epoch(tmp_path):
    path = write(tmp_path, {'optimizer': {'type': 'SGD', 'lr': 0.01}, 'hooks': [{'type': 'IterTimerHook'}]})
    trainer = build(path, tmp_path / 'work', rows=6, max_epochs=2)
    lengths, losses = [], []

    def look(t):
        history = t.log_buffer.val_history
        lengths.append({key: len(history[key]) for key in (LogKeys.DATA_LOAD_TIME, LogKeys.ITER_TIME, LogKeys.LOSS)})
        assert {key: len(v) for key, v in t.log_buffer.n_history.items()} == {k: len(v) for k, v in history.items()}
        losses.append(t.train_outputs[LogKeys.LOSS].item())
        assert history[LogKeys.LOSS][-1] == losses[-1] and min(history[LogKeys.DATA_LOAD_TIME]) >= 0
    try:
        timers = trainer.register_hook_from_cfg(trainer.cfg.train.hooks)  # registered with the configuration
        assert [type(hook).__name__ for hook in timers] == ['IterTimerHook']
        assert sum(type(hook).__name__ == 'IterTimerHook' for hook in trainer._hooks) == 1
        drive_by_hand(trainer, after_iteration=look)
        buffer = trainer.log_buffer
        buffer.update({'extra': 2.0})
        buffer.average(2)
        assert buffer.ready and buffer.output[LogKeys.LOSS] == pytest.approx((losses[-1] + losses[-2]) / 2)
        assert buffer.val_history['extra'] == [2.0]
        buffer.clear()
        assert not buffer.ready and dict(buffer.val_history) == {} and set(buffer.output) == {LogKeys.LR}
    finally:
        trainer.close()
    # three iterations an epoch; the buffer restarts with each epoch
    assert lengths == [dict.fromkeys((LogKeys.DATA_LOAD_TIME, LogKeys.ITER_TIME, LogKeys.LOSS), n)
                       for n in (1, 2, 3, 1, 2, 3)]


def test_assigning_hooks_unregisters_the_others(tmp_path):
    path = write(tmp_path, {'optimizer': {'type': 'SGD', 'lr': 0.01}})
    trainer = build(path, tmp_path / 'work', max_epochs=1)
    try:
        trainer.register_processors()
        names = [type(hook).__name__ for hook in trainer._hooks]
        assert {'OptimizerHook', 'ModelScopeTextLoggerHook', 'ModelScopeCheckpointHook'} <= set(names)
        trainer._hooks = [hook for hook in trainer._hooks if type(hook).__name__ != 'ModelScopeCheckpointHook']
        trainer.train()
    finally:
        trainer.close()
    assert not any(name.endswith('.pth') for name in os.listdir(tmp_path / 'work'))


def test_rows_with_a_label_key_are_batched_as_modelscopes_collator_does(tmp_path):
    """ModelScope's older evaluation hook test gives rows {'feat', 'label'} to a model whose forward
    takes ``labels``: its default collator renames the key."""

    class Labelled(Varied):
        def __getitem__(self, index):
            return {'feat': self.feat[index], 'label': self.labels[index], 'name': f'row {index}', 'none': None}
    trainer = build(write(tmp_path, {'optimizer': {'type': 'SGD', 'lr': 0.01}}), tmp_path / 'work',
                    train_dataset=Labelled(4), max_epochs=1)
    try:
        trainer.train()
        assert set(trainer.data_batch) == {'feat', 'labels'} and trainer.data_batch['labels'].dtype == torch.int64
    finally:
        trainer.close()


def test_metric_values_and_evaluate(tmp_path):
    class Half:
        def add(self, outputs, inputs):
            pass

        def evaluate(self):
            return {'accuracy': 0.5}
    METRICS.register_module(module=Half, force=True)
    path = write(tmp_path, {'optimizer': {'type': 'SGD', 'lr': 0.01}, 'hooks': [{'type': 'EvaluationHook'}]},
                 {'metrics': ['Half']})
    trainer = build(path, tmp_path / 'work', eval_dataset=Varied(4), max_epochs=2)
    try:
        assert trainer.metric_values is None  # no evaluation yet
        trainer.train()
        assert trainer.metric_values == {'accuracy': 0.5}
        first = torch.load(tmp_path / 'work' / 'epoch_1.pth', weights_only=True)['state_dict']
        assert trainer.evaluate(str(tmp_path / 'work' / 'epoch_1.pth')) == {'accuracy': 0.5}
        assert all(torch.equal(trainer.model.state_dict()[k], v) for k, v in first.items())
    finally:
        trainer.close()


def test_the_dummy_trainer_prints_the_sections_of_its_file(tmp_path, capsys):
    path = write(tmp_path, {'max_epochs': 3}, {'metrics': ['accuracy']})
    trainer = build_trainer('dummy', dict(cfg_file=path))
    trainer.train()
    trainer.evaluate()
    out = capsys.readouterr().out
    assert "train cfg {'work_dir'" in out and "'max_epochs': 3" in out
    assert "eval cfg {'dataloader'" in out and "'metrics': ['accuracy']" in out and 'checkpoint_path None' in out
    with pytest.raises(ConfigError, match="'dummy' trainer takes cfg_file only"):
        build_trainer('dummy', dict(cfg_file=path, max_epochs=1))


def test_invoke_hook_stages_need_before_run(tmp_path):
    trainer = build(write(tmp_path, {'optimizer': {'type': 'SGD', 'lr': 0.01}}), tmp_path / 'work', max_epochs=1)
    try:
        with pytest.raises(ConfigError, match=r"invoke_hook\('before_train_epoch'\) needs invoke_hook\('before_run'\)"):
            trainer.invoke_hook(TrainerStages.before_train_epoch)
        with pytest.raises(ConfigError, match="model must be the trainer's model"):
            trainer.train_step(Dummy(), {'feat': torch.rand(2, 5), 'labels': torch.zeros(2, 1, dtype=torch.long)})
    finally:
        trainer.close()


@pytest.mark.parametrize('seed', range(5))
def test_the_default_collator_property(seed):
    """Random rows: ``label`` becomes ``labels`` (int64 for integer labels, float32 otherwise),
    strings and ``None`` are left out, everything else is stacked as torch's default_collate stacks it."""
    from torch.utils.data import default_collate

    from hookloop.compat.modelscope_collate import modelscope_collate
    generator = torch.Generator().manual_seed(seed)
    batch_size = int(torch.randint(1, 5, (1,), generator=generator))
    shapes = {f'key{k}': tuple(int(d) for d in torch.randint(1, 4, (int(torch.randint(0, 3, (1,), generator=generator)),),
                                                             generator=generator))
              for k in range(int(torch.randint(1, 4, (1,), generator=generator)))}
    integer = bool(torch.randint(0, 2, (1,), generator=generator))
    rows = []
    for index in range(batch_size):
        row = {key: torch.rand(shape, generator=generator) for key, shape in shapes.items()}
        row['label'] = torch.tensor([index % 3]) if integer else float(index) / 2
        row.update(text=f'row {index}', nothing=None)
        rows.append(row)
    batch = modelscope_collate(rows)
    assert set(batch) == set(shapes) | {'labels'}
    expected = default_collate([{key: row[key] for key in shapes} for row in rows])
    assert all(torch.equal(batch[key], expected[key]) for key in shapes)
    assert batch['labels'].dtype == (torch.int64 if integer else torch.float32)
    assert batch['labels'].reshape(-1).tolist() == [float(r['label'].item() if integer else r['label']) for r in rows]


@pytest.mark.parametrize('seed', range(3))
def test_a_caller_counting_some_steps_and_not_others_ends_where_train_ends(tmp_path, seed):
    """The position stays the training loop's whatever the caller counts (ModelScope's tests count
    iterations and epochs in some loops, not in others): weights and counters equal train()'s."""
    generator = torch.Generator().manual_seed(seed)
    path = write(tmp_path, {'optimizer': {'type': 'SGD', 'lr': 0.1, 'options': {'cumulative_iters': 2}},
                            'lr_scheduler': {'type': 'StepLR', 'step_size': 2, 'options': {'by_epoch': False}}})
    ran = build(path, tmp_path / 'ran', rows=10, max_epochs=3)
    hand = build(path, tmp_path / 'hand', rows=10, max_epochs=3)
    try:
        ran.train()
        loader = hand._build_dataloader_with_dataset(hand.train_dataset, **hand.cfg.train.dataloader)
        hand.invoke_hook('before_run')
        for epoch in range(hand._max_epochs):
            hand.invoke_hook('before_train_epoch')
            for inner, batch in enumerate(loader):
                hand.invoke_hook('before_train_iter')
                assert (hand.epoch, hand.inner_iter, hand.iter) == (epoch, inner, epoch * 5 + inner)
                hand.train_step(hand.model, batch)
                hand.invoke_hook('after_train_iter')
                if torch.rand(1, generator=generator) < 0.5:
                    hand._iter += 1
            hand.invoke_hook('after_train_epoch')
            if torch.rand(1, generator=generator) < 0.5:
                hand._epoch += 1
        hand.invoke_hook('after_run')
    finally:
        ran.close()
        hand.close()
    assert (hand.epoch, hand.iter, hand.inner_iter) == (ran.epoch, ran.iter, ran.inner_iter) == (3, 15, 0)
    assert hand.optimizer.param_groups[0]['lr'] == ran.optimizer.param_groups[0]['lr']
    for key, value in ran.model.state_dict().items():
        assert torch.equal(hand.model.state_dict()[key], value), key
