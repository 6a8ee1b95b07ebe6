"""NeptuneLoggerHook: metric series and parameters of a neptune.ai run."""
from ...registry import HOOKS
from .base import LoggerHook, flatten, require


@HOOKS.register_module()
class NeptuneLoggerHook(LoggerHook):
    """Appends every metric to the series ``<mode>/<key>`` with step = iterations completed,
    and stores the config under ``parameters``. ``init_kwargs=dict(mode='offline')`` writes
    ``.neptune/offline/...`` in the current directory and ``mode='debug'`` writes nothing;
    neither needs an account.

    Args:
        init_kwargs: passed to ``neptune.init_run`` (``project``, ``api_token``, ``mode``, ...).
        interval, ignore_last, by_epoch: see :class:`LoggerHook`.
    """

    def __init__(self, init_kwargs=None, interval=10, ignore_last=True, by_epoch=True):
        super().__init__(interval, ignore_last, by_epoch)
        self.neptune = require('neptune', type(self).__name__)
        self.init_kwargs = dict(init_kwargs or {})
        self.run = None

    def open(self, trainer):
        self.run = self.neptune.init_run(**self.init_kwargs)
        if trainer.cfg is not None:
            self.run['parameters'] = {k: v if v is not None else 'None' for k, v in flatten(trainer.cfg).items()}

    def log(self, trainer, record):
        for key, value in self.metrics_of(record).items():
            self.run[f'{record["mode"]}/{key}'].append(value, step=record['iter'])

    def log_images(self, trainer, tag, images, step):
        from neptune.types import File
        for index, image in enumerate(images):
            self.run[f'{tag}/{index}'].append(File.as_image(image.astype('float32') / 255.0), step=step)

    def close(self, trainer):
        if trainer.outcome.failed:
            self.run['sys/failed'] = True
        self.run.stop()
