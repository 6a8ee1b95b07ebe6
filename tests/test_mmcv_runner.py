"""Code written for MMCV 1.x's runner runs with its import line changed (hookloop.compat.mmcv)."""
import logging
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookloop.compat.mmcv import EpochBasedRunner, IterBasedRunner, build_optimizers, build_runner, get_logger, \
    load_checkpoint
from hookloop.errors import ConfigError


class TinyGAN(nn.Module):
    """MMCV/mmgen's contract: train_step steps both optimizers itself and returns log_vars."""

    def __init__(self):
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))

    def train_step(self, data_batch, optimizer, **kwargs):
        real = data_batch[0]
        fake = self.generator(torch.randn(len(real), 2))
        bce = nn.functional.binary_cross_entropy_with_logits
        optimizer['discriminator'].zero_grad()
        real_score, fake_score = self.discriminator(real), self.discriminator(fake.detach())
        loss_d = bce(real_score, torch.ones_like(real_score)) + bce(fake_score, torch.zeros_like(fake_score))
        loss_d.backward()
        optimizer['discriminator'].step()
        optimizer['generator'].zero_grad()
        score = self.discriminator(fake)
        loss_g = bce(score, torch.ones_like(score))
        loss_g.backward()
        optimizer['generator'].step()
        return dict(log_vars=dict(loss_d=loss_d.item(), loss_g=loss_g.item()), num_samples=len(real))


def gan_data():
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(24, 2, generator=generator) * 0.5 + 2.0)


def gan_runner(work_dir, max_epochs=4):
    torch.manual_seed(0)
    model = TinyGAN()
    optimizers = build_optimizers(model, dict(generator=dict(type='Adam', lr=1e-3, betas=(0.5, 0.999)),
                                              discriminator=dict(type='SGD', lr=1e-2, momentum=0.9)))
    runner = EpochBasedRunner(model, optimizer=optimizers, work_dir=work_dir, logger=get_logger('gan'),
                              meta=dict(seed=3, exp_name='gan'), max_epochs=max_epochs)
    runner.register_training_hooks(lr_config=dict(policy='step', step=[2], gamma=0.5),
                                   checkpoint_config=dict(interval=1),
                                   log_config=dict(interval=3, hooks=[dict(type='TextLoggerHook')]),
                                   momentum_config=dict(policy='CosineAnnealing', min_momentum_ratio=0.5))
    loader = DataLoader(gan_data(), batch_size=4, shuffle=True)
    return runner, loader


def log_records(work_dir):
    [name] = [n for n in os.listdir(work_dir) if n.endswith('.log.json')]
    with open(os.path.join(work_dir, name)) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.slow
def test_gan_trains_with_schedules_on_both_optimizers_and_resumes_bitwise(tmp_path):
    full_dir, resumed_dir = str(tmp_path / 'full'), str(tmp_path / 'resumed')
    runner, loader = gan_runner(full_dir)
    runner.run([loader], [('train', 1)])
    optimizers = runner.optimizer
    # the step policy halved both optimizers' LR at epoch 2; momentum annealed on both
    assert optimizers['generator'].param_groups[0]['lr'] == pytest.approx(5e-4)
    assert optimizers['discriminator'].param_groups[0]['lr'] == pytest.approx(5e-3)
    assert optimizers['generator'].param_groups[0]['betas'][0] < 0.5
    assert optimizers['discriminator'].param_groups[0]['momentum'] < 0.9
    records = [r for r in log_records(full_dir) if r.get('mode') == 'train']
    assert records and all('loss_d' in r and 'loss_g' in r for r in records)  # log_vars are what is logged
    assert os.readlink(os.path.join(full_dir, 'latest.pth')) == 'epoch_4.pth'
    checkpoint = torch.load(os.path.join(full_dir, 'epoch_2.pth'), weights_only=True)
    assert set(checkpoint['optimizer']) == {'generator', 'discriminator'} and checkpoint['meta']['exp_name'] == 'gan'
    final = {k: v.clone() for k, v in runner.model.state_dict().items()}
    runner.close()

    resumed, loader = gan_runner(resumed_dir)
    resumed.resume(os.path.join(full_dir, 'epoch_2.pth'))
    resumed.run([loader], [('train', 1)])
    assert resumed.epoch == 4
    for key, value in resumed.model.state_dict().items():
        assert torch.equal(value, final[key]), key
    resumed.close()


class Model(nn.Module):
    """MMCV's examples/train.py model: forward plus a train_step returning the loss."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)
        self.loss_fn = nn.CrossEntropyLoss()

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

    def train_step(self, data, optimizer):
        images, labels = data
        predicts = self(images)
        loss = self.loss_fn(predicts, labels)
        return {'loss': loss}


@pytest.mark.slow
def test_mmcv_example_train_script_runs_with_imports_changed(tmp_path):
    # MMCV's examples/train.py, with `from mmcv.parallel import MMDataParallel`, `from mmcv.runner import
    # EpochBasedRunner` and `from mmcv.utils import get_logger` pointed at hookloop.compat.mmcv; the CIFAR10
    # dataset is replaced by tensors (no download).
    script = textwrap.dedent('''
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        import torch.optim as optim
        from torch.utils.data import DataLoader, TensorDataset

        from hookloop.compat.mmcv import MMDataParallel
        from hookloop.compat.mmcv import EpochBasedRunner
        from hookloop.compat.mmcv import get_logger


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = nn.Linear(4, 16)
                self.fc2 = nn.Linear(16, 2)
                self.loss_fn = nn.CrossEntropyLoss()

            def forward(self, x):
                return self.fc2(F.relu(self.fc1(x)))

            def train_step(self, data, optimizer):
                images, labels = data
                predicts = self(images)  # -> self.__call__() -> self.forward()
                loss = self.loss_fn(predicts, labels)
                return {'loss': loss}


        if __name__ == '__main__':
            torch.manual_seed(0)
            model = Model()
            if torch.cuda.is_available():
                model = MMDataParallel(model.cuda(), device_ids=[0])
            x = torch.randn(64, 4)
            trainset = TensorDataset(x, (x.sum(1) > 0).long())
            trainloader = DataLoader(trainset, batch_size=16, shuffle=True, num_workers=0)
            optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            logger = get_logger('mmcv')
            runner = EpochBasedRunner(model, optimizer=optimizer, work_dir='./work_dir', logger=logger,
                                      max_epochs=4)
            lr_config = dict(policy='step', step=[2, 3])
            optimizer_config = dict(grad_clip=None)
            checkpoint_config = dict(interval=1)
            log_config = dict(interval=2, hooks=[dict(type='TextLoggerHook')])
            runner.register_training_hooks(lr_config=lr_config, optimizer_config=optimizer_config,
                                           checkpoint_config=checkpoint_config, log_config=log_config)
            runner.run([trainloader], [('train', 1)])
    ''')
    (tmp_path / 'train.py').write_text(script)
    import hookloop
    source_root = os.path.dirname(os.path.dirname(os.path.abspath(hookloop.__file__)))  # this checkout's hookloop
    env = dict(os.environ, PYTHONPATH=source_root, CUDA_VISIBLE_DEVICES='')
    result = subprocess.run([sys.executable, 'train.py'], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
    work_dir = tmp_path / 'work_dir'
    assert {'epoch_1.pth', 'epoch_4.pth', 'latest.pth', 'last_checkpoint'} <= set(os.listdir(work_dir))
    losses = [r['loss'] for r in log_records(str(work_dir)) if r.get('mode') == 'train']
    assert len(losses) == 8 and losses[-1] < losses[0]


def test_train_step_model_matches_plain_loop(tmp_path):
    torch.manual_seed(0)
    model = Model()
    reference = Model()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(32, 4)
    data = TensorDataset(x, (x.sum(1) > 0).long())
    runner = EpochBasedRunner(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                              work_dir=str(tmp_path), max_epochs=2,
                              logger=logging.getLogger('test'))
    runner.register_training_hooks(lr_config=None, optimizer_config=dict(grad_clip=None))
    runner.run([DataLoader(data, batch_size=8)], [('train', 1)])
    assert_plain_loop_equal(reference, model, data, epochs=2)
    runner.close()


def assert_plain_loop_equal(reference, model, data, epochs):
    """``reference`` trained by a plain loop over ``data`` ends with ``model``'s weights, bitwise."""
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(epochs):
        for images, labels in DataLoader(data, batch_size=8):
            optimizer.zero_grad()
            reference.train_step((images, labels), optimizer)['loss'].backward()
            optimizer.step()
    for key, value in reference.state_dict().items():
        assert torch.equal(value, model.state_dict()[key]), key


def test_runner_model_assigned_before_the_run_is_the_one_trained(tmp_path):
    """MMCV scripts assign ``runner.model`` before ``run()``: that model's ``train_step`` runs,
    with the optimizer built over its parameters; the first model is left alone. Once a run has
    begun the model stays (one clear line)."""
    torch.manual_seed(0)
    model, reference, placeholder = Model(), Model(), nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    untouched = {k: v.clone() for k, v in placeholder.state_dict().items()}
    x = torch.randn(32, 4)
    data = TensorDataset(x, (x.sum(1) > 0).long())
    runner = EpochBasedRunner(placeholder, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                              work_dir=str(tmp_path), max_epochs=1, logger=logging.getLogger('test'))
    runner.register_training_hooks(lr_config=None, optimizer_config=dict(grad_clip=None))
    with pytest.raises(ConfigError, match='torch.nn.Module'):
        runner.model = 'not a model'
    runner.model = model
    assert runner.model is model
    runner.run([DataLoader(data, batch_size=8)], [('train', 1)])
    assert_plain_loop_equal(reference, model, data, epochs=1)
    assert all(torch.equal(v, untouched[k]) for k, v in placeholder.state_dict().items())
    with pytest.raises(ConfigError, match='once a run has begun'):
        runner.model = placeholder
    assert runner.model is model
    runner.close()


class ValModel(Model):
    def val_step(self, data, optimizer=None):
        images, labels = data
        loss = self.loss_fn(self(images), labels)
        return dict(loss=loss, log_vars=dict(val_loss=loss.item()), num_samples=len(labels))


def test_iter_runner_workflow_val_and_revise_keys(tmp_path):
    torch.manual_seed(0)
    model = ValModel()
    x = torch.randn(32, 4)
    data = TensorDataset(x, (x.sum(1) > 0).long())
    runner = build_runner(dict(type='IterBasedRunner', max_iters=6),
                          default_args=dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                            work_dir=str(tmp_path), logger=logging.getLogger('test')))
    assert isinstance(runner, IterBasedRunner)
    runner.register_training_hooks(lr_config=dict(policy='poly', power=1.0, by_epoch=False),
                                   optimizer_config=dict(grad_clip=None),
                                   log_config=dict(interval=1, hooks=[dict(type='TextLoggerHook', by_epoch=False)]))
    runner.run([DataLoader(data, batch_size=8, shuffle=True), DataLoader(data, batch_size=16)],
               [('train', 3), ('val', 1)])
    val = [r for r in log_records(str(tmp_path)) if r.get('mode') == 'val']
    assert len(val) == 2 and all('val_loss' in r for r in val)  # validation every 3 iterations, val_step's log_vars
    path = runner.save_checkpoint(str(tmp_path), filename_tmpl='manual_{}.pth')
    assert os.path.basename(path) == 'manual_7.pth' and os.readlink(tmp_path / 'latest.pth') == 'manual_7.pth'
    runner.close()

    # weights saved under DataParallel's 'module.' prefix load with MMCV's default revise_keys
    state = {f'module.{k}': v for k, v in model.state_dict().items()}
    torch.save({'state_dict': state}, tmp_path / 'wrapped.pth')
    fresh = ValModel()
    load_checkpoint(fresh, str(tmp_path / 'wrapped.pth'))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in fresh.state_dict().items())
    other = EpochBasedRunner(ValModel(), optimizer=None, work_dir=str(tmp_path / 'other'), max_epochs=1,
                             logger=logging.getLogger('other'))
    other.load_checkpoint(str(tmp_path / 'wrapped.pth'), revise_keys=[(r'^module\.', '')])
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in other.model.state_dict().items())
    other.close()


def test_eval_hook_calls_dataset_evaluate_like_mmdet(tmp_path):
    from mmcv_style.toy import ToyClassifier, ToyImageDataset

    from hookloop.compat.mmcv import EvalHook
    torch.manual_seed(0)
    model = ToyClassifier(backbone=dict(width=8), head=dict(num_classes=2))
    val_set = ToyImageDataset('root', [], split='val', size=20)
    runner = EpochBasedRunner(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                              work_dir=str(tmp_path), max_epochs=2, meta=dict(seed=0),
                              logger=logging.getLogger('test'))
    runner.register_training_hooks(lr_config=None, optimizer_config=dict(grad_clip=None),
                                   log_config=dict(interval=1, hooks=[dict(type='TextLoggerHook')]))
    # mmdet's train_detector: runner.register_hook(eval_hook(val_dataloader, **eval_cfg), priority='LOW')
    runner.register_hook(EvalHook(DataLoader(val_set, batch_size=4), interval=1, metric='accuracy', topk=1),
                         priority='LOW')
    runner.run([DataLoader(ToyImageDataset('root', [], size=32), batch_size=8, shuffle=True)], [('train', 1)])
    assert val_set.evaluated == [20, 20]  # every val sample, once per epoch, in one evaluate() call
    val = [r for r in log_records(str(tmp_path)) if r.get('mode') == 'val']
    assert len(val) == 2 and all('accuracy' in r for r in val)
    runner.close()
