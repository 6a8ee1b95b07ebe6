"""ModelScope conformance (issue 25, findings 12-15), written from ModelScope's documented
behaviour: EpochBasedTrainer's build_trainer arguments, its default hooks and config
sections, its metrics API, its output/ folder and the names its hooks write."""
import json
import os

import pytest
import torch
from torch.utils.data import IterableDataset

from hookloop import METRICS, ConfigError, Hook, Trainer, build_trainer
from hookloop.cli import main

import mmcv_style.ms_toy as ms_toy

BASE = {
    'framework': 'pytorch',
    'task': 'text-classification',
    'model': {'type': 'ToyTextClassifier', 'num_labels': 2},
    'dataset': {'train': {'type': 'ToySequenceClassification', 'split': 'train'},
                'val': {'type': 'ToySequenceClassification', 'split': 'val'}},
    'train': {
        'work_dir': 'WORK',
        'max_epochs': 2,
        'dataloader': {'batch_size_per_gpu': 4, 'workers_per_gpu': 0},
        'optimizer': {'type': 'SGD', 'lr': 0.1},
        'hooks': [{'type': 'EvaluationHook', 'interval': 1}],
    },
    'evaluation': {'dataloader': {'batch_size_per_gpu': 8, 'workers_per_gpu': 0}, 'metrics': ['seq-cls-metric']},
}


def write(tmp_path, configuration=None, **train):
    configuration = json.loads(json.dumps(configuration or BASE))
    configuration['train'].update(train)
    configuration['train']['work_dir'] = str(tmp_path / 'work')
    path = tmp_path / 'configuration.json'
    path.write_text(json.dumps(configuration))
    return str(path)


def records(work_dir):
    [name] = [n for n in os.listdir(work_dir) if n.endswith('.log.json')]
    with open(os.path.join(work_dir, name)) as f:
        return [r for r in map(json.loads, f) if 'mode' in r]


def run(tmp_path, path=None, **default_args):
    trainer = build_trainer('EpochBasedTrainer', default_args=dict(cfg_file=path or write(tmp_path), seed=0,
                                                                   device='cpu', **default_args))
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


def plain_accuracy(model, dataset):
    with torch.no_grad():
        logits = model.classifier(model.encoder(dataset.x))
    return (logits.argmax(-1) == dataset.labels).sum().item() / len(dataset.labels)


# -- 12: datasets passed to build_trainer keep the file's loader options ---------------------

def test_build_trainer_with_datasets_keeps_the_files_loader_options(tmp_path):
    train_set, eval_set = ms_toy.ToySequenceClassification('train'), ms_toy.ToySequenceClassification('val')
    trainer = build_trainer('EpochBasedTrainer', default_args=dict(
        cfg_file=write(tmp_path), train_dataset=train_set, eval_dataset=eval_set, seed=0, device='cpu'))
    try:
        assert trainer.iters_per_epoch == 10  # 40 samples, train.dataloader.batch_size_per_gpu=4
        assert next(iter(trainer.train_dataloader))['labels'].shape == (4,)
        assert next(iter(trainer.val_dataloader))['labels'].shape == (8,)  # evaluation.dataloader
    finally:
        trainer.close()
    both = build_trainer('EpochBasedTrainer', default_args=dict(  # a list of datasets is concatenated
        cfg_file=write(tmp_path), train_dataset=[train_set, train_set], seed=0, device='cpu'))
    try:
        assert both.iters_per_epoch == 20
    finally:
        both.close()


# -- 13: use_fp16, train_iters_per_epoch, val_iters_per_epoch --------------------------------

class CountVal(Hook):
    def __init__(self):
        self.batches = []

    def after_val_iter(self, trainer):
        self.batches.append(trainer.val_iter)


def test_use_fp16_and_iters_per_epoch_arguments_are_honoured(tmp_path):
    counter = CountVal()
    trainer = build_trainer('EpochBasedTrainer', default_args=dict(
        cfg_file=write(tmp_path), seed=0, device='cpu', use_fp16=True, train_iters_per_epoch=3,
        val_iters_per_epoch=2, callbacks=[counter]))
    try:
        [step] = [h for h in trainer.hooks if getattr(h, 'ROLE', None) == 'optimizer']
        assert step.precision == 'fp16'  # ModelScope registers TorchAMPOptimizerHook for use_fp16
        assert trainer.iters_per_epoch == 3 and trainer.max_iters == 6
        trainer.train()
    finally:
        trainer.close()
    assert trainer.iter == 6  # 2 epochs of 3 iterations
    assert counter.batches == [0, 1, 0, 1]  # two validations of two batches each


def test_iters_per_epoch_keys_of_the_file(tmp_path):
    configuration = json.loads(json.dumps(BASE))
    configuration['evaluation']['val_iters_per_epoch'] = 1
    counter = CountVal()
    trainer = run(tmp_path, write(tmp_path, configuration, train_iters_per_epoch=2), callbacks=[counter])
    assert trainer.iter == 4 and counter.batches == [0, 0]


# -- 14: default hooks, current sections, metrics API, output/, IterableDataset -------------

def test_a_config_without_checkpoint_hook_saves_every_epoch(tmp_path):
    run(tmp_path)
    names = os.listdir(tmp_path / 'work')
    assert {'epoch_1.pth', 'epoch_2.pth'} <= set(names)  # ModelScope's default CheckpointHook(interval=1)
    assert all(r['iter'] % 10 == 0 for r in records(str(tmp_path / 'work')) if r['mode'] == 'train')  # interval 10


def test_current_sections_checkpoint_period_best_logging_and_evaluation_period(tmp_path):
    configuration = json.loads(json.dumps(BASE))
    configuration['train']['hooks'] = []
    configuration['train']['max_epochs'] = 4
    configuration['train']['checkpoint'] = {'period': {'interval': 2, 'max_checkpoint_num': 1},
                                            'best': {'metric_key': 'accuracy', 'rule': 'max'}}
    configuration['train']['logging'] = {'interval': 5}
    configuration['evaluation']['period'] = {'interval': 2}
    trainer = run(tmp_path, write(tmp_path, configuration))
    names = set(os.listdir(tmp_path / 'work'))
    assert 'epoch_4.pth' in names and 'epoch_2.pth' not in names and 'epoch_1.pth' not in names
    logged = records(str(tmp_path / 'work'))
    # ModelScope's text log counts iter within the epoch: epochs of 10 iterations, logged every 5
    assert [(r['epoch'], r['iter']) for r in logged if r['mode'] == 'train'] == \
        [(epoch, it) for epoch in (1, 2, 3, 4) for it in (5, 10)]
    assert [r['epoch'] for r in logged if r['mode'] == 'eval'] == [2, 4]
    assert any(n.startswith('best_epoch') for n in names) and trainer.iter == 40


@METRICS.register_module(force=True)
class MyMetric:
    """A metric written against ModelScope's API: add(outputs, inputs), evaluate()."""

    def __init__(self, name='my_acc'):
        self.name, self.right, self.total = name, 0, 0

    def add(self, outputs, inputs):
        self.right += int((outputs['logits'].argmax(-1) == inputs['labels']).sum())
        self.total += len(inputs['labels'])

    def evaluate(self):
        return {self.name: self.right / self.total}


def test_metrics_api_and_standard_names(tmp_path):
    configuration = json.loads(json.dumps(BASE))
    configuration['evaluation']['metrics'] = ['seq-cls-metric', {'type': 'MyMetric', 'name': 'mine'},
                                              'precision', 'recall', 'loss-metric']
    trainer = run(tmp_path, write(tmp_path, configuration, max_epochs=1))
    expected = plain_accuracy(trainer.model, ms_toy.ToySequenceClassification('val'))
    [val] = [r for r in records(str(tmp_path / 'work')) if r['mode'] == 'eval']
    assert val['accuracy'] == pytest.approx(expected) and val['mine'] == pytest.approx(expected)
    assert 0 <= val['precision'] <= 1 and 0 <= val['recall'] <= 1 and val['loss'] > 0
    again = trainer.val()  # a fresh ModelScope metric per evaluation: the same numbers, not doubled counts
    assert again['mine'] == pytest.approx(expected)


def test_output_folder_holds_configuration_and_weights(tmp_path):
    trainer = run(tmp_path)
    output = tmp_path / 'work' / 'output'
    configuration = json.loads((output / 'configuration.json').read_text())
    assert configuration['task'] == 'text-classification' and configuration['model']['type'] == 'ToyTextClassifier'
    weights = torch.load(output / 'pytorch_model.bin', weights_only=True)  # a plain state dict
    model = trainer.model.state_dict()
    assert weights.keys() == model.keys() and all(torch.equal(weights[k], model[k]) for k in model)
    assert 'accuracy' in json.loads((output / 'eval_result.txt').read_text())


class Stream(IterableDataset):
    def __iter__(self):
        data = ms_toy.ToySequenceClassification('train', size=12)
        return iter([data[i] for i in range(len(data))])


class FirstBatches(Hook):
    def __init__(self):
        self.labels = []

    def before_train_iter(self, trainer):
        self.labels.append(trainer.data_batch['labels'].tolist())


def test_an_iterable_train_set_is_not_shuffled_and_trains(tmp_path):
    seen = FirstBatches()
    trainer = run(tmp_path, train_dataset=Stream(), train_iters_per_epoch=3, callbacks=[seen])
    assert trainer.iter == 6
    stream = [sample['labels'].item() for sample in Stream()]
    assert seen.labels[:3] == [stream[0:4], stream[4:8], stream[8:12]]  # the stream's own order


# -- 15: what ModelScope users and tools read back -------------------------------------------

def test_modelscope_names_for_best_file_log_keys_and_eval_records(tmp_path):
    configuration = json.loads(json.dumps(BASE))
    configuration['train']['hooks'] = [{'type': 'BestCkptSaverHook', 'metric_key': 'accuracy'},
                                       {'type': 'TextLoggerHook', 'interval': 5}, {'type': 'IterTimerHook'},
                                       {'type': 'EvaluationHook'}]
    trainer = run(tmp_path, write(tmp_path, configuration, max_epochs=1))
    accuracy = plain_accuracy(trainer.model, ms_toy.ToySequenceClassification('val'))
    names = os.listdir(tmp_path / 'work')
    assert f'best_epoch1_accuracy{accuracy}.pth' in names  # ModelScope's prefix best_epoch{n}_{key}{value}
    assert os.path.exists(tmp_path / 'work' / 'output_best' / 'pytorch_model.bin')
    logged = records(str(tmp_path / 'work'))
    train = [r for r in logged if r['mode'] == 'train']
    assert train and all('iter_time' in r and 'data_load_time' in r and 'time' not in r for r in train)
    # by epoch, an eval record's iter is the validation's iterations (40 rows, 8 a batch), as ModelScope logs it
    assert [(r['mode'], r['iter']) for r in logged if r['mode'] != 'train'] == [('eval', 5)]


def test_tensorboard_goes_to_tensorboard_output_with_bare_tags(tmp_path):
    pytest.importorskip('tensorboard')
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    configuration = json.loads(json.dumps(BASE))
    configuration['train']['hooks'] = [{'type': 'TensorboardHook', 'interval': 5}, {'type': 'EvaluationHook'}]
    run(tmp_path, write(tmp_path, configuration, max_epochs=1))
    folder = tmp_path / 'work' / 'tensorboard_output'
    events = EventAccumulator(str(folder))
    events.Reload()
    tags = set(events.Tags()['scalars'])
    assert {'loss', 'lr', 'accuracy'} <= tags and not any('/' in t for t in tags)
    assert not (tmp_path / 'work' / 'tf_logs').exists()


def modelscope_lrs(iterations, cumulative_iters, step_size, gamma, lr):
    """The ``lr`` of ModelScope's log records with LrSchedulerHook(by_epoch=False): after iteration
    i it steps the scheduler once i >= cumulative_iters - 1, then its logger logs the LR (the one
    iteration i + 1 trains with)."""
    params = [torch.nn.Parameter(torch.zeros(1))]
    optimizer = torch.optim.SGD(params, lr=lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=step_size, gamma=gamma)
    lrs = []
    for i in range(iterations):
        optimizer.step()
        if i >= cumulative_iters - 1:
            scheduler.step()
        lrs.append(optimizer.param_groups[0]['lr'])
    return lrs


def test_lr_with_cumulative_iters_steps_as_modelscope(tmp_path):
    configuration = json.loads(json.dumps(BASE))
    configuration['train']['optimizer'] = {'type': 'SGD', 'lr': 0.1, 'options': {'cumulative_iters': 4}}
    configuration['train']['lr_scheduler'] = {'type': 'StepLR', 'step_size': 2, 'gamma': 0.5,
                                              'options': {'by_epoch': False}}
    configuration['train']['hooks'] = [{'type': 'TextLoggerHook', 'interval': 1}]
    run(tmp_path, write(tmp_path, configuration, max_epochs=1))
    lrs = [r['lr'] for r in records(str(tmp_path / 'work')) if r['mode'] == 'train']
    assert lrs == pytest.approx(modelscope_lrs(10, 4, 2, 0.5, 0.1))


def test_the_native_api_keeps_hookloops_names(tmp_path):
    data = ms_toy.ToySequenceClassification('train')
    trainer = Trainer(model=ms_toy.ToyTextClassifier(), optimizer=dict(type='SGD', lr=0.1),
                      train_dataloader=dict(dataset=data, batch_size=4),
                      val_dataloader=dict(dataset=data, batch_size=8),
                      val_evaluator=dict(type='Accuracy', target_key='labels'), max_epochs=1,
                      work_dir=str(tmp_path / 'work'), seed=0, device='cpu',
                      checkpoint_config=dict(interval=1, save_best='accuracy'),
                      log_config=dict(interval=5, hooks=[dict(type='TextLoggerHook')]))
    try:
        trainer.train()
    finally:
        trainer.close()
    names = os.listdir(tmp_path / 'work')
    assert any(n.startswith('best_accuracy_epoch_1') for n in names) and 'output' not in names
    logged = records(str(tmp_path / 'work'))
    assert all('time' in r for r in logged if r['mode'] == 'train')
    assert [r['mode'] for r in logged if r['mode'] != 'train'] == ['val']


def test_cli_trains_a_configuration_with_modelscope_sections(tmp_path):
    configuration = json.loads(json.dumps(BASE))
    configuration['train']['checkpoint'] = {'period': {'interval': 1}}
    path = write(tmp_path, configuration, max_epochs=1)
    assert main(['train', path, '--cfg-options', 'seed=0', 'device="cpu"']) == 0
    assert os.path.exists(tmp_path / 'work' / 'epoch_1.pth')
    assert os.path.exists(tmp_path / 'work' / 'output' / 'pytorch_model.bin')


def test_an_argument_hookloop_cannot_use_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match='not supported: use_fpl6'):  # a typo of use_fp16
        build_trainer('EpochBasedTrainer', default_args=dict(cfg_file=write(tmp_path), use_fpl6=True))
    assert not os.path.exists(tmp_path / 'work')


def test_the_tasks_default_metric_is_used_without_evaluation_metrics(tmp_path):
    configuration = json.loads(json.dumps(BASE))
    del configuration['evaluation']['metrics']  # text-classification: ModelScope uses seq-cls-metric
    trainer = run(tmp_path, write(tmp_path, configuration, max_epochs=1))
    data = ms_toy.ToySequenceClassification('val')
    with torch.no_grad():
        predicted = trainer.model.classifier(trainer.model.encoder(data.x)).argmax(-1)
    hits = ((predicted == 1) & (data.labels == 1)).sum().item()  # two classes: the F1 of class 1
    binary_f1 = 2 * hits / ((predicted == 1).sum().item() + (data.labels == 1).sum().item())
    expected = {'accuracy': plain_accuracy(trainer.model, data), 'binary-f1': binary_f1, 'f1': binary_f1}
    assert trainer.metrics == pytest.approx(expected)


def test_resume_continues_the_delayed_schedule_exactly(tmp_path):
    configuration = json.loads(json.dumps(BASE))
    configuration['train']['optimizer'] = {'type': 'SGD', 'lr': 0.1, 'options': {'cumulative_iters': 4}}
    configuration['train']['lr_scheduler'] = {'type': 'StepLR', 'step_size': 3, 'gamma': 0.5,
                                              'options': {'by_epoch': False,
                                                          'warmup': {'type': 'LinearWarmup', 'warmup_iters': 2}}}
    configuration['train']['hooks'] = [{'type': 'TextLoggerHook', 'interval': 1}]
    path = write(tmp_path, configuration, max_epochs=2)
    whole = run(tmp_path, path)
    work = tmp_path / 'work'
    lrs = [r['lr'] for r in records(str(work)) if r['mode'] == 'train']
    resumed = tmp_path / 'resumed'
    again = run(tmp_path, path, work_dir=str(resumed), resume_from=str(work / 'epoch_1.pth'))
    tail = [r['lr'] for r in records(str(resumed)) if r['mode'] == 'train']
    assert tail == pytest.approx(lrs[10:]) and len(tail) == 10
    assert all(torch.equal(a, b) for a, b in zip(whole.model.state_dict().values(), again.model.state_dict().values()))


def test_hooks_command_shows_a_configurations_hooks(tmp_path, capsys):
    configuration = json.loads(json.dumps(BASE))
    configuration['train']['checkpoint'] = {'period': {'interval': 1}}
    assert main(['hooks', write(tmp_path, configuration)]) == 0
    table = capsys.readouterr().out
    assert 'ModelScopeCheckpointHook' in table and 'ModelScopeTextLoggerHook' in table
    assert not os.path.exists(tmp_path / 'work')


def test_a_work_dir_argument_replaces_the_files_save_dir(tmp_path):
    configuration = json.loads(json.dumps(BASE))
    configuration['train']['checkpoint'] = {'period': {'interval': 1, 'save_dir': str(tmp_path / 'elsewhere')}}
    run(tmp_path, write(tmp_path, configuration, max_epochs=1), work_dir=str(tmp_path / 'mine'))
    assert os.path.exists(tmp_path / 'mine' / 'epoch_1.pth') and not os.path.exists(tmp_path / 'elsewhere')
    assert os.path.exists(tmp_path / 'mine' / 'output' / 'pytorch_model.bin')


def test_save_dir_holds_the_checkpoints_and_its_output_folder(tmp_path):
    configuration = json.loads(json.dumps(BASE))
    save_dir = tmp_path / 'work' / 'ckpts'
    configuration['train']['checkpoint'] = {'period': {'interval': 1, 'save_dir': str(save_dir)}}
    run(tmp_path, write(tmp_path, configuration, max_epochs=1))
    assert os.path.exists(save_dir / 'epoch_1.pth') and os.path.exists(save_dir / 'output' / 'pytorch_model.bin')


def test_standard_metrics_compute_modelscopes_values():
    from hookloop.compat.modelscope_metrics import metric
    labels = torch.tensor([0, 0, 1, 1, 2])
    predicted = torch.tensor([0, 1, 1, 1, 0])
    logits = torch.nn.functional.one_hot(predicted, 3).float()
    accuracy = metric('accuracy')  # ModelScope's AccuracyMetric reads predicted labels from outputs['labels']
    accuracy.reset()
    accuracy.update({'labels': predicted}, {'labels': labels})
    assert accuracy.compute() == {'accuracy': 3 / 5}
    scores = {}
    for name in ('precision', 'recall', 'f1'):
        evaluator = metric(name)
        evaluator.reset()
        evaluator.update({'logits': logits[:2]}, {'labels': labels[:2]})
        evaluator.update({'logits': logits[2:]}, {'labels': labels[2:]})
        scores.update(evaluator.compute())
    # per class (0, 1, 2): precision 1/2, 2/3, 0; recall 1/2, 1, 0 (macro means)
    assert scores['precision'] == pytest.approx((1 / 2 + 2 / 3) / 3)
    assert scores['recall'] == pytest.approx((1 / 2 + 1) / 3)
    assert scores['f1'] == pytest.approx((1 / 2 + 0.8) / 3)


def test_load_checkpoint_hook_continues_a_run_and_ddp_hook_names_the_launcher(tmp_path):
    first = run(tmp_path, write(tmp_path, max_epochs=1))
    configuration = json.loads(json.dumps(BASE))
    configuration['train']['hooks'] = [
        {'type': 'LoadCheckpointHook', 'checkpoint_file': str(tmp_path / 'work' / 'epoch_1.pth')},
        {'type': 'DDPHook', 'launcher': 'none'}, {'type': 'EvaluationHook'}]
    second = run(tmp_path, write(tmp_path, configuration, max_epochs=2), work_dir=str(tmp_path / 'next'))
    assert first.iter == 10 and second.iter == 20 and second.resumed_from is not None
