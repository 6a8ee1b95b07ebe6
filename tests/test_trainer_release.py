"""A trainer leaves nothing behind (issue 41, item 1): ``close()`` takes its logger out of
``logging``'s registry and leaves no thread and no tracker records; and a trainer that is
dropped is freed at once, with its model and optimizer, as a plain loop's objects are, not at
the garbage collector's next full pass. (Held by reference cycles, each run's model and optimizer
stayed in the process until then; in a sweep of runs the next run's tensors were placed above
them, at the top of the heap, which glibc gave back to the kernel after every step: the plain
loop's ~3,500 page faults per iteration of the ``mlp`` bench model, in every run.)"""
import gc
import logging
import threading
import warnings
import weakref

import numpy as np
import pytest

from hookloop import Hook
from hookloop.logging import flusher
from hookloop.logging.images import publish_images
from log_utils import make_trainer

CONFIGS = {
    'default': dict(hooks=[dict(type='TextLoggerHook')]),
    'checkpoints and evaluation': dict(checkpoint_config=dict(interval=1), val=True, evaluation=dict(interval=1)),
    'async checkpoints': dict(checkpoint_config=dict(interval=1, async_save=True)),
    'ema swapped in for evaluation': dict(custom_hooks=[dict(type='EMAHook', swap=True)], val=True,
                                          evaluation=dict(interval=1)),
    'fp16 and clipping': dict(optimizer_config=dict(precision='fp16', grad_clip=dict(max_norm=1.0))),
    'accumulation': dict(optimizer_config=dict(cumulative_iters=2)),
    'invalid-loss rollback': dict(custom_hooks=[dict(type='CheckInvalidLossHook', on_invalid='rollback')]),
    'preemption': dict(custom_hooks=[dict(type='PreemptionHook')]),
    'schedules': dict(lr_config=dict(policy='step', step=[1]), momentum_config=dict(policy='cyclic')),
    'profiled hooks': dict(profile_hooks=True),
    'tensorboard with images': dict(hooks=[dict(type='TextLoggerHook'), dict(type='TensorboardLoggerHook')],
                                    custom_hooks=['images']),
}


class Images(Hook):
    def after_train_epoch(self, trainer):
        publish_images(trainer, 'grid', [np.zeros((4, 4, 3), dtype=np.uint8)], trainer.iter)


def _trainer(tmp_path, config):
    config = dict(config)
    hooks = config.pop('hooks', [dict(type='TextLoggerHook')])
    if 'tensorboard' in str(hooks):
        pytest.importorskip('tensorboard')
    custom = [Images() if hook == 'images' else hook for hook in config.pop('custom_hooks', [])]
    return make_trainer(str(tmp_path), hooks, interval=2, custom_hooks=custom, **config)


@pytest.mark.parametrize('name', CONFIGS)
def test_a_dropped_trainer_is_freed_at_once_with_its_model_and_optimizer(tmp_path, name):
    trainer = _trainer(tmp_path, CONFIGS[name])
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # (fp16 on the CPU, ...)
        gc.collect()
        gc.disable()  # only reference counts free what follows
        try:
            trainer.train()
            trainer.close()
            refs = [weakref.ref(trainer), weakref.ref(trainer.model), weakref.ref(trainer.optimizer)]
            del trainer
            alive = [type(ref()).__name__ for ref in refs if ref() is not None]
        finally:
            gc.enable()
    assert alive == [], f'{name}: kept by a reference cycle until the garbage collector runs'


def test_close_leaves_no_logger_thread_or_records_behind(tmp_path):
    pytest.importorskip('tensorboard')
    registry = logging.Logger.manager.loggerDict
    threads, names, registered = set(threading.enumerate()), set(registry), flusher.registered()
    for run in range(3):  # a sweep: a new trainer each run
        trainer = make_trainer(str(tmp_path / str(run)), [dict(type='TextLoggerHook'),
                                                          dict(type='TensorboardLoggerHook')], interval=2)
        name = trainer.logger.name
        trainer.train()
        trainer.close()
        assert name not in registry and trainer.logger.handlers == []
        assert set(registry) == names, set(registry) - names  # no placeholder of the run's either
        assert flusher.registered() == registered
        assert [t for t in threading.enumerate() if t not in threads] == []
