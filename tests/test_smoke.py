import torch

from hookloop import Trainer
from conftest import Regressor, regression_data


def test_training_matches_plain_sgd_loop(tmp_path):
    torch.manual_seed(0)
    model = Regressor()
    reference = Regressor()
    reference.load_state_dict(model.state_dict())
    data = regression_data()
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    trainer = Trainer(model, optimizer=dict(type='SGD', lr=0.05), train_dataloader=loader, max_epochs=2,
                      work_dir=tmp_path, seed=0, device='cpu')
    trainer.train()
    trainer.close()

    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    for _ in range(2):
        for x, y in torch.utils.data.DataLoader(data, batch_size=8):
            reference(x, y).backward()
            optimizer.step()
            optimizer.zero_grad()
    for a, b in zip(model.state_dict().values(), reference.state_dict().values()):
        assert torch.equal(a, b)
