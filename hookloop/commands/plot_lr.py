"""``hookloop plot-lr CONFIG -o lr.png`` — draw the learning rate (and momentum) a config
applies at every iteration, without training.

The config's trainer is built (model, optimizer, train dataloader for the iterations per
epoch) and its LR and momentum hooks are driven through the stages a run calls them at,
so the curve is what training would apply, warm-up included. Needs matplotlib.
"""
import argparse
import os
import tempfile
import warnings

from ..errors import ConfigError

SCHEDULE_ROLES = ('lr', 'momentum')


def _momentum_of(group):
    if 'momentum' in group:
        return group['momentum']
    if 'betas' in group:
        return group['betas'][0]
    return None


def simulate_schedule(trainer):
    """Call the trainer's LR and momentum hooks as a run would and record, per iteration,
    every parameter group's ``lr`` and momentum (``None`` where the optimizer has none).

    Returns ``(lrs, momenta)``: lists with one list per iteration, one value per group.
    The trainer is not trained; its optimizer's values are changed.
    """
    if trainer.train_dataloader is None or trainer.optimizer is None:
        raise ConfigError('plot-lr needs a config with a train_dataloader and an optimizer')
    hooks = [hook for hook in trainer.hooks if getattr(hook, 'ROLE', None) in SCHEDULE_ROLES]
    groups = trainer.optimizer.param_groups
    lrs, momenta = [], []
    trainer.epoch = trainer.iter = trainer.inner_iter = 0
    with warnings.catch_warnings():
        # torch warns when a scheduler steps before the optimizer ever did; none steps here
        warnings.simplefilter('ignore', UserWarning)
        for hook in hooks:  # the life cycle of a run: set-up once, then before_run
            hook.setup(trainer)
            hook.before_run(trainer)
        for trainer.epoch in range(trainer.max_epochs):
            for hook in hooks:
                hook.before_train_epoch(trainer)
            for trainer.inner_iter in range(trainer.epoch_length):
                trainer.iter = trainer.epoch * trainer.iters_per_epoch + trainer.inner_iter
                for hook in hooks:
                    hook.before_train_iter(trainer)
                lrs.append([group['lr'] for group in groups])
                momenta.append([_momentum_of(group) for group in groups])
    return lrs, momenta


def plot_schedule(lrs, momenta, path, title=None):
    """Write a PNG with the LR curve of each parameter group (and momentum when any)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    has_momentum = any(m is not None for row in momenta for m in row)
    rows = 2 if has_momentum else 1
    figure, axes = plt.subplots(rows, 1, figsize=(8, 3.2 * rows), sharex=True, squeeze=False)
    iterations = range(len(lrs))
    for g in range(len(lrs[0]) if lrs else 0):
        axes[0][0].plot(iterations, [row[g] for row in lrs], label=f'group {g}')
        if has_momentum:
            axes[1][0].plot(iterations, [row[g] for row in momenta], label=f'group {g}')
    axes[0][0].set_ylabel('learning rate')
    axes[0][0].legend(loc='best')
    axes[0][0].grid(alpha=0.3)
    if has_momentum:
        axes[1][0].set_ylabel('momentum / beta1')
        axes[1][0].grid(alpha=0.3)
    axes[-1][0].set_xlabel('iteration')
    if title:
        axes[0][0].set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _run(args):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError('plot-lr needs matplotlib: pip install "hookloop[all]"') from None
    from ..cli import build_from_config
    with tempfile.TemporaryDirectory() as work_dir:  # nothing of the would-be run is kept
        trainer = build_from_config(args.config, args.cfg_options, work_dir=work_dir, resume_from=None,
                                    auto_resume=False, load_from=None)
        try:
            lrs, momenta = simulate_schedule(trainer)
        finally:
            trainer.close()
    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    plot_schedule(lrs, momenta, out, title=os.path.basename(args.config))
    print(f'{len(lrs)} iterations; lr of group 0 from {lrs[0][0]:.6g} to {lrs[-1][0]:.6g}; written to {out}')
    return 0


def register(subparsers):
    parser = subparsers.add_parser('plot-lr', help='draw the learning rate / momentum a config applies, '
                                                   'per iteration, without training')
    parser.add_argument('config')
    parser.add_argument('-o', '--out', default='lr.png', help='the PNG to write (default: lr.png)')
    parser.add_argument('--cfg-options', nargs='+', metavar='KEY=VALUE', default=[])
    parser.add_argument('--debug', action='store_true', default=argparse.SUPPRESS)
    parser.set_defaults(run=_run)
