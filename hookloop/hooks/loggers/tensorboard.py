"""TensorboardLoggerHook: scalars in TensorBoard event files."""
import json
import os

from ...logging.record_batch import RecordBatch
from ...registry import HOOKS
from .base import LoggerHook, check_writable_dir, flatten, require


@HOOKS.register_module()
class TensorboardLoggerHook(LoggerHook):
    """Writes every metric as a scalar ``<mode>/<key>`` (``train/loss``, ``train/lr``,
    ``val/accuracy``) at step = iterations completed, through ``torch.utils.tensorboard``.
    The config is written once as the text ``config``.

    A record's scalars become one event, built and handed to TensorBoard's writer with the
    others of the last second (:mod:`~hookloop.logging.record_batch`: each hand-over wakes the
    writer's thread, which then competes with the loop), before any image, at the flush points
    and when the logger closes.
    TensorBoard itself writes its file every 120 s (``flush_secs``) or at close.

    Args:
        log_dir: where the event files go; default ``<work_dir>/tf_logs`` (MMCV's place).
        interval, ignore_last, by_epoch: see :class:`LoggerHook`.
    """

    def __init__(self, log_dir=None, interval=10, ignore_last=True, by_epoch=True):
        super().__init__(interval, ignore_last, by_epoch)
        require('tensorboard', type(self).__name__)
        self.log_dir = log_dir
        self.writer = self._summary = None
        self._batch = RecordBatch(self._hand_over, self.keep_failure)  # the records not yet handed to the writer

    def open(self, trainer):
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import SummaryWriter
        self._summary = Summary  # (imported once, not at every event)
        self.log_dir = check_writable_dir(self.log_dir or os.path.join(trainer.work_dir, 'tf_logs'),
                                          type(self).__name__)
        self.writer = SummaryWriter(self.log_dir)
        if trainer.cfg is not None:
            self.writer.add_text('config', '    ' + json.dumps(flatten(trainer.cfg), indent=1).replace('\n', '\n    '))
        self._batch.start()

    def log(self, trainer, record):
        self.raise_kept_failure()
        self._batch.add(record)

    def _hand_over(self, records):
        """One event with every scalar of a record (what ``add_scalar`` writes one event each for:
        the same tags, values and step for every reader, at a fraction of the cost)."""
        Summary = self._summary
        add, value_of = self.writer._get_file_writer().add_summary, Summary.Value
        for record, _ in records:
            mode = record['mode']
            try:
                values = [value_of(tag=f'{mode}/{key}', simple_value=float(value))
                          for key, value in self.metrics_of(record).items()]
            except OverflowError as exc:  # an int too large for a float: the others still go
                self.keep_failure(exc)
                continue
            if values:
                add(Summary(value=values), record['iter'])

    def log_images(self, trainer, tag, images, step):
        with self._batch.exclusive():  # the scalars first: TensorBoard drops what comes after a later step
            for index, image in enumerate(images):
                self.writer.add_image(f'{tag}/{index}', image, step, dataformats='HWC')

    def close(self, trainer):
        self._batch.stop()  # (hands over what is left)
        self.writer.close()
        self.raise_kept_failure()
