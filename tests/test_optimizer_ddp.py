"""Two CPU ranks (gloo) under DDP: a checkpoint taken inside an accumulation window resumes to
the weights of an uninterrupted run, although each rank holds different partial gradients."""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(__file__))

WORLD_SIZE = 2
CFG = dict(cumulative_iters=3, grad_clip=dict(max_norm=1.0))  # 5 batches per rank and epoch


def _run(tmp, name, seed, **kwargs):
    from hookloop import Trainer
    from conftest import Regressor, regression_data
    torch.manual_seed(seed)
    model = Regressor()
    trainer = Trainer(model, optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
                      train_dataloader=DataLoader(regression_data(n=80), batch_size=8), max_epochs=3,
                      work_dir=os.path.join(tmp, name), seed=0, device='cpu', optimizer_config=dict(CFG),
                      log_level='WARNING', **kwargs)
    if not isinstance(trainer.wrapped_model, DistributedDataParallel):
        trainer.wrapped_model = DistributedDataParallel(model)
    trainer.train()
    trainer.close()
    dist.barrier()  # rank 0 has written its files
    return model


def _worker(rank, tmp):
    from hookloop import Hook

    class SaveAndStop(Hook):
        PRIORITY = 'LOW'

        def after_train_iter(self, trainer):
            if trainer.iter == 6:  # inside the window [5, 7] of the second epoch
                trainer.save_checkpoint('mid.pth')
                trainer.request_stop('test')

    dist.init_process_group('gloo', init_method=f'file://{tmp}/rendezvous', rank=rank, world_size=WORLD_SIZE)
    try:
        full = _run(tmp, 'full', seed=0)
        _run(tmp, 'a', seed=0, custom_hooks=[SaveAndStop()])
        resumed = _run(tmp, 'b', seed=1, resume_from=os.path.join(tmp, 'a', 'mid.pth'))
        torch.save({'full': full.state_dict(), 'resumed': resumed.state_dict()}, f'{tmp}/rank{rank}.pt')
    finally:
        dist.destroy_process_group()


def _invalid_loss_worker(rank, tmp):
    from hookloop import Trainer
    from conftest import Regressor, regression_data
    dist.init_process_group('gloo', init_method=f'file://{tmp}/rendezvous', rank=rank, world_size=WORLD_SIZE)
    try:
        data = regression_data(n=80)
        data.tensors[0][2 * 8 * 3 + 1, 0] = float('nan')  # on rank 1 only: the ranks take alternate samples
        for policy in ('skip', 'rollback'):
            torch.manual_seed(0)
            model = Regressor()
            trainer = Trainer(model, optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
                              train_dataloader=DataLoader(data, batch_size=8), max_epochs=2,
                              work_dir=os.path.join(tmp, policy), seed=0, device='cpu', optimizer_config=dict(CFG),
                              log_level='WARNING',
                              custom_hooks=[dict(type='CheckInvalidLossHook', interval=2, on_invalid=policy)])
            if not isinstance(trainer.wrapped_model, DistributedDataParallel):
                trainer.wrapped_model = DistributedDataParallel(model)
            trainer.train()
            trainer.close()
            torch.save(model.state_dict(), f'{tmp}/{policy}{rank}.pt')
    finally:
        dist.destroy_process_group()


def test_ddp_invalid_loss_on_one_rank_drops_the_window_on_all(tmp_path):
    # the bad batch opens window [3, 4] on rank 1: every rank must drop it (the verdict is all-reduced),
    # or rank 0 would wait forever in the window-end all-reduce
    mp.spawn(_invalid_loss_worker, args=(str(tmp_path),), nprocs=WORLD_SIZE, join=True)
    for policy in ('skip', 'rollback'):
        states = [torch.load(tmp_path / f'{policy}{r}.pt') for r in range(WORLD_SIZE)]
        for name, value in states[0].items():
            assert torch.isfinite(value).all() and torch.equal(value, states[1][name]), (policy, name)


def test_ddp_resume_inside_accumulation_window_matches_uninterrupted_run(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=WORLD_SIZE, join=True)
    results = [torch.load(tmp_path / f'rank{r}.pt') for r in range(WORLD_SIZE)]
    from hookloop.checkpoint.format import load_checkpoint
    grads = load_checkpoint(str(tmp_path / 'a' / 'mid.pth'))['hooks']['OptimizerHook']['grads']
    assert all(g is not None for g in grads)
    for result in results:
        for name, value in result['full'].items():
            torch.testing.assert_close(result['resumed'][name], value, atol=1e-6, rtol=0, msg=name)
            assert torch.equal(value, results[0]['full'][name])  # DDP keeps the ranks equal
