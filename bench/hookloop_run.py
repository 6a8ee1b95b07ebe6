"""hookloop under the peer-framework harness (../shared/bench/peers): the same net, data,
optimizer and per-iteration LambdaLR as every peer, default hooks (optimizer step, timer,
text log every 10 iterations).

    EXTRA_DIR=$PWD/bench FRAMEWORKS="raw hookloop mmengine lightning hf ignite" \
        bash ../shared/bench/peers/run_all.sh
"""
import os
import sys
import tempfile

sys.path.insert(0, os.environ.get('PEERS_DIR', os.path.join(os.path.dirname(__file__), '..', '..', 'shared',
                                                              'bench', 'peers')))
import common as C  # noqa: E402
from torch import nn  # noqa: E402

from hookloop import Hook, Trainer  # noqa: E402

args = C.parse_args('hookloop')
rec = C.Recorder(args)  # imports done
C.setup(args)


class Regression(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, y):
        return C.loss_fn(self.net(x), y)


class Stamp(Hook):
    def after_train_iter(self, trainer):
        rec.iter_end(trainer.outputs['loss'])  # a reference only: read once, at the report


model = Regression(C.build_net(args.model))
loader = C.make_loader(C.make_dataset(args), args)
optimizer = C.make_optimizer(model.parameters())
scheduler = C.make_scheduler(optimizer, args)
lr_config = dict(type='TorchSchedulerHook', scheduler=scheduler, by_epoch=False) if scheduler is not None else None
trainer = Trainer(model, optimizer=optimizer, train_dataloader=loader, max_epochs=1, seed=args.seed, device='cpu',
                  work_dir=tempfile.mkdtemp(prefix='hookloop-bench-'), log_level='WARNING', lr_config=lr_config)
trainer.register_hook(Stamp(), priority='LOWEST')
rec.fit_start()
trainer.train()
rec.fit_end()
rec.report()
