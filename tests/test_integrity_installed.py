"""Integrity verdicts that do not depend on what is installed (issue 36, item 3).

Every case runs twice: with ``xxhash`` importable and with it hidden (the module global that
``hookloop.fileio.hashing`` imported set to None, as a failed ``import xxhash`` leaves it; one
test hides it from a fresh interpreter's import system instead). Work dirs are written either way too. The rules:
a good checkpoint is never renamed nor called damaged (it resumes, or, where its digest needs a
package that is missing, the search stops with one line naming the package and touches
nothing); a stale digest is never skipped for one that matches; a symlinked sidecar is refused
whatever sits beside it; a sidecar naming another file is refused; a checkpoint whose name and
recorded position disagree is reported.
"""
import hashlib
import logging
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from conftest import train_and_close as train
from hookloop import Trainer
from hookloop.checkpoint.checksum import HashPackageMissingError, verify_checksum
from hookloop.checkpoint.resume_search import find_resumable
from hookloop.errors import CheckpointError
from hookloop.fileio import hashing

pytestmark = pytest.mark.skipif(hashing.xxhash is None, reason='writing the XXH128 work dirs needs xxhash')


def hide_xxhash(monkeypatch):
    monkeypatch.setattr(hashing, 'xxhash', None)


def make_trainer(work_dir, max_epochs=2, **kwargs):
    torch.manual_seed(0)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05), train_dataloader=DataLoader(regression_data(), 8),
                   max_epochs=max_epochs, work_dir=str(work_dir), seed=0, device='cpu',
                   log_config=dict(interval=100), checkpoint_config=dict(interval=1), **kwargs)


@pytest.fixture(params=['xxh128', 'sha256'], ids=['written-with-xxhash', 'written-without'])
def work_dir(request, tmp_path, monkeypatch):
    """A finished run's work dir with ``epoch_1.pth`` and ``epoch_2.pth``, written with or without xxhash."""
    with monkeypatch.context() as patch:
        if request.param == 'sha256':
            hide_xxhash(patch)
        train(make_trainer(tmp_path / 'run'))
    directory = tmp_path / 'run'
    assert os.path.isfile(directory / f'epoch_2.pth.{request.param}')
    return directory


@pytest.fixture(params=[True, False], ids=['xxhash-installed', 'xxhash-missing'])
def installed(request, monkeypatch):
    if not request.param:
        hide_xxhash(monkeypatch)
    return request.param


def snapshot(directory):
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))
            if (directory / name).is_file() and not (directory / name).is_symlink() and not name.endswith('.log')
            and not name.endswith('.json')}


def search(directory):
    return find_resumable(str(directory), [], 5, logging.getLogger('test'), rename_damaged=True)


def verdict(directory):
    """What ``--resume auto`` makes of the work dir: ``('resumed', file)`` or ``('refused', message)``."""
    try:
        path, _ = search(directory)
    except CheckpointError as exc:
        assert '\n' not in str(exc)
        return 'refused', str(exc)
    return 'resumed', os.path.basename(path)


def test_a_good_work_dir_is_never_renamed_and_resumes_wherever_its_digest_can_be_checked(work_dir, installed):
    before = snapshot(work_dir)
    kind, detail = verdict(work_dir)
    written_with = 'xxh128' if (work_dir / 'epoch_2.pth.xxh128').exists() else 'sha256'
    if installed or written_with == 'sha256':
        assert (kind, detail) == ('resumed', 'epoch_2.pth')
    else:  # one line naming the package; the search stops at once, nothing renamed
        assert kind == 'refused' and 'pip install xxhash' in detail and 'the file was left as it is' in detail
        with pytest.raises(HashPackageMissingError):
            search(work_dir)
    assert snapshot(work_dir) == before
    assert not [n for n in os.listdir(work_dir) if '.damaged' in n]


def flip(path):
    data = bytearray(path.read_bytes())
    state = torch.load(path, weights_only=True)['state_dict']
    data[data.find(state['net.0.weight'].numpy().tobytes()[:8])] ^= 0x01  # still loads, with another weight
    path.write_bytes(bytes(data))


def sha256_line(path):
    return f'{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n'


def test_a_stale_digest_is_never_skipped_for_a_recomputed_one(work_dir, installed):
    if not (work_dir / 'epoch_2.pth.xxh128').exists():
        pytest.skip('a SHA-256-only work dir has no second digest to go stale')
    newest = work_dir / 'epoch_2.pth'
    flip(newest)
    (work_dir / 'epoch_2.pth.sha256').write_text(sha256_line(newest))  # recomputed beside a stale .xxh128
    kind, detail = verdict(work_dir)
    assert (kind, detail) != ('resumed', 'epoch_2.pth')
    if installed:  # damaged, set aside: the walk-back continues from epoch_1
        assert (kind, detail) == ('resumed', 'epoch_1.pth') or 'XXH128 does not match' in detail
    else:  # the .xxh128 cannot be checked here: refused, left as it is
        assert (work_dir / 'epoch_2.pth.xxh128').exists() == ('pip install xxhash' in detail)


def test_a_symlinked_sidecar_is_refused_whatever_sits_beside_it(work_dir, installed):
    newest = work_dir / 'epoch_2.pth'
    flip(newest)
    import xxhash  # (the real package: the module global may be hidden here)
    forged = work_dir.parent / 'forged'  # the flipped file's own XXH128: a forged digest that matches
    forged.write_text(f'{xxhash.xxh3_128(newest.read_bytes()).hexdigest()}  {newest.name}\n')
    for suffix in ('.xxh128', '.sha256'):
        if (work_dir / ('epoch_2.pth' + suffix)).exists():
            os.remove(work_dir / ('epoch_2.pth' + suffix))
    (work_dir / 'epoch_2.pth.sha256').write_text(sha256_line(newest))  # a regular, matching sidecar beside ...
    os.symlink(forged, work_dir / 'epoch_2.pth.xxh128')                 # ... a symlinked one
    with pytest.raises(CheckpointError, match=r'epoch_2\.pth\.xxh128 is a symbolic link'):
        verify_checksum(str(newest))
    kind, detail = verdict(work_dir)
    assert (kind, detail) != ('resumed', 'epoch_2.pth')
    assert newest.exists()  # refused as unverifiable, not renamed as damaged


def test_a_sidecar_line_naming_another_file_is_refused(work_dir, installed):
    sidecar = next(work_dir / n for n in os.listdir(work_dir) if n.startswith('epoch_2.pth.'))
    other = next(work_dir / n for n in os.listdir(work_dir) if n.startswith('epoch_1.pth.'))
    digest, _ = hashing.parse_sidecar(sidecar.read_bytes())
    sidecar.write_text(f'{digest}  epoch_1.pth\n')  # the right digest, another file's name
    with pytest.raises(CheckpointError, match=r"is the checksum of 'epoch_1\.pth', not of 'epoch_2\.pth'"):
        verify_checksum(str(work_dir / 'epoch_2.pth'))
    assert other.exists()
    assert verdict(work_dir) != ('resumed', 'epoch_2.pth')


def test_a_swapped_pair_of_checkpoints_is_reported(work_dir, installed):
    if not installed and (work_dir / 'epoch_2.pth.xxh128').exists():
        pytest.skip('XXH128 digests cannot be checked without xxhash (the good-dir test covers it)')
    suffix = '.xxh128' if (work_dir / 'epoch_2.pth.xxh128').exists() else '.sha256'
    for name in ('epoch_1.pth', 'epoch_2.pth'):  # both files swapped with their sidecars, names rewritten
        os.rename(work_dir / name, work_dir / (name + '.tmp'))
        os.rename(work_dir / (name + suffix), work_dir / (name + suffix + '.tmp'))
    for name, other in (('epoch_1.pth', 'epoch_2.pth'), ('epoch_2.pth', 'epoch_1.pth')):
        os.rename(work_dir / (other + '.tmp'), work_dir / name)
        digest, _ = hashing.parse_sidecar((work_dir / (other + suffix + '.tmp')).read_bytes())
        (work_dir / (name + suffix)).write_bytes(hashing.sidecar_line(digest, name))
        os.remove(work_dir / (other + suffix + '.tmp'))
    train(make_trainer(work_dir, max_epochs=3, resume_from='auto'))
    log = ''.join((work_dir / n).read_text() for n in os.listdir(work_dir) if n.endswith('.log'))
    assert 'WARNING - epoch_2.pth holds the state after 5 iterations (epoch 1), not after epoch 2 as its name ' \
        'says' in log


def test_a_fresh_interpreter_without_xxhash_leaves_a_good_work_dir_alone(tmp_path):
    """The same verdict with the package really missing: an import hook refuses ``xxhash``."""
    train(make_trainer(tmp_path / 'run'))
    before = snapshot(tmp_path / 'run')
    script = (
        'import sys, logging\n'
        'class NoXxhash:\n'
        '    def find_spec(self, name, path=None, target=None):\n'
        '        if name == "xxhash":\n'
        '            raise ImportError("no xxhash here")\n'
        'sys.meta_path.insert(0, NoXxhash())\n'
        'from hookloop.checkpoint.resume_search import find_resumable\n'
        'from hookloop.fileio import hashing\n'
        'assert hashing.xxhash is None\n'
        f'find_resumable({str(tmp_path / "run")!r}, [], 5, logging.getLogger("t"), rename_damaged=True)\n')
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=root))
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith('hookloop.checkpoint.checksum.HashPackageMissingError') and 'pip install xxhash' in last
    assert snapshot(tmp_path / 'run') == before
