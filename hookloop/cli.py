"""``hookloop train|hooks`` — run a config, or show the order its hooks run in.

Errors from bad input print one line and exit non-zero; ``--debug`` shows the traceback.
"""
import argparse
import sys

from .errors import HookloopError


def load_with_options(path, cfg_options=None):
    """The config dict of a file, with ``--cfg-options`` applied."""
    from .config.loader import load_config, parse_options, set_dotted
    cfg = load_config(path)
    for dotted, value in parse_options(cfg_options).items():
        set_dotted(cfg, dotted, value)
    return cfg


def build_from_config(path, cfg_options=None, work_dir=None, resume=None, **overrides):
    """The trainer a config file describes, after overrides."""
    from .compat.build import build_trainer
    cfg = load_with_options(path, cfg_options)
    if work_dir is not None:
        cfg['work_dir'] = work_dir
    if resume is not None:
        cfg['resume_from'] = resume
    cfg.update(overrides)
    name = cfg.pop('trainer', 'default')
    cfg['cfg'] = dict(cfg)
    return build_trainer(name, default_args=cfg)


def hooks_of_config(path, cfg_options=None):
    """The hooks a config registers (with the defaults a run adds), built without a model,
    data or work dir: nothing is loaded and nothing is written."""
    from .engine.arguments import import_custom_modules
    from .engine.hook_list import HookList
    from .compat.mmcv_config import is_mmcv_config, needs_translation, translate
    from .engine.trainer import Trainer
    cfg = load_with_options(path, cfg_options)
    cfg.pop('trainer', None)
    from .compat import modelscope
    if modelscope.looks_like_modelscope(cfg) and not is_mmcv_config(cfg):  # as build_trainer decides  # a configuration.json: its hooks under hookloop's names
        cfg = modelscope.translate(cfg)
    if needs_translation(cfg):  # MMCV 1.x keys (runner=, data=, fp16=, ...): the names a Trainer takes
        cfg, _ = translate(cfg, Trainer, build_data=False)
    import_custom_modules(cfg.get('custom_imports'))  # they may register hooks
    hooks = HookList()
    hooks.register_training_hooks(cfg.get('lr_config'), cfg.get('optimizer_config'), cfg.get('checkpoint_config'),
                                  cfg.get('log_config'), cfg.get('momentum_config'), cfg.get('timer_config'),
                                  cfg.get('custom_hooks'))
    if cfg.get('evaluation') is not None:
        hooks.register_evaluation(cfg['evaluation'])
    hooks.add_defaults(cfg.get('optimizer') is not None, cfg.get('val_dataloader') is not None)
    return hooks


def _train(args):
    extra = {'profile_hooks': True} if args.profile_hooks else {}
    trainer = build_from_config(args.config, args.cfg_options, args.work_dir, args.resume, **extra)
    trainer.checkpointer.resume_command = _resume_command(args, trainer.storage_dir)
    if str(trainer.storage_dir).startswith('memory://'):
        trainer.logger.warning('work dir %s is in this process\'s memory: its checkpoints are lost when '
                               '`hookloop train` exits (and cannot be resumed); give a local path or a bucket URL',
                               trainer.storage_dir)
    try:
        trainer.train()
    finally:
        reason = str(trainer.stop_reason or '')
        if reason.startswith('received SIG') or reason == 'another rank received a signal':
            _signals_end_the_process()
        trainer.close()
    return 0


def _resume_command(args, work_dir):
    """The command that continues this run (the preemption hint)."""
    import shlex
    words = ['hookloop', 'train', args.config, '--work-dir', str(work_dir), '--resume', 'auto']
    if args.cfg_options:
        words += ['--cfg-options', *args.cfg_options]
    return ' '.join(shlex.quote(word) for word in words)


def _signals_end_the_process():
    """After a run stopped on a signal (its checkpoint saved), another SIGINT/SIGTERM ends the
    process at once and quietly, as the first one asked, not with a KeyboardInterrupt
    traceback from wherever the interpreter is (an exit handler, say)."""
    import signal
    import threading
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)


def _hooks(args):
    print('per stage, the hooks in run order: (priority) name  [declared dependencies]')
    print(hooks_of_config(args.config, args.cfg_options).format_table())
    return 0


def make_parser():
    parser = argparse.ArgumentParser(prog='hookloop', description='hookloop: a training loop built from hooks')
    parser.add_argument('--debug', action='store_true', help='show tracebacks for errors')
    commands = parser.add_subparsers(dest='command', required=True)

    train = commands.add_parser('train', help='train from a config file')
    train.add_argument('config')
    train.add_argument('--work-dir', help='where logs and checkpoints go (overrides the config)')
    train.add_argument('--cfg-options', nargs='+', metavar='KEY=VALUE', default=[],
                       help='override config values, e.g. optimizer.lr=0.01 (values read as Python literals)')
    train.add_argument('--resume', metavar='auto|PATH',
                       help="continue exactly from a checkpoint; 'auto' uses <work_dir>/last_checkpoint")
    train.add_argument('--profile-hooks', action='store_true',
                       help='time every hook at every stage and report the table at the end')
    train.add_argument('--debug', action='store_true', default=argparse.SUPPRESS)
    train.set_defaults(run=_train)

    hooks = commands.add_parser('hooks', help='print, per stage, the hooks of a config in run order')
    hooks.add_argument('config')
    hooks.add_argument('--cfg-options', nargs='+', metavar='KEY=VALUE', default=[])
    hooks.add_argument('--debug', action='store_true', default=argparse.SUPPRESS)
    hooks.set_defaults(run=_hooks)

    for module in _command_modules():
        module.register(commands)
    return parser


def _command_modules():
    import importlib
    import pkgutil

    from . import commands
    return [importlib.import_module(f'{commands.__name__}.{info.name}')
            for info in pkgutil.iter_modules(commands.__path__)]


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except HookloopError as exc:
        if args.debug:
            raise
        print(f'hookloop: error: {exc}', file=sys.stderr)
        return 1
    except Exception as exc:
        # User code failed (a dataset item, a hook, the model): the traceback stays, under
        # one line saying where hookloop was.
        for note in getattr(exc, '__notes__', ()):
            if note.startswith('hookloop: raised while '):
                print(f'hookloop: error {note[len("hookloop: raised "):]}: {type(exc).__name__}: {exc}', file=sys.stderr)
                break
        raise
    except KeyboardInterrupt:
        print('hookloop: interrupted', file=sys.stderr)
        return 130


if __name__ == '__main__':
    sys.exit(main())
