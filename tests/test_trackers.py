"""Each tracker writes through its real library (no network); the test reads the data back
with that library's own reader (or file format) and compares it with the JSON log."""
import glob
import json
import os
import struct
import time
import sys

import pytest
import torch

from hookloop import Hook
from hookloop.errors import ConfigError
from log_utils import Look, json_records, make_trainer, run

CFG = {'optimizer': {'type': 'SGD', 'lr': 0.05}, 'max_epochs': 2, 'tags': ['a', 'b']}


def needs(module):
    return pytest.importorskip(module, reason=f'{module} is not installed (pip install hookloop[loggers])')


def train_with(tmp_path, tracker, val=True, **kwargs):
    trainer = make_trainer(tmp_path, [dict(type='TextLoggerHook'), tracker], interval=5, val=val, cfg=CFG,
                           evaluation=dict(interval=1), **kwargs)
    return run(trainer)


def expected_series(work_dir):
    """``{'train/loss': [(step, value)], 'val/mse': [...], ...}`` from the JSON log."""
    series = {}
    for r in json_records(work_dir):
        if r['mode'] not in ('train', 'val'):
            continue
        for key, value in r.items():
            if key not in ('mode', 'epoch', 'iter', 'inner_iter'):
                series.setdefault(f'{r["mode"]}/{key}', []).append((r['iter'], value))
    return series


def assert_series_equal(found, expected, rel=1e-6):
    assert sorted(found) == sorted(expected), (sorted(found), sorted(expected))
    for key, points in expected.items():
        assert [s for s, _ in found[key]] == [s for s, _ in points], key
        assert [v for _, v in found[key]] == pytest.approx([v for _, v in points], rel=rel), key


def test_tensorboard_event_file_matches_json_log(tmp_path):
    needs('tensorboard')
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    train_with(tmp_path, dict(type='TensorboardLoggerHook'))
    events = EventAccumulator(str(tmp_path / 'tf_logs'))
    events.Reload()
    found = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()['scalars']}
    expected = expected_series(tmp_path)
    assert [s for s, _ in expected['train/loss']] == [5, 10, 15, 20]
    assert [s for s, _ in expected['val/mse']] == [10, 20]
    assert_series_equal(found, expected)


@pytest.fixture(scope='module')
def mlflow_run(tmp_path_factory):
    """One run into the default store (creating a SQLite store costs seconds: shared)."""
    needs('mlflow')
    work_dir = tmp_path_factory.mktemp('mlflow')
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.delenv('MLFLOW_TRACKING_URI', raising=False)
        monkeypatch.chdir(work_dir)
        trainer = train_with(work_dir, dict(type='MlflowLoggerHook', exp_name='demo', tags={'team': 'x'},
                                            params={'note': 'hi'}, log_model=True))
    return work_dir, next(h for h in trainer.hooks if type(h).__name__ == 'MlflowLoggerHook'), trainer.model


def test_mlflow_run_matches_json_log_and_holds_config(mlflow_run):
    from mlflow.tracking import MlflowClient
    work_dir, hook, _ = mlflow_run
    assert hook.tracking_uri == f'sqlite:///{work_dir}/mlflow.db'  # the default store
    client = MlflowClient(hook.tracking_uri)
    run_ = client.get_run(hook.run_id)
    assert run_.info.status == 'FINISHED'
    assert client.get_experiment(run_.info.experiment_id).name == 'demo'
    assert run_.data.params['optimizer.lr'] == '0.05' and run_.data.params['note'] == 'hi'
    assert run_.data.params['tags'] == "['a', 'b']" and run_.data.tags['team'] == 'x'
    expected = expected_series(work_dir)
    found = {key: [(m.step, m.value) for m in sorted(client.get_metric_history(hook.run_id, key),
                                                      key=lambda m: m.step)]
             for key in run_.data.metrics}
    assert_series_equal(found, expected)
    import mlflow.pytorch
    logged = client.search_logged_models(experiment_ids=[run_.info.experiment_id])
    assert len(logged) == 1 and logged[0].artifact_location.startswith((work_dir / 'mlartifacts').as_uri())
    model = mlflow.pytorch.load_model(logged[0].model_uri)
    for a, b in zip(model.state_dict().values(), mlflow_run[2].state_dict().values()):
        assert torch.equal(a, b)
    assert not (work_dir / 'mlruns').exists()


def test_mlflow_honours_tracking_uri_env_and_marks_failed_runs(mlflow_run, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    uri = mlflow_run[1].tracking_uri  # an existing store, elsewhere than this run's work dir
    monkeypatch.setenv('MLFLOW_TRACKING_URI', uri)
    trainer = make_trainer(tmp_path, [dict(type='MlflowLoggerHook')], interval=5,
                           custom_hooks=[dict(type=FailAt, at=7)])
    with pytest.raises(RuntimeError, match='boom at 7'):
        run(trainer)
    hook = next(h for h in trainer.hooks if type(h).__name__ == 'MlflowLoggerHook')
    run_ = MlflowClient(uri).get_run(hook.run_id)
    assert run_.info.status == 'FAILED'
    assert [m.step for m in MlflowClient(uri).get_metric_history(hook.run_id, 'train/loss')] == [5]
    assert not (tmp_path / 'mlflow.db').exists()


def test_mlflow_gets_the_records_in_batches_not_at_each_event(mlflow_run, tmp_path, monkeypatch, flush_every):
    """A log event only keeps its record: the store gets them when the logs are flushed (the
    flusher's timer, a flush point, close), all in one call, with the same steps and values."""
    from mlflow.tracking import MlflowClient
    from hookloop.logging import flusher
    flush_every(3600.0)  # only the flush points hand over
    uri = mlflow_run[1].tracking_uri
    monkeypatch.setenv('MLFLOW_TRACKING_URI', uri)
    client, seen, batches = MlflowClient(uri), {}, []
    original = MlflowClient.log_batch
    monkeypatch.setattr(MlflowClient, 'log_batch', lambda self, *a, **k: batches.append(1) or original(self, *a, **k))

    def look(trainer):
        if trainer.iter == 4:  # after the events of iterations 2 and 4, inside the first epoch
            hook = next(h for h in trainer.hooks if type(h).__name__ == 'MlflowLoggerHook')
            seen['before'] = client.get_metric_history(hook.run_id, 'train/loss')
            flusher.flush_logs()
            seen['calls'] = len(batches)  # both records in one call
            seen['after'] = [m.step for m in client.get_metric_history(hook.run_id, 'train/loss')]

    trainer = make_trainer(tmp_path, [dict(type='TextLoggerHook'), dict(type='MlflowLoggerHook')], interval=2,
                           custom_hooks=[Look(look)])
    run(trainer)
    assert seen == {'before': [], 'calls': 1, 'after': [2, 4]}
    hook = next(h for h in trainer.hooks if type(h).__name__ == 'MlflowLoggerHook')
    found = {key: [(m.step, m.value) for m in sorted(client.get_metric_history(hook.run_id, key), key=lambda m: m.step)]
             for key in client.get_run(hook.run_id).data.metrics}
    assert_series_equal(found, expected_series(tmp_path))
    assert len(batches) <= 4  # at iteration 4, two epoch ends, close: not one per event (10)


def test_a_failing_mlflow_store_stops_the_run(mlflow_run, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    monkeypatch.setenv('MLFLOW_TRACKING_URI', mlflow_run[1].tracking_uri)

    def refuse(self, *args, **kwargs):
        raise OSError('the store is gone')
    monkeypatch.setattr(MlflowClient, 'log_batch', refuse)
    trainer = make_trainer(tmp_path, [dict(type='MlflowLoggerHook')], interval=5)
    with pytest.raises(OSError, match='the store is gone'):  # at the next event or at close, not lost
        run(trainer)
    hook = next(h for h in trainer.hooks if type(h).__name__ == 'MlflowLoggerHook')
    assert MlflowClient(mlflow_run[1].tracking_uri).get_run(hook.run_id).info.status == 'FAILED'


class FailAt(Hook):
    """Raises in the iteration that completes ``at`` iterations."""

    def __init__(self, at):
        self.at = at

    def after_train_iter(self, trainer):
        if trainer.iter + 1 == self.at:
            raise RuntimeError(f'boom at {self.at}')


def complete_wandb_records(path, timeout=60):
    """The records of a finished run's ``.wandb`` file. ``run.finish()`` hands the records to
    wandb's service process, which writes the file on its own schedule (under load, after
    ``finish`` returned): wait for the ``exit`` record that closes the run."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_wandb_records(path)
        if any(r.WhichOneof('record_type') == 'exit' for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def read_wandb_records(path):
    """The protobuf records of a ``.wandb`` file (a LevelDB-style log: 7-byte file header,
    32 KiB blocks, each chunk ``crc32 u32, length u16, type u8``)."""
    from wandb.proto import wandb_internal_pb2
    data = open(path, 'rb').read()
    assert data[:4] == b':W&B'
    records, pos, pending, block = [], 7, b'', 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer padding
            pos += left
            continue
        _, length, kind = struct.unpack('<IHB', data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b''
    return records


def test_wandb_offline_run_holds_history_and_config(tmp_path, monkeypatch):
    needs('wandb')
    monkeypatch.setenv('WANDB_MODE', 'offline')
    monkeypatch.setenv('WANDB_DIR', str(tmp_path / 'wandb_root'))
    monkeypatch.setenv('WANDB_SILENT', 'true')
    train_with(tmp_path, dict(type='WandbLoggerHook', init_kwargs=dict(project='hookloop-test'), log_artifact=True))
    run_files = glob.glob(str(tmp_path / 'wandb' / 'offline-run-*' / 'run-*.wandb'))
    assert len(run_files) == 1, os.listdir(tmp_path)
    found, config, artifacts = {}, {}, []
    for record in complete_wandb_records(run_files[0]):
        kind = record.WhichOneof('record_type')
        if kind == 'artifact':
            artifacts.append(record.artifact)
        if kind == 'history':
            step = record.history.step.num
            for item in record.history.item:
                key = item.key or '/'.join(item.nested_key)
                if not key.startswith('_'):
                    found.setdefault(key, []).append((step, json.loads(item.value_json)))
        elif kind in ('config', 'run'):
            updates = record.config.update if kind == 'config' else record.run.config.update
            config.update({item.key: json.loads(item.value_json) for item in updates})
    assert_series_equal(found, expected_series(tmp_path))
    assert config['optimizer.lr'] == 0.05
    assert len(artifacts) == 1 and artifacts[0].type == 'logs'
    assert sorted(os.path.basename(e.path) for e in artifacts[0].manifest.contents) == \
        sorted(n for n in os.listdir(tmp_path) if n.endswith(('.log.json', '.log')))


def test_neptune_offline_data_holds_series_and_parameters(tmp_path, monkeypatch):
    needs('neptune')
    monkeypatch.chdir(tmp_path)  # neptune's offline data goes to ./.neptune
    train_with(tmp_path, dict(type='NeptuneLoggerHook', init_kwargs=dict(
        mode='offline', project='a/b', capture_hardware_metrics=False, capture_stdout=False,
        capture_stderr=False, capture_traceback=False, git_ref=False)))
    logs = glob.glob(str(tmp_path / '.neptune' / 'offline' / '*' / '*.log'))
    assert logs, os.listdir(tmp_path)
    found, params = {}, {}
    for path in logs:
        for line in open(path, encoding='utf-8'):
            entry = json.loads(line)
            op = entry.get('obj', entry)
            path_ = '/'.join(op.get('path', []))
            if op.get('type') == 'LogFloats' and not path_.startswith('monitoring/'):
                found.setdefault(path_, []).extend((v['step'], v['value']) for v in op['values'])
            elif path_.startswith('parameters/') and 'value' in op:
                params[path_[len('parameters/'):]] = op['value']
    assert_series_equal(found, expected_series(tmp_path))
    assert params['optimizer.lr'] == 0.05


def test_dvclive_files_hold_series_and_params(tmp_path, monkeypatch):
    needs('dvclive')
    monkeypatch.chdir(tmp_path)  # dvclive runs `dvc init` in the git repository around the cwd
    import yaml
    trainer = train_with(tmp_path, dict(type='DvcliveLoggerHook', model_file='weights.pt'),
                         checkpoint_config=None)
    root = tmp_path / 'dvclive'
    found = {}
    for tsv in glob.glob(str(root / 'plots' / 'metrics' / '**' / '*.tsv'), recursive=True):
        key = os.path.relpath(tsv, root / 'plots' / 'metrics')[:-4].replace(os.sep, '/')
        lines = open(tsv).read().split('\n')
        header = lines[0].split('\t')
        rows = [dict(zip(header, line.split('\t'))) for line in lines[1:] if line]
        found[key] = [(int(r['step']), float(r[key.split('/')[-1]])) for r in rows]
    assert_series_equal(found, expected_series(tmp_path))
    params = yaml.safe_load(open(root / 'params.yaml'))
    assert params['optimizer.lr'] == 0.05
    summary = json.load(open(root / 'metrics.json'))
    assert summary['step'] == 20
    assert trainer.iter == 20


def test_dvclive_gets_the_records_at_flushes_not_at_each_event(tmp_path, monkeypatch, flush_every):
    needs('dvclive')
    import dvclive
    from hookloop.logging import flusher
    monkeypatch.chdir(tmp_path)
    flush_every(3600.0)  # only the flush points hand over
    calls, seen = [], {}
    original = dvclive.Live.log_metric
    monkeypatch.setattr(dvclive.Live, 'log_metric', lambda self, name, value, *a, **k: calls.append(
        (self.step, name)) or original(self, name, value, *a, **k))

    def look(trainer):
        if trainer.iter == 4:  # after the events of iterations 2 and 4, inside the first epoch
            seen['before'] = list(calls)
            flusher.flush_logs()
            seen['after'] = sorted({step for step, name in calls if name == 'train/loss'})

    trainer = make_trainer(tmp_path, [dict(type='DvcliveLoggerHook')], interval=2, custom_hooks=[Look(look)])
    run(trainer)
    assert seen == {'before': [], 'after': [2, 4]}
    assert [step for step, name in calls if name == 'train/loss'] == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]


@pytest.mark.parametrize('hook,module', [('TensorboardLoggerHook', 'tensorboard'), ('MlflowLoggerHook', 'mlflow'),
                                         ('WandbLoggerHook', 'wandb'), ('NeptuneLoggerHook', 'neptune'),
                                         ('DvcliveLoggerHook', 'dvclive')])
def test_missing_library_is_a_clear_error(tmp_path, monkeypatch, hook, module):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
    with pytest.raises(ConfigError, match=f"{hook} needs the '{module}' package.*pip install {module}"):
        make_trainer(tmp_path, [dict(type=hook)])


def test_unwritable_tensorboard_dir_fails_before_training(tmp_path):
    needs('tensorboard')
    blocker = tmp_path / 'file'
    blocker.write_text('')
    trainer = make_trainer(tmp_path / 'w', [dict(type='TensorboardLoggerHook', log_dir=str(blocker / 'tb'))])
    with pytest.raises(ConfigError, match='TensorboardLoggerHook: log directory .* is not writable'):
        run(trainer)
    assert trainer.iter == 0


def test_tensorboard_is_closed_when_training_fails(tmp_path):
    needs('tensorboard')
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    trainer = make_trainer(tmp_path, [dict(type='TensorboardLoggerHook')], interval=5,
                           custom_hooks=[dict(type=FailAt, at=12)])
    with pytest.raises(RuntimeError, match='boom at 12'):
        run(trainer)
    hook = next(h for h in trainer.hooks if type(h).__name__ == 'TensorboardLoggerHook')
    assert hook.is_open is False
    events = EventAccumulator(str(tmp_path / 'tf_logs'))
    events.Reload()
    assert [e.step for e in events.Scalars('train/loss')] == [5, 10]


def test_other_ranks_compute_summaries_but_write_nothing(tmp_path):
    needs('tensorboard')
    trainer = make_trainer(tmp_path, [dict(type='TextLoggerHook'), dict(type='TensorboardLoggerHook')], interval=5)
    trainer.rank = 1  # as a second process would be
    run(trainer)
    assert not list(tmp_path.glob('*.log.json')) and not (tmp_path / 'tf_logs').exists()
    # both loggers took the summary at each log event (the collective runs on every rank)
    marks = [h._mark for h in trainer.hooks if getattr(h, 'ROLE', None) == 'logger']
    assert len(marks) == 2 and all(m == trainer.meters.mark() and m['loss'] == 20 for m in marks)
