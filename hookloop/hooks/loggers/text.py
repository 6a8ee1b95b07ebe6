"""TextLoggerHook: the terminal line and the JSON-lines log of a run."""
import datetime
import json
import os
import shutil
import time

from ...logging.logger import info_line, report_write_failure
from ...registry import HOOKS
from .base import LoggerHook, check_writable_dir


def json_log_path(trainer):
    """Where a run's JSON-lines log lives: ``<work_dir>/<timestamp>.log.json`` (MMCV's name)."""
    return os.path.join(trainer.work_dir, f'{trainer.timestamp}.log.json')


_JSON = json.JSONEncoder(default=float)  # what json.dumps(record, default=float) builds at every call


def _one_shot_encoder():
    """``_JSON.encode`` as the C encoder it builds at every call, built once (a record holds no
    cycles, so no cycle check), or None where that encoder is missing or gives other text."""
    from json import encoder
    try:
        make = encoder.c_make_encoder(None, float, encoder.encode_basestring_ascii, None, ': ', ', ',
                                      False, False, True)
        sample = {'mode': 'train', 'é': 1, 'iter': 3, 'loss': 0.1 + 0.2, 'x': float('nan'), 'n': None, 'b': True}
        if ''.join(make(sample, 0)) == _JSON.encode(sample):
            return make
    except TypeError:  # None (no C extension), or another signature
        pass
    return None


_ENCODE = _one_shot_encoder()


@HOOKS.register_module()
class TextLoggerHook(LoggerHook):
    """Logs the meters every ``interval`` iterations to the terminal in MMCV's shape::

        Epoch [1][10/50]	lr: 1.000e-02, eta: 0:01:05, time: 0.131, data_time: 0.012, memory: 812, loss: 0.4513

    and to ``<work_dir>/<timestamp>.log.json``, one JSON object per log event
    (``mode``, ``epoch``, ``iter`` = iterations completed, ``inner_iter``, every metric).

    Args:
        interval, by_epoch, ignore_last: see :class:`LoggerHook`.
        out_dir: at the end of the run, copy the work dir's files ending in ``out_suffix``
            to ``<out_dir>/<basename of work_dir>/`` (checked writable before training).
        out_suffix: a suffix or a tuple of suffixes.
        keep_local: with ``out_dir``, keep the local copies (False removes them after copying).
        interval_exp_name: every this many iterations, also log the experiment name.
    """

    def __init__(self, interval=10, by_epoch=True, ignore_last=True, out_dir=None,
                 out_suffix=('.log.json', '.log'), keep_local=True, interval_exp_name=1000):
        super().__init__(interval, ignore_last, by_epoch)
        self.out_dir = out_dir
        self.out_suffix = tuple([out_suffix] if isinstance(out_suffix, str) else out_suffix)
        self.keep_local = keep_local
        self.interval_exp_name = interval_exp_name
        self.json_path = None
        self._json_file = None  # open while the logger is: one write per record, not an open and a close
        self._logger = None
        self._start_iter = None
        self._time_sum = 0.0  # sum of logged ``time`` averages x interval: the ETA's basis
        self._wall_start = time.perf_counter()

    def output_dirs(self, trainer):
        return {'log': os.path.abspath(self._copy_dir(trainer))} if self.out_dir is not None else {}

    def _copy_dir(self, trainer):
        """Where the logs are copied: ``<out_dir>/<basename of work_dir>`` (MMCV's place; a
        relative ``out_dir`` is taken from the current directory, as MMCV takes it)."""
        return os.path.join(os.fspath(self.out_dir), os.path.basename(trainer.work_dir))

    def open(self, trainer):
        if self.out_dir is not None:
            check_writable_dir(self._copy_dir(trainer), type(self).__name__)
        self.json_path = json_log_path(trainer)
        self.exp_name = os.path.basename(trainer.work_dir)
        self._json_file = open(self.json_path, 'ab')
        self._write_json({'hookloop': True, 'seed': trainer.seed, 'work_dir': trainer.work_dir,
                          'exp_name': self.exp_name})
        self._wall_start = time.perf_counter()
        self._logger = trainer.logger

    def before_train_epoch(self, trainer):
        super().before_train_epoch(trainer)
        if self._start_iter is None:  # the first iteration this process runs (a resume starts later)
            self._start_iter = self._last_iter = trainer.iter

    def log(self, trainer, record):
        """The line (terminal and ``.log``) and the JSON record of a log event, written and
        flushed now: a crash right after keeps them."""
        logger = self._logger
        if record['mode'] == 'train':
            n = self.interval_exp_name
            if n and record['iter'] // n > self._last_iter // n:  # crossed a multiple of n
                logger.info('Exp name: %s', self.exp_name)
            eta = self.eta_seconds(trainer, record)  # now: it keeps the sum of logged times
            count = trainer.epoch_length if self.by_epoch else trainer.max_iters
            self._last_iter = record['iter']
            info_line(logger, self._format_train, record, eta, count)  # (formatted only when shown)
        else:
            info_line(logger, self._format_val, record)
        self._write_json(record)

    def log_profile(self, trainer, record):
        self._write_json(record)

    def _format_val(self, record):
        items = ', '.join(f'{k}: {_fmt(v)}' for k, v in self.metrics_of(record).items())
        where = f'Epoch(val) [{record["epoch"]}]' if self.by_epoch else f'Iter(val) [{record["iter"]}]'
        return f'{where}  {items}'

    def _write_json(self, record):
        text = ''.join(_ENCODE(record, 0)) if _ENCODE is not None else _JSON.encode(record)
        file = self._json_file
        if file is None:  # turned off: it could not be written
            return
        try:
            file.write((text + '\n').encode())  # ASCII: the encoder escapes the rest
            file.flush()
        except OSError as exc:  # a full disk, a file made read-only: one line, and training goes on
            self._json_file = None
            report_write_failure(f'the JSON log {self.json_path}', exc)
            _close_quietly(file)

    def run_summary(self, trainer):
        return {'json log': os.path.relpath(self.json_path, trainer.work_dir)} if self.json_path else {}

    def eta_seconds(self, trainer, record):
        """Seconds left: the mean logged iteration time (else wall time) x iterations left."""
        done = record['iter'] - self._start_iter
        if 'time' in record:
            self._time_sum += record['time'] * (record['iter'] - self._last_iter)
            per_iter = self._time_sum / max(done, 1)
        else:
            per_iter = (time.perf_counter() - self._wall_start) / max(done, 1)
        return per_iter * (trainer.max_iters - record['iter'])

    def _format_train(self, record, eta, count):
        if self.by_epoch:
            line = f'Epoch [{record["epoch"]}][{record["inner_iter"]}/{count}]\t'
        else:
            line = f'Iter [{record["iter"]}/{count}]\t'
        if 'lr' in record:
            line += f'lr: {record["lr"]:.3e}, '
        line += 'eta: ' + _eta(eta)
        if 'time' in record:
            line += f', time: {record["time"]:.3f}'
        if 'data_time' in record:
            line += f', data_time: {record["data_time"]:.3f}'
        if 'memory' in record:
            line += f', memory: {record["memory"]}'
        for key, value in record.items():
            if key not in _NOT_METRICS:
                if isinstance(value, float):  # _fmt, written out: a call per metric is most of its cost
                    line += f', {key}: {value:.4f}' if abs(value) >= 1e-3 or value == 0 else f', {key}: {value:.3e}'
                else:
                    line += f', {key}: {value}'
        return line

    def close(self, trainer):
        if self._json_file is not None:
            _close_quietly(self._json_file)  # (every record is flushed already)
            self._json_file = None
        if not self.out_dir:
            return
        target = self._copy_dir(trainer)
        for handler in trainer.logger.handlers:  # the .log file must be complete before copying
            handler.flush()
        for name in sorted(os.listdir(trainer.work_dir)):
            if name.endswith(self.out_suffix):
                shutil.copy2(os.path.join(trainer.work_dir, name), os.path.join(target, name))
                if not self.keep_local and not name.endswith('.log'):  # the open .log stays
                    os.remove(os.path.join(trainer.work_dir, name))
        trainer.logger.info('copied the logs to %s', target)


def _close_quietly(file):
    try:
        file.close()
    except OSError:  # what a failed write left in the buffer: reported already
        pass


_NOT_METRICS = frozenset(('mode', 'epoch', 'iter', 'inner_iter', 'lr', 'time', 'data_time', 'memory'))


def _eta(seconds):
    """``str(datetime.timedelta(seconds=int(seconds)))``, without the timedelta under a day."""
    seconds = int(seconds)
    if 0 <= seconds < 86400:
        return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'
    return str(datetime.timedelta(seconds=seconds))


def _fmt(value):
    if isinstance(value, float):
        return f'{value:.4f}' if abs(value) >= 1e-3 or value == 0 else f'{value:.3e}'
    return str(value)
