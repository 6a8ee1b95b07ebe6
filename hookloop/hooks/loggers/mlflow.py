"""MlflowLoggerHook: metrics, params and tags of an MLflow run."""
import os
import re
from pathlib import Path

from ...logging.record_batch import RecordBatch
from ...registry import HOOKS
from .base import LoggerHook, check_writable_dir, flatten, require


def _mlflow_key(tag):
    """MLflow keys allow letters, digits, ``_-. /`` only."""
    return re.sub(r'[^A-Za-z0-9_\-. /]', '_', tag)


@HOOKS.register_module()
class MlflowLoggerHook(LoggerHook):
    """Logs every metric as ``<mode>/<key>`` at step = iterations completed, the config
    (flattened: ``optimizer.lr``) and ``params`` as params, ``tags`` as tags.

    The records wait and are handed to the store together (:mod:`~hookloop.logging.record_batch`),
    in one ``MlflowClient.log_batch`` (a ``log_metrics`` call at each event took ~5 ms on a SQLite
    store: a transaction per record, inside the loop); each metric keeps its event's time.

    The tracking store: ``tracking_uri`` if given, else ``MLFLOW_TRACKING_URI`` if set, else
    a SQLite store ``sqlite:///<work_dir>/mlflow.db`` (mlflow 3 refuses the old ``./mlruns``
    file store unless told otherwise). Artifacts go where the store's experiment says.
    The run ends FINISHED, or FAILED when training raised.

    Args:
        exp_name: the experiment (created if missing); default the work dir's name.
        tags, params: extra dicts to record.
        log_model: at the end of a successful run, log the model with ``mlflow.pytorch.log_model``
            (under ``<work_dir>/mlartifacts`` for an experiment created in a SQLite store).
        tracking_uri: see above.
        interval, ignore_last, by_epoch: see :class:`LoggerHook`.
    """

    def __init__(self, exp_name=None, tags=None, params=None, log_model=False, tracking_uri=None,
                 interval=10, ignore_last=True, by_epoch=True):
        super().__init__(interval, ignore_last, by_epoch)
        self.mlflow = require('mlflow', type(self).__name__)
        self.exp_name, self.tags, self.params = exp_name, tags, params
        self.log_model, self.tracking_uri = log_model, tracking_uri
        self.run_id = self._client = None
        self._batch = RecordBatch(self._hand_over, self.keep_failure)

    def open(self, trainer):
        mlflow = self.mlflow
        uri = self.tracking_uri or os.environ.get('MLFLOW_TRACKING_URI')
        if not uri:
            check_writable_dir(trainer.work_dir, type(self).__name__)
            uri = f'sqlite:///{os.path.join(trainer.work_dir, "mlflow.db")}'
        self.tracking_uri = uri
        mlflow.set_tracking_uri(uri)
        name = self.exp_name or os.path.basename(trainer.work_dir)
        if uri.startswith('sqlite:') and mlflow.get_experiment_by_name(name) is None:
            # a local store keeps its artifacts in the work dir too, not in ./mlruns of the cwd
            mlflow.create_experiment(name, artifact_location=Path(trainer.work_dir, 'mlartifacts').as_uri())
        mlflow.set_experiment(name)
        run = mlflow.start_run()
        self.run_id = run.info.run_id
        params = flatten(trainer.cfg) if trainer.cfg is not None else {}
        params.update(flatten(self.params or {}))
        if params:
            # mlflow caps a param value at 6000 characters: long lists are cut, not refused
            mlflow.log_params({k: str(v)[:6000] for k, v in params.items()})
        if self.tags:
            mlflow.set_tags(self.tags)
        self._client = mlflow.MlflowClient(uri)  # log_batch names its run: no active fluent run needed
        self._batch.start()

    def log(self, trainer, record):
        self.raise_kept_failure()
        self._batch.add(record)

    def _hand_over(self, records):
        from mlflow.entities import Metric
        metrics = [Metric(f'{record["mode"]}/{key}', float(value), int(created * 1000), record['iter'])
                   for record, created in records for key, value in self.metrics_of(record).items()]
        for start in range(0, len(metrics), _BATCH):
            self._client.log_batch(self.run_id, metrics=metrics[start:start + _BATCH])

    def log_images(self, trainer, tag, images, step):
        with self._batch.exclusive():
            for index, image in enumerate(images):  # keyed images: MLflow's step slider
                self.mlflow.log_image(image, key=f'{_mlflow_key(tag)}_{index}', step=step, synchronous=True)

    def close(self, trainer):
        self._batch.stop()  # (hands over what is left)
        try:
            if self.log_model and not trainer.outcome.failed:
                import mlflow.pytorch
                # pip_requirements given: inferring them scans the environment (slow). The
                # pickle format as in MMCV: mlflow's 'pt2' needs an input example to trace.
                mlflow.pytorch.log_model(trainer.model, name='models', pip_requirements=['torch'],
                                         serialization_format='pickle')
        finally:
            self.mlflow.end_run(status='FAILED' if trainer.outcome.failed else 'FINISHED')
        self.raise_kept_failure()


_BATCH = 1000  # metrics per log_batch call: MLflow's limit
