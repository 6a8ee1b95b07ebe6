"""The closing summary of a run: what was done, how long it took, where the results are.

Hooks contribute lines through ``Hook.run_summary(trainer) -> {label: text}`` (the
checkpoint hook names the best and the last checkpoint, the text logger its JSON log);
the trainer adds the counts, the wall time and its own ``.log`` file.
"""
import os
import time

from ..checkpoint.format import read_pointer
from ..errors import CheckpointError


def summary_items(trainer, start_time, start_iter):
    items = {'iterations': f'{trainer.iter - start_iter} run (now at {trainer.iter} of {trainer.max_iters}, '
                           f'epoch {trainer.epoch} of {trainer.max_epochs})',
             'wall time': f'{time.perf_counter() - start_time:.1f} s'}
    for hook in trainer.hooks:
        method = getattr(hook, 'run_summary', None)
        if method is not None:
            items.update(method(trainer) or {})
    try:
        last = read_pointer(trainer.storage_dir, also_inside=trainer.checkpointer.checkpoint_dirs()) \
            if trainer.rank == 0 else None
    except CheckpointError:
        last = None
    if last:  # a URL (fsspec work dir or out_dir) is shown as it is
        items['last checkpoint'] = last if '://' in last else os.path.relpath(last, trainer.storage_dir)
    logs = [os.path.relpath(h.baseFilename, trainer.work_dir) for h in trainer.logger.handlers
            if isinstance(getattr(h, 'baseFilename', None), str)]  # the .log is a deferred handler
    if logs:
        items['log files'] = ', '.join(logs + ([items.pop('json log')] if 'json log' in items else []))
    return items


def log_run_summary(trainer, start_time, start_iter):
    try:
        items = summary_items(trainer, start_time, start_iter)
    except Exception as exc:  # the summary must never hide how the run ended
        trainer.logger.warning('could not write the run summary: %r', exc)
        return
    width = max(len(label) for label in items)
    trainer.logger.info('run summary:\n%s', '\n'.join(f'  {label:<{width}}  {text}' for label, text in items.items()))


__all__ = ['summary_items', 'log_run_summary']
