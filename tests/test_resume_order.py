"""``--resume auto`` after a re-based resume (issue 38 item 2): checkpoints are ordered by what
they record (the run that wrote them, its count in the lineage of resumes and its start, then
the position), never by their names, and a run never overwrites a checkpoint an older run wrote
under the same name."""
import os

import pytest

from conftest import train_and_close as train
from resume_helpers import RecordIds as Record
from resume_helpers import StopAt
from test_elastic_resume import N, epoch_ids, make
from hookloop.checkpoint.format import load_checkpoint


@pytest.fixture
def two_runs(tmp_path):
    """A batch-4 run writes iter_1 .. iter_13 (stopped after 3 batches of epoch 2); a batch-8
    resume (re-based to iteration 6) writes iterations 7 and 8, then stops."""
    first, second = Record(), Record()
    train(make(tmp_path, 4, hooks=[first, StopAt(12)]))
    train(make(tmp_path, 8, hooks=[second, StopAt(7)], resume_from='auto'))
    return tmp_path, first, second


def test_a_re_based_run_does_not_overwrite_the_older_runs_files(two_runs):
    work_dir, _, _ = two_runs
    names = sorted(name for name in os.listdir(work_dir) if name.endswith('.pth'))
    assert names == sorted([f'iter_{n}.pth' for n in range(1, 14)] + ['iter_7.run2.pth', 'iter_8.run2.pth'])
    old, new = (load_checkpoint(str(work_dir / name))['meta'] for name in ('iter_7.pth', 'iter_7.run2.pth'))
    assert (old['run']['count'], old['batch_size'], new['run']['count'], new['batch_size']) == (1, 4, 2, 8)
    assert (work_dir / 'last_checkpoint').read_text() == 'iter_8.run2.pth'


@pytest.mark.parametrize('damage', ['truncated', 'missing', 'no pointer'])
def test_the_walk_back_continues_the_newer_run(two_runs, damage, capsys):
    """Before: it resumed iter_13.pth, the older batch-4 run, and the newer run's progress was lost."""
    work_dir, first, second = two_runs
    newest = work_dir / 'iter_8.run2.pth'
    if damage == 'truncated':
        newest.write_bytes(newest.read_bytes()[:100])
    elif damage == 'missing':
        newest.unlink()
    else:
        (work_dir / 'last_checkpoint').unlink()
    capsys.readouterr()
    third = Record()
    resumed = train(make(work_dir, 8, hooks=[third], resume_from='auto'))
    out = capsys.readouterr().out
    expected = 'iter_8.run2.pth' if damage == 'no pointer' else 'iter_7.run2.pth'
    assert f'resumed from {work_dir / expected}' in out
    if damage == 'no pointer':
        assert 'has no last_checkpoint pointer: continuing from' in out
    trained = first.seen + [s for s in second.seen if s[1] < (8 if damage == 'no pointer' else 7)] + third.seen
    assert sorted(epoch_ids([_Seen(trained)], 1)) == list(range(N))  # the interrupted epoch: each sample once
    assert resumed.iter == 15


class _Seen:
    def __init__(self, seen):
        self.seen = seen
