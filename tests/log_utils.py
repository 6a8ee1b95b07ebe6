"""Helpers shared by the logging tests: a small run and the records of its JSON log."""
import glob
import json
import os

import torch

from hookloop import Hook, Trainer
from conftest import Regressor, regression_data
from conftest import train_and_close as run  # noqa: F401  (used by the logging tests)


def make_trainer(work_dir, hooks, interval=5, max_epochs=2, batch_size=4, val=False, cfg=None, device='cpu',
                 **kwargs):
    """40 samples / batch 4 = 10 iterations per epoch, SGD, a fixed seed."""
    torch.manual_seed(0)
    data = regression_data()
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size)
    extra = {}
    if val:
        extra = dict(val_dataloader=torch.utils.data.DataLoader(regression_data(n=12, seed=1), batch_size=4),
                     val_evaluator=lambda loss, batch: {'mse': loss})  # model(x, y) is the MSE
    extra.update(kwargs)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05, momentum=0.9), train_dataloader=loader,
                   max_epochs=max_epochs, work_dir=work_dir, seed=0, device=device, cfg=cfg,
                   log_config=dict(interval=interval, hooks=hooks), **extra)


def json_records(work_dir, mode=None):
    """The log events of the newest JSON log in ``work_dir`` (the header line left out)."""
    paths = sorted(glob.glob(os.path.join(work_dir, '*.log.json')))
    assert paths, f'no JSON log in {work_dir}'
    with open(paths[-1], encoding='utf-8') as f:
        records = [json.loads(line) for line in f]
    return [r for r in records if 'mode' in r and (mode is None or r['mode'] == mode)]


def plain_losses(max_epochs=2, batch_size=4, lr=0.05, momentum=0.9):
    """Per-iteration losses of the same training in a plain PyTorch loop."""
    torch.manual_seed(0)
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    losses = []
    for _ in range(max_epochs):
        for x, y in torch.utils.data.DataLoader(regression_data(), batch_size=batch_size):
            loss = model(x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach())
    return torch.stack(losses)


class Look(Hook):
    """Runs ``look(trainer)`` at the start of every training iteration."""

    def __init__(self, look):
        self.look = look

    def before_train_iter(self, trainer):
        self.look(trainer)
