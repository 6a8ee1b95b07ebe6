"""One rank of the 2-rank HF streaming test: train one pass over an HF streaming dataset
given in config form and write the sample ids this rank trained on to ``OUT/ids_rank{r}.json``."""
import json
import os
import sys

from torch import nn

import hookloop
from hookloop import Hook, Trainer


class IdModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, x, id):
        return self.linear(x).square().mean()


class RecordIds(Hook):
    def __init__(self):
        self.ids = []

    def after_train_iter(self, trainer):
        self.ids.extend(trainer.data_batch['id'].tolist())


def main(out, files, max_iters):
    hookloop.seed_everything(0)
    trainer = Trainer(IdModel(), optimizer=dict(type='SGD', lr=0.01), max_iters=max_iters, seed=0, device='cpu',
                      work_dir=os.path.join(out, 'work'), log_config=dict(interval=100),
                      train_dataloader=dict(dataset=dict(type='HFDataset', path='json', data_files=files,
                                                         split='train', streaming=True), batch_size=2))
    recorder = trainer.register_hook(RecordIds())
    trainer.train()
    with open(os.path.join(out, f'ids_rank{trainer.rank}.json'), 'w') as f:
        json.dump(recorder.ids, f)
    trainer.close()


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2].split(','), int(sys.argv[3]))
