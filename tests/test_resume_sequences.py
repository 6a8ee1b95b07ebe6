"""Randomized resume sequences (issue 38, "Must show"): a dataset of N samples, 1-4 stops at random
iterations, each resume with a random batch size and ``drop_last`` (and, in a few cases, one
segment on 2 ranks under torchrun, gloo), ``train()`` again after some stops, the newest
checkpoint damaged before some resumes. In every epoch each sample is trained exactly once (with
``drop_last`` at most once, the tail short of a batch; on 2 ranks a sample may be drawn once more
as padding, as DistributedSampler pads), ``--resume auto`` continues from the newest good
checkpoint (by write order), and the final weights equal a plain loop over the batches the
lineage trained, bitwise on one rank (on two, DDP's mean of the ranks' gradients, to rounding)."""
import json
import os
import random
import subprocess
import sys
from collections import Counter

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), 'dist'))
import sequence_worker as W  # noqa: E402

from hookloop.checkpoint.format import load_checkpoint, read_pointer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = 40
TORCHRUN_CASES = (6, 11)  # one middle segment of these runs on 2 ranks (a torchrun launch each)


def draw(seed):
    rng = random.Random(seed)
    case = dict(seed=seed, n=rng.randint(10, 20), epochs=rng.randint(2, 3), interval=rng.randint(1, 3), segments=[])
    segment = None
    for stop in range(rng.randint(1, 4)):
        if segment is None or rng.random() < 0.7:  # a new trainer resumes (else: train() again on this one)
            same = segment is not None and rng.random() < 0.4  # resumed as it was (after a re-split, say)
            segment = dict(batch_size=segment['batch_size'] if same else rng.randint(1, 5),
                           drop_last=segment['drop_last'] if same else rng.random() < 0.3, world=1, stops=[],
                           damage=bool(case['segments']) and rng.random() < 0.35)
            case['segments'].append(segment)
        segment['stops'].append(rng.randint(1, 4))  # short: several stops in one epoch
    final = dict(batch_size=rng.randint(1, 5), drop_last=rng.random() < 0.3, world=1, stops=[None],
                 damage=rng.random() < 0.35)
    case['segments'].append(final)
    if seed in TORCHRUN_CASES:  # 1 rank -> 2 ranks (-> 1 rank) where there are segments enough
        case['segments'][min(1, len(case['segments']) - 1)]['world'] = 2
    return case


def newest_good(work_dir):
    """The checkpoint written last among the good ones (write order is the truth)."""
    files = [os.path.join(work_dir, f) for f in os.listdir(work_dir) if f.endswith('.pth')]
    return max(files, key=lambda f: os.stat(f).st_mtime_ns) if files else None


def damage_newest(work_dir):
    """Truncate the pointer's target when another good checkpoint remains; returns the one a
    walk-back must continue from (None when nothing was damaged)."""
    files = [f for f in os.listdir(work_dir) if f.endswith('.pth')]
    target = read_pointer(str(work_dir))
    if len(files) < 2 or target is None:
        return None
    with open(target, 'rb') as f:
        data = f.read()
    with open(target, 'wb') as f:
        f.write(data[:len(data) // 2])
    os.utime(target, ns=(0, 0))  # the truncation is not a newer write
    return newest_good(work_dir)


def run_on_two_ranks(work_dir, spec, out):
    command = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '2',
               os.path.join(ROOT, 'tests', 'dist', 'sequence_worker.py'), str(work_dir), json.dumps(spec), str(out)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, 'tests', 'dist')]),
               OMP_NUM_THREADS='1')
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out, encoding='utf-8') as f:
        return json.load(f)


def replay(case, seen):
    """The plain loop over the recorded batches (DDP's update for a 2-rank iteration: the mean of
    the ranks' losses, whose gradient is the mean of theirs)."""
    model = W.initial_model(case['seed'])
    optimizer = torch.optim.SGD(model.parameters(), lr=W.LR, momentum=W.MOMENTUM)
    x, y, _ = W.dataset(case['n'], case['seed']).tensors
    for _, _, _, *ranks in seen:
        losses = [model(x[ids], y[ids], None) for ids in ranks]
        loss = losses[0] if len(losses) == 1 else sum(losses) / len(losses)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.state_dict()


def check_epochs(case, seen):
    for epoch in range(case['epochs']):
        entries = [entry for entry in seen if entry[0] == epoch]
        drawn = Counter(i for _, _, _, *ranks in entries for ids in ranks for i in ids)
        two_ranks = any(len(entry) > 4 for entry in entries)
        extra = sum(count - 1 for count in drawn.values())
        assert extra <= (1 if two_ranks else 0), (epoch, drawn)
        missing = set(range(case['n'])) - set(drawn)
        if missing:  # only a drop_last tail, shorter than a batch (over the ranks) of a drop_last segment
            tails = [s['batch_size'] * s['world'] for s in case['segments'] if s['drop_last']]
            assert tails and len(missing) < max(tails), (epoch, sorted(missing), case)


@pytest.fixture
def no_fsync(monkeypatch):
    monkeypatch.setattr(os, 'fsync', lambda fd: None)  # durability is not what this test checks; speed is


@pytest.mark.parametrize('seed', range(CASES))
def test_a_random_resume_sequence_trains_each_sample_once_and_equals_the_plain_loop(tmp_path, no_fsync, seed):
    case = draw(seed)
    work_dir, launched = tmp_path / 'run', []
    for index, segment in enumerate(case['segments']):
        expected = damage_newest(work_dir) if segment['damage'] and index else None
        spec = dict(segment, n=case['n'], seed=case['seed'], epochs=case['epochs'], interval=case['interval'])
        if segment['world'] == 2:
            result = run_on_two_ranks(work_dir, spec, tmp_path / f'segment_{index}.json')
            launched.append(index)
        else:
            result = W.run_segment(work_dir, spec)
        if expected is not None and result['resumed_from'] is not None:
            assert result['resumed_from'] == expected, case  # --resume auto: the newest good checkpoint
        if result['iter'] >= result['max_iters']:
            break
    assert bool(launched) == (seed in TORCHRUN_CASES)  # the 2-rank segment ran (the run was not over before it)
    final = load_checkpoint(read_pointer(str(work_dir)))
    seen = final['hooks']['SequenceRecord']['seen']
    check_epochs(case, seen)
    weights, expected_weights = final['state_dict'], replay(case, seen)
    for key in expected_weights:
        if any(len(entry) > 4 for entry in seen):
            torch.testing.assert_close(weights[key], expected_weights[key], rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(weights[key], expected_weights[key]), (key, case)
