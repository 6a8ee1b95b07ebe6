"""The per-rank program the distributed tests launch with ``torchrun --nproc-per-node 2``.

``python -m torch.distributed.run --standalone --nproc-per-node 2 tests/dist/worker.py MODE OUT``
with MODE ``main`` (DDP, evaluation, logging, accumulation, then FSDP), ``kill``, ``resume``,
``reshard_save`` or ``reshard_load SOURCE_WORLD`` (FSDP checkpoints across world sizes),
``multinode`` (two torchrun agents of one process each).
Importing it also registers ``DistTestClassifier``, ``DistTestData`` and ``DistTestRaiseAt``
for the config that ``torchrun -m hookloop train`` runs in the failure test.

Each mode trains the small classifier below with hookloop and writes what the test
checks to ``OUT/<mode>_rank<r>.pt`` (harness files, outside the trainers' work dirs).
The model, data and settings are importable so the test can build the single-process
reference from the very same definitions.
"""
import os
import signal
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..')))

from hookloop import Trainer  # noqa: E402
from hookloop.hooks.base import Hook  # noqa: E402
from hookloop.priority import Priority  # noqa: E402
from hookloop.registry import DATASETS, HOOKS, MODELS  # noqa: E402

SEED = 3
GLOBAL_BATCH = 8
TRAIN_SIZE = 40       # 5 global batches of 8 per epoch
VAL_SIZE = 13         # odd: rank 1 gets one wrap-around padding sample
EPOCHS = 2
LR, MOMENTUM = 0.1, 0.9
ACC_TRAIN_SIZE = 32   # 4 global batches: windows of 2 never straddle an epoch end
KILL_AT = 7           # the resume test dies after iteration 7 (mid epoch 2), checkpoint at 6
CKPT_INTERVAL = 3


def make_data(n, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=generator)
    label = (x @ torch.randn(6, 3, generator=generator)).argmax(dim=1)
    return TensorDataset(x, label)


def train_set():
    return make_data(TRAIN_SIZE, 0)


def val_set():
    return make_data(VAL_SIZE, 1)


@DATASETS.register_module(module_name='DistTestData')
def dist_test_data(n=TRAIN_SIZE, seed=0):
    """The train set, for configs run by ``torchrun -m hookloop train``."""
    return make_data(n, seed)


@MODELS.register_module(module_name='DistTestClassifier')
class Classifier(nn.Module):
    """``model(x, label)`` -> ``{'loss': cross entropy, 'logits': ...}``."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh())
        self.head = nn.Linear(16, 3)

    def forward(self, x, label):
        logits = self.head(self.body(x))
        return {'loss': nn.functional.cross_entropy(logits, label), 'logits': logits}


def make_model():
    torch.manual_seed(SEED)
    return Classifier()


def mean_ce(outputs, batch):
    return {'ce': nn.functional.cross_entropy(outputs['logits'], batch[1])}


class RecordLoss(Hook):
    """Keeps this rank's loss of every iteration (one host sync per step: test only)."""
    PRIORITY = Priority.LOWEST

    def __init__(self):
        self.losses = []

    def after_train_iter(self, trainer):
        self.losses.append(trainer.outputs['loss'].item())


class DieAt(Hook):
    """SIGKILLs this process after iteration ``at`` (1-based): no Python clean-up runs."""
    PRIORITY = Priority.LOWEST

    def __init__(self, at):
        self.at = at

    def after_train_iter(self, trainer):
        if trainer.iter + 1 == self.at:
            os.kill(os.getpid(), signal.SIGKILL)


@HOOKS.register_module(module_name='DistTestRaiseAt')
class RaiseAt(Hook):
    """Raises on rank 1 only, before iteration ``at`` (1-based); notes the time in
    ``stamp`` first, so the test can measure how long the ranks take to stop."""

    def __init__(self, at, stamp):
        self.at, self.stamp = at, stamp

    def before_train_iter(self, trainer):
        if trainer.rank == 1 and trainer.iter + 1 == self.at:
            with open(self.stamp, 'w') as f:
                f.write(repr(time.time()))
            raise RuntimeError('injected failure on rank 1')


def loader(dataset, batch_size, shuffle):
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)


def trainer_kwargs(world_size, **overrides):
    kwargs = dict(model=make_model(), optimizer=dict(type='SGD', lr=LR, momentum=MOMENTUM),
                  train_dataloader=loader(train_set(), GLOBAL_BATCH // world_size, True),
                  max_epochs=EPOCHS, seed=SEED, device='cpu')
    kwargs.update(overrides)
    return kwargs


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def count_allreduces(ddp_model):
    """Wrap DDP's gradient all-reduce in a counting comm hook; returns the counter."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    counter = {'calls': 0}

    def hook(state, bucket):
        counter['calls'] += 1
        return default_hooks.allreduce_hook(None, bucket)
    ddp_model.register_comm_hook(None, hook)
    return counter


def run_main(out, rank, world):
    """(a) DDP equals one process, (d) rank 0 alone writes, evaluation, logged meters,
    (b) accumulation with no_sync."""
    result = {}
    record = RecordLoss()
    trainer = Trainer(**trainer_kwargs(
        world, work_dir=os.path.join(out, f'work_rank{rank}'),
        val_dataloader=loader(val_set(), 4, False), val_evaluator=dict(type='Accuracy'),
        log_config=dict(interval=5), checkpoint_config=dict(interval=1),
        custom_hooks=[record]))
    result['wrapped'] = type(trainer.wrapped_model).__name__
    result['model_is_unwrapped'] = trainer.model is trainer.wrapped_model.module
    trainer.train()
    result['weights'] = weights(trainer.model)
    result['accuracy'] = trainer.val()['accuracy']
    from hookloop.engine.evaluator import FunctionEvaluator
    trainer.val_evaluator = FunctionEvaluator(mean_ce)
    result['ce'] = trainer.val()['ce']
    try:
        from torchmetrics.classification import MulticlassAccuracy
    except ImportError:
        pass
    else:  # syncs its own state across ranks; the trainer still drops the padding
        from hookloop.engine.evaluator import TorchMetricEvaluator
        trainer.val_evaluator = TorchMetricEvaluator(MulticlassAccuracy(num_classes=3, average='micro'),
                                                     pred_key='logits', name='tm_accuracy')
        result['tm_accuracy'] = trainer.val()['tm_accuracy']
    result['losses'] = record.losses
    result['timestamp'] = trainer.timestamp
    trainer.close()
    if os.environ.get('HOOKLOOP_TEST_ACCUMULATE') == '1':
        acc_loader = loader(make_data(ACC_TRAIN_SIZE, 0), GLOBAL_BATCH // world, True)
        acc = Trainer(**trainer_kwargs(world, work_dir=os.path.join(out, 'work_acc'), train_dataloader=acc_loader,
                                       optimizer_config=dict(cumulative_iters=2)))
        counter = count_allreduces(acc.wrapped_model)
        acc.train()
        result['acc_weights'] = weights(acc.model)
        result['acc_allreduces'] = counter['calls']
        acc.close()
    torch.save(result, os.path.join(out, f'main_rank{rank}.pt'))


def run_resumable(out, rank, world, mode):
    """(c) ``kill``: die mid-epoch after a checkpoint; ``resume``: continue to the end."""
    hooks = [DieAt(KILL_AT)] if mode == 'kill' else []
    trainer = Trainer(**trainer_kwargs(world, work_dir=os.path.join(out, 'work_resume'), auto_resume=True,
                                       checkpoint_config=dict(interval=CKPT_INTERVAL, by_epoch=False),
                                       custom_hooks=hooks))
    trainer.train()
    torch.save({'weights': weights(trainer.model), 'start': trainer.iter},
               os.path.join(out, f'{mode}_rank{rank}.pt'))
    trainer.close()


def run_fsdp(out, rank, world):
    """FSDP2: equal to one process; a sharded checkpoint mid-run resumes exactly."""
    result = {}
    full = Trainer(**trainer_kwargs(world, work_dir=os.path.join(out, 'work_fsdp'), strategy='fsdp',
                                    checkpoint_config=dict(interval=CKPT_INTERVAL, by_epoch=False)))
    result['wrapped'] = type(full.wrapped_model).__name__
    full.train()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    gathered = get_model_state_dict(full.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    result['weights'] = {k: v.clone() for k, v in gathered.items()}
    ckpt = os.path.join(out, 'work_fsdp', f'iter_{2 * CKPT_INTERVAL}.pth')
    result['ckpt_files'] = sorted(os.listdir(ckpt))
    resumed = Trainer(**trainer_kwargs(world, work_dir=os.path.join(out, 'work_fsdp2'), strategy='fsdp',
                                       resume_from=ckpt))
    resumed.train()
    gathered = get_model_state_dict(resumed.model, options=StateDictOptions(full_state_dict=True,
                                                                            cpu_offload=True))
    result['resumed_weights'] = {k: v.clone() for k, v in gathered.items()}
    torch.save(result, os.path.join(out, f'fsdp_rank{rank}.pt'))
    resumed.close()


class CaptureFullState(Hook):
    """At the end of iteration ``after`` (1-based) of a saving run, or at the first iteration
    of a resumed run (``after=None``), gathers the full model, optimizer and EMA tensors (a
    collective: every rank runs it) and writes them, from rank 0, to ``path``."""
    PRIORITY = Priority.LOWEST

    def __init__(self, path, after=None):
        self.path, self.after, self.done = path, after, False

    def before_train_iter(self, trainer):
        if self.after is None and not self.done:
            self.capture(trainer)

    def after_train_iter(self, trainer):
        if self.after is not None and trainer.iter + 1 == self.after:
            self.capture(trainer)

    def capture(self, trainer):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        self.done = True
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state, optim_state = get_state_dict(trainer.model, trainer.optimizer, options=options)
        ema = next(hook for hook in trainer.hooks if type(hook).__name__ == 'EMAHook')
        averages = {name: tensor.full_tensor().clone() for name, tensor in sorted(ema.averages.items())}
        if trainer.rank == 0:
            torch.save({'model': {k: v.clone() for k, v in model_state.items()},
                        'momentum': {k: v['momentum_buffer'].clone() for k, v in optim_state['state'].items()},
                        'ema': averages, 'iter': trainer.iter, 'world_size': trainer.world_size}, self.path)


def run_reshard(out, rank, world, mode, source_world=None, async_save=0):
    """``reshard_save``: FSDP2 + EMA, a sharded checkpoint every 3 iterations, the full state at
    iteration 6 captured; ``reshard_load SOURCE_WORLD``: resume that run's iteration-6 checkpoint
    on this many ranks, capture the state before the first iteration, train to the end."""
    ema = dict(type='EMAHook', momentum=0.1, warm_up=1)
    if mode == 'reshard_save':
        trainer = Trainer(**trainer_kwargs(world, work_dir=os.path.join(out, f'work_reshard_w{world}'),
                                           strategy='fsdp', custom_hooks=[ema, CaptureFullState(
                                               os.path.join(out, f'saved_w{world}.pt'), after=2 * CKPT_INTERVAL)],
                                           checkpoint_config=dict(interval=CKPT_INTERVAL, by_epoch=False,
                                                                  async_save=bool(async_save))))
    else:
        path = os.path.join(out, f'work_reshard_w{source_world}', f'iter_{2 * CKPT_INTERVAL}.pth')
        trainer = Trainer(**trainer_kwargs(world, work_dir=os.path.join(out, f'work_resumed_w{world}'),
                                           strategy='fsdp', resume_from=path, custom_hooks=[ema, CaptureFullState(
                                               os.path.join(out, f'loaded_w{source_world}_on_w{world}.pt'))]))
    trainer.train()
    trainer.close()


def fsdp2_available():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return False
    return True


def main():
    mode, out = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    if mode == 'main':  # one launch for several tests: process start-up dominates
        run_main(out, rank, world)
        if os.environ.get('HOOKLOOP_TEST_FSDP') == '1':
            run_fsdp(out, rank, world)
    elif mode in ('kill', 'resume'):
        run_resumable(out, rank, world, mode)
    elif mode == 'multinode':  # the DDP run of ``main``, launched as two one-process nodes
        trainer = Trainer(**trainer_kwargs(world, work_dir=os.path.join(out, 'work_multinode')))
        trainer.train()
        torch.save({'weights': weights(trainer.model), 'node_rank': int(os.environ.get('GROUP_RANK', -1))},
                   os.path.join(out, f'multinode_rank{rank}.pt'))
        trainer.close()
    elif mode in ('reshard_save', 'reshard_load'):
        run_reshard(out, rank, world, mode, *(int(a) for a in sys.argv[3:]))  # reshard_save: [0, async_save]
    else:
        raise SystemExit(f'unknown mode {mode!r}')


if __name__ == '__main__':
    main()
