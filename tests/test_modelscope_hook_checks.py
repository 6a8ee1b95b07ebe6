"""Issue 37 item 10: what ModelScope's own trainer and hook tests (``tests/trainers/hooks/*``,
``tests/trainers/test_trainer.py``) check of a run built from a configuration, written here from
those checks: ``output/`` holds the model directory's other files beside ``configuration.json`` and
``pytorch_model.bin``; the older ``EvaluationHook(save_best_ckpt=..., monitor_key=..., rule=...,
out_dir=...)`` keeps the best checkpoint under ModelScope's name in ``out_dir``; the JSON log holds
ModelScope's records only, each with ``mode``, ``epoch``, ``iter`` (within the epoch), ``lr`` and the
timings, and validation records with the metric; ``evaluation.visualization`` is accepted. And
issue 40 item 7's ModelScope side: the hook declares its output folders."""
import json
import os

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from hookloop import METRICS, build_trainer
from hookloop.compat.modelscope_api import LogKeys, ModeKeys, Model, ModelFile, TorchModel


class Rows(Dataset):
    """``num`` copies of one row ``{'feat': 5 floats, 'labels': [int]}`` (ModelScope's dummy dataset)."""

    def __init__(self, num, seed=0):
        rng = np.random.default_rng(seed)
        self.row = {'feat': torch.tensor(rng.random(5).tolist()), 'labels': torch.tensor([int(rng.integers(4))])}
        self.num = num

    def __len__(self):
        return self.num

    def __getitem__(self, index):
        return dict(self.row)


class Dummy(nn.Module, Model):
    def __init__(self, model_dir=None):
        super().__init__()
        self.linear = nn.Linear(5, 4)
        self.bn = nn.BatchNorm1d(4)
        self.model_dir = model_dir

    def forward(self, feat, labels):
        x = self.bn(self.linear(feat))
        return dict(logits=x, loss=torch.sum(x))


@METRICS.register_module(force=True)
class EpochAccuracy:
    """ModelScope's metric API with a fixed accuracy per evaluation (0.1, 0.5, 0.2)."""
    calls = 0

    def add(self, outputs, inputs):
        pass

    def evaluate(self):
        EpochAccuracy.calls += 1
        return {'accuracy': {1: 0.1, 2: 0.5, 3: 0.2}[EpochAccuracy.calls]}


def configuration(tmp_path, **sections):
    cfg = {'task': 'image_classification',
           'train': {'work_dir': str(tmp_path / 'work'), 'dataloader': {'batch_size_per_gpu': 2, 'workers_per_gpu': 0},
                     'optimizer': {'type': 'SGD', 'lr': 0.01}, 'lr_scheduler': {'type': 'StepLR', 'step_size': 2}},
           'evaluation': {'dataloader': {'batch_size_per_gpu': 2, 'workers_per_gpu': 0, 'shuffle': False}}}
    for key, value in sections.items():
        cfg[key].update(value)
    path = tmp_path / ModelFile.CONFIGURATION
    path.write_text(json.dumps(cfg))
    return str(path)


def run(path, **kwargs):
    trainer = build_trainer('trainer', default_args=dict(cfg_file=path, device='cpu', **kwargs))
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


def test_output_holds_the_model_directorys_other_files(tmp_path):
    model_dir = tmp_path / 'model_dir'
    (model_dir / 'tokenizer').mkdir(parents=True)
    (model_dir / 'vocab.txt').write_text('a\nb\n')
    (model_dir / 'tokenizer' / 'merges.txt').write_text('#')
    (model_dir / 'pytorch_model.bin').write_bytes(b'old weights')  # the weights come from the run
    (model_dir / ModelFile.CONFIGURATION).write_text('{}')
    trainer = run(configuration(tmp_path, train={'hooks': [{'type': 'CheckpointHook', 'interval': 1}]}),
                  model=Dummy(str(model_dir)), train_dataset=Rows(20), max_epochs=2)
    output = os.path.join(trainer.work_dir, ModelFile.TRAIN_OUTPUT_DIR)
    files = set(os.listdir(output))
    assert {ModelFile.CONFIGURATION, ModelFile.TORCH_MODEL_BIN_FILE, 'vocab.txt', 'tokenizer'} <= files
    assert os.listdir(os.path.join(output, 'tokenizer')) == ['merges.txt']
    assert json.loads(open(os.path.join(output, ModelFile.CONFIGURATION)).read())['task'] == 'image_classification'
    weights = torch.load(os.path.join(output, ModelFile.TORCH_MODEL_BIN_FILE), weights_only=True)
    assert torch.equal(weights['linear.weight'], trainer.model.linear.weight)  # the run's, not the directory's
    assert {'epoch_1.pth', 'epoch_2.pth'} <= set(os.listdir(trainer.work_dir))
    assert TorchModel().model_dir is None and isinstance(TorchModel(str(model_dir)), nn.Module)


def test_the_older_evaluation_hook_keeps_the_best_checkpoint_in_its_out_dir(tmp_path):
    EpochAccuracy.calls = 0
    best_dir = tmp_path / 'best_ckpt'
    hooks = [{'type': 'EvaluationHook', 'interval': 1, 'save_best_ckpt': True, 'monitor_key': 'accuracy',
              'rule': 'min', 'out_dir': str(best_dir)}]
    trainer = run(configuration(tmp_path, train={'hooks': hooks}, evaluation={'metrics': ['EpochAccuracy']}),
                  model=Dummy(), train_dataset=Rows(20), eval_dataset=Rows(20), max_epochs=3)
    assert {'epoch_1.pth', 'epoch_2.pth', 'epoch_3.pth'} <= set(os.listdir(trainer.work_dir))
    assert 'best_epoch1_accuracy0.1.pth' in os.listdir(best_dir)  # rule min: epoch 1's 0.1
    [hook] = [h for h in trainer.hooks if type(h).__name__ == 'ModelScopeCheckpointHook']
    assert hook.output_dirs(trainer)['best checkpoint'] == str(best_dir)


def test_the_json_log_holds_modelscopes_records_only(tmp_path):
    hooks = [{'type': 'EvaluationHook', 'interval': 1}]
    model = Dummy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = run(configuration(tmp_path, train={'hooks': hooks}, evaluation={'metrics': ['seq-cls-metric'],
                                                                            'visualization': {'vis_num': 2}}),
                  model=model, train_dataset=Rows(40), eval_dataset=Rows(20),
                  optimizers=(optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 2)), max_epochs=3)
    with open(os.path.join(trainer.work_dir, f'{trainer.timestamp}.log.json')) as f:
        records = [json.loads(line) for line in f]
    expected = []
    for epoch, lr in ((1, 0.01), (2, 0.01), (3, 0.001)):  # TextLoggerHook(interval=10) by default; StepLR by epoch
        expected += [(ModeKeys.TRAIN, epoch, 10, lr), (ModeKeys.TRAIN, epoch, 20, lr), (ModeKeys.EVAL, epoch, 20, None)]
    assert [(r[LogKeys.MODE], r[LogKeys.EPOCH], r[LogKeys.ITER], r.get(LogKeys.LR)) for r in records] == expected
    for record in records:
        if record[LogKeys.MODE] == ModeKeys.TRAIN:
            assert {LogKeys.DATA_LOAD_TIME, LogKeys.ITER_TIME, LogKeys.LOSS} <= set(record)
        else:
            assert 'accuracy' in record


def test_the_checkpoint_hook_declares_its_output_folders(tmp_path):
    from hookloop.compat.modelscope_hooks import ModelScopeCheckpointHook
    trainer = build_trainer('trainer', default_args=dict(cfg_file=configuration(tmp_path), model=Dummy(),
                                                         device='cpu'))
    try:
        inside = ModelScopeCheckpointHook(interval=1, output_dir='output')
        outside = ModelScopeCheckpointHook(interval=1, output_dir=str(tmp_path / 'elsewhere'))
        assert inside.output_dirs(trainer)['output'] == os.path.join(trainer.work_dir, 'output')
        assert outside.output_dirs(trainer)['output'] == str(tmp_path / 'elsewhere')  # absolute: as named
        escaping = ModelScopeCheckpointHook(interval=1, output_dir='../x')
        assert escaping.output_dirs(trainer)['output'] == os.path.join(trainer.work_dir, '../x')  # preflight judges
    finally:
        trainer.close()


def test_an_output_dir_outside_the_work_dir(tmp_path):
    """Issue 40 item 7: ``output_dir='../x'`` is refused before anything is written; an absolute
    ``output_dir`` is written, logged and locked with the work dir (the preflight of engine/preflight.py)."""
    from hookloop import ConfigError
    from hookloop.fileio.work_dir import WorkDir
    if not hasattr(WorkDir, 'lock_outside'):
        pytest.skip('needs the preflight that keeps hooks\' outputs under the work dir (issue 40, branch trust)')
    escaping = configuration(tmp_path, train={'hooks': [{'type': 'CheckpointHook', 'interval': 1,
                                                         'output_dir': '../x'}]})
    with pytest.raises(ConfigError, match='leaves the work dir'):
        run(escaping, model=Dummy(), train_dataset=Rows(4), max_epochs=1)
    assert not (tmp_path / 'x').exists() and not (tmp_path / 'work' / 'epoch_1.pth').exists()
    elsewhere = tmp_path / 'elsewhere'
    named = configuration(tmp_path, train={'hooks': [{'type': 'CheckpointHook', 'interval': 1,
                                                      'output_dir': str(elsewhere)}]})
    trainer = run(named, model=Dummy(), train_dataset=Rows(4), max_epochs=1)
    assert {ModelFile.CONFIGURATION, ModelFile.TORCH_MODEL_BIN_FILE} <= set(os.listdir(elsewhere))
    [log] = [n for n in os.listdir(trainer.work_dir) if n.endswith('.log')]
    assert f'writes its output outside the work dir, to {elsewhere}' in open(os.path.join(trainer.work_dir, log)).read()
