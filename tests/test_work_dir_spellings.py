"""Every spelling of one work dir takes one lock: two trainers started on any pair of spellings
of one local directory, or of one S3 prefix (moto's server), never both run.

A spelling with no single meaning (another host, a relative file URL, escapes, chained URLs) is
refused in one line before anything is written."""
import itertools
import os
import shutil

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from hookloop import Hook, Trainer
from hookloop.checkpoint.restore_checks import named_position
from hookloop.errors import ConfigError
from hookloop.fileio.work_dir_identity import lock_identity, resolve_location
from test_storage import s3, s3_endpoint  # noqa: F401  (moto's server and a fresh bucket)

LOCAL = ['{d}/run', '{d}/run/', 'run', '{d}/x/../run', '{d}/link', 'file://{d}/run', 'file://localhost{d}/run',
         'file:{d}/run', 'local://{d}/run', 'FILE:///{d}/run/.']
S3 = ['s3://{b}/run', 's3a://{b}/run', 's3n://{b}/run', 's3://{b}/run/']


def make_trainer(work_dir, hooks=()):
    torch.manual_seed(0)
    loader = DataLoader(regression_data(64), batch_size=16)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05), train_dataloader=loader, max_epochs=1,
                   work_dir=work_dir, seed=0, device='cpu', log_config=dict(interval=100),
                   checkpoint_config=dict(interval=2, by_epoch=False), custom_hooks=list(hooks))


class StartAnother(Hook):
    """At the first iteration, build and train a second trainer on ``spelling``; keep its outcome."""

    def __init__(self, spelling):
        self.spelling, self.outcome = spelling, None

    def after_train_iter(self, trainer):
        if trainer.iter != 0:
            return
        second = make_trainer(self.spelling)
        try:
            second.train()
            self.outcome = 'ran'
        except ConfigError as exc:
            self.outcome = str(exc)
        finally:
            second.close()


def run_pair(first, second):
    hook = StartAnother(second)
    trainer = make_trainer(first, [hook])
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer, hook.outcome


def test_every_pair_of_spellings_of_a_local_dir_runs_once(tmp_path, monkeypatch):
    d = str(tmp_path)
    monkeypatch.chdir(tmp_path)
    os.makedirs(tmp_path / 'run')
    os.makedirs(tmp_path / 'x')
    os.symlink(tmp_path / 'run', tmp_path / 'link')
    spellings = [s.format(d=d) for s in LOCAL]
    assert len({lock_identity(resolve_location(s)) for s in spellings}) == 1
    for i, (first, second) in enumerate(itertools.combinations(spellings, 2)):
        if i % 2:
            first, second = second, first
        trainer, outcome = run_pair(first, second)
        assert outcome is not None and 'is in use by another run' in outcome and '\n' not in outcome, \
            (first, second, outcome)
        assert trainer.outcome.failed is False and trainer.iter == 4, (first, second)
    assert sorted(os.listdir(tmp_path)) == ['link', 'run', 'x']  # no 'file:' or 'local:' folder appeared


def test_every_pair_of_spellings_of_an_s3_prefix_runs_once(tmp_path, monkeypatch, s3):
    fs, bucket = s3
    monkeypatch.chdir(tmp_path)
    spellings = [s.format(b=bucket) for s in S3]
    assert len({lock_identity(resolve_location(s)) for s in spellings}) == 1
    mirrors = set()
    try:
        for first, second in itertools.combinations(spellings, 2):
            trainer, outcome = run_pair(first, second)
            mirrors.add(trainer.work_dir)
            assert outcome is not None and 'is in use by another run' in outcome, (first, second, outcome)
            assert trainer.iter == 4
        fs.invalidate_cache()
        # each run that ran wrote under the one prefix (a later run's names carry a run tag,
        # iter_2.run1.1.pth: a run never overwrites an older run's checkpoint)
        saved = [p for p in fs.ls(f'{bucket}/run') if p.endswith('.pth')]
        assert {named_position(p) for p in saved} == {('iter', 2), ('iter', 4)}
        assert len(saved) == 2 * len(list(itertools.combinations(spellings, 2)))
    finally:
        for mirror in mirrors:
            shutil.rmtree(mirror, ignore_errors=True)
    assert os.listdir(tmp_path) == []


def test_other_s3_endpoints_are_other_stores(s3, monkeypatch):
    fs, bucket = s3
    here = lock_identity(resolve_location(f's3://{bucket}/run'))
    import fsspec
    monkeypatch.setitem(fsspec.config.conf, 's3', {'endpoint_url': 'http://elsewhere.invalid:9000'})
    import s3fs
    s3fs.S3FileSystem.clear_instance_cache()
    assert lock_identity(resolve_location(f's3://{bucket}/run')) != here


@pytest.mark.parametrize('spelling,why', [
    ('file://otherhost/tmp/run', "names the host 'otherhost'"),
    ('file://tmp/run', "names the host 'tmp'"),
    ('local://run', "names the host 'run'"),
    ('file:run', 'is a relative file URL'),
    ('file:///tmp/a%20b', 'percent-escape'),
    ('file:///tmp/run?x=1', 'a query'),
    ('simplecache::s3://b/run', 'chains filesystems'),
    ('s3://b/run?versionId=1', 'holds a query'),
])
def test_a_spelling_without_one_meaning_is_refused_in_one_line(tmp_path, monkeypatch, spelling, why):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=why) as refused:
        make_trainer(spelling).close()
    assert '\n' not in str(refused.value)
    assert os.listdir(tmp_path) == []
