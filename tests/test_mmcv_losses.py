"""MMCV's _parse_losses rule: every output key containing 'loss' is summed and logged; loss_keys wins."""
import torch
from torch import nn
from torch.utils.data import DataLoader

from hookloop import Trainer
from hookloop.engine.model_step import sum_loss_terms

from conftest import regression_data, train_and_close


def test_sum_loss_terms_adds_tensors_and_lists():
    a, b, c = torch.tensor(1.0), torch.tensor([2.0, 4.0]), [torch.tensor(0.5), torch.tensor(0.25)]
    outputs, terms = sum_loss_terms({'loss_cls': a, 'loss_bbox': b, 'loss_aux': c, 'acc': torch.tensor(9.0)})
    assert outputs['loss'].item() == 1.0 + 3.0 + 0.75
    assert {k: v.item() for k, v in terms.items()} == {'loss_cls': 1.0, 'loss_bbox': 3.0, 'loss_aux': 0.75,
                                                       'loss': 4.75}
    given = {'loss': torch.tensor(2.0), 'loss_extra': torch.tensor(7.0)}
    assert sum_loss_terms(given)[0] is given  # a 'loss' entry is the total already: used as it is


class TwoTermModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)

    def forward(self, x, y):
        error = self.net(x) - y
        return {'loss_mse': error.pow(2).mean(), 'loss_l1': [error.abs().mean()]}


def run(tmp_path, optimizer_config):
    torch.manual_seed(0)
    model = TwoTermModel()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(model, optimizer=dict(type='SGD', lr=0.1), max_epochs=1, work_dir=str(tmp_path), seed=0,
                      device='cpu', optimizer_config=optimizer_config,
                      train_dataloader=DataLoader(regression_data(16), batch_size=8))
    train_and_close(trainer)
    return start, model, trainer


def plain_loop(start, loss_of):
    model = TwoTermModel()
    model.load_state_dict(start)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(regression_data(16), batch_size=8):
        optimizer.zero_grad()
        loss_of(model(x, y)).backward()
        optimizer.step()
    return model


def test_several_loss_terms_train_without_loss_keys(tmp_path):
    start, model, trainer = run(tmp_path, dict())
    reference = plain_loop(start, lambda out: out['loss_mse'] + out['loss_l1'][0])
    for key, value in reference.state_dict().items():
        assert torch.allclose(value, model.state_dict()[key], atol=1e-7), key
    assert {'loss_mse', 'loss_l1', 'loss'} <= set(trainer.meters.keys())


def test_explicit_loss_keys_win(tmp_path):
    start, model, _ = run(tmp_path, dict(loss_keys=['loss_mse']))
    reference = plain_loop(start, lambda out: out['loss_mse'])
    for key, value in reference.state_dict().items():
        assert torch.allclose(value, model.state_dict()[key], atol=1e-7), key


def test_load_from_with_revise_keys(tmp_path):
    source = TwoTermModel()
    torch.save({'state_dict': {f'module.{k}': v for k, v in source.state_dict().items()}}, tmp_path / 'w.pth')
    trainer = Trainer(TwoTermModel(), optimizer=dict(type='SGD', lr=0.1), max_epochs=1, work_dir=str(tmp_path / 'r'),
                      seed=0, device='cpu', load_from=str(tmp_path / 'w.pth'), revise_keys=[(r'^module\.', '')],
                      train_dataloader=DataLoader(regression_data(8), batch_size=8))
    trainer.load_weights(str(tmp_path / 'w.pth'))
    assert all(torch.equal(v, source.state_dict()[k]) for k, v in trainer.model.state_dict().items())
    trainer.close()
