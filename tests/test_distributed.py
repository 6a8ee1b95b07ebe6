"""Distributed training under real ``torchrun --standalone --nproc-per-node 2`` (gloo, CPU).

Every launch costs process start-up (seconds on a small machine), so one launch of
``tests/dist/worker.py main`` serves several tests (module fixture). References are
plain PyTorch loops written here over the same model, data and order.
"""
import json
import math
import os
import re
import sys
import time

import pytest
import torch
import torch.distributed as torch_dist

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..'))
WORKER = os.path.join(ROOT, 'tests', 'dist', 'worker.py')
sys.path.insert(0, os.path.join(ROOT, 'tests', 'dist'))
import worker as W  # noqa: E402
from launch import check_ok, torchrun  # noqa: E402,F401

pytestmark = pytest.mark.skipif(not (torch_dist.is_available() and torch_dist.is_gloo_available()),
                                reason='torch.distributed with gloo is not available')


def accumulation_supported():
    """Whether OptimizerHook(cumulative_iters=2) steps once per 2 iterations (branch opt)."""
    from hookloop import Trainer
    model = W.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    optimizer.register_step_post_hook(lambda *args: steps.append(1))
    trainer = Trainer(model=model, optimizer=optimizer, train_dataloader=W.loader(W.train_set(), 8, False),
                      max_iters=2, launcher='none', device='cpu', work_dir=os.path.join(ROOT, '.pytest_cache', 'acc'),
                      optimizer_config=dict(cumulative_iters=2), log_config=dict(interval=100))
    trainer.train()
    trainer.close()
    return len(steps) == 1


def plain_loop(cumulative_iters=1, size=W.TRAIN_SIZE):
    """The single-process reference: global batch 8 in DistributedSampler's order
    (randperm seeded with seed + epoch), SGD with momentum; with ``cumulative_iters``
    the loss is divided by it and the optimizer steps at the end of each window."""
    model = W.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=W.LR, momentum=W.MOMENTUM)
    data = W.make_data(size, 0)
    for epoch in range(W.EPOCHS):
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(W.SEED + epoch)).tolist()
        batches = [order[i:i + W.GLOBAL_BATCH] for i in range(0, len(order), W.GLOBAL_BATCH)]
        for n, batch in enumerate(batches):
            x, label = data[batch]
            loss = model(x, label)['loss']
            (loss / cumulative_iters).backward()
            if (n + 1) % cumulative_iters == 0 or n + 1 == len(batches):
                optimizer.step()
                optimizer.zero_grad()
    return model


def assert_close(actual, expected, atol=1e-6):
    assert actual.keys() == expected.keys()
    for key in expected:
        assert torch.allclose(actual[key], expected[key], rtol=0, atol=atol), \
            f'{key}: max diff {(actual[key] - expected[key]).abs().max():.3g}'


@pytest.fixture(scope='module')
def main_run(tmp_path_factory):
    out = tmp_path_factory.mktemp('dist_main')
    accumulate = accumulation_supported()
    proc, seconds = torchrun('main', out, env={'HOOKLOOP_TEST_ACCUMULATE': '1' if accumulate else '0',
                                               'HOOKLOOP_TEST_FSDP': '1' if W.fsdp2_available() else '0'})
    check_ok(proc)
    ranks = [torch.load(out / f'main_rank{r}.pt', weights_only=True) for r in range(2)]
    return out, ranks, accumulate, proc


def test_ddp_two_ranks_equal_single_process_batch(main_run):
    """(a) 2 ranks x batch 4 == 1 process x batch 8 on the same order; the user's
    model is ``trainer.model``, DDP is ``trainer.wrapped_model``."""
    _, ranks, _, _ = main_run
    reference = plain_loop().state_dict()
    assert ranks[0]['wrapped'] == 'DistributedDataParallel' and ranks[0]['model_is_unwrapped']
    assert_close(ranks[0]['weights'], reference)
    for key in reference:  # DDP keeps the replicas identical
        assert torch.equal(ranks[0]['weights'][key], ranks[1]['weights'][key])


def test_only_rank0_writes_files(main_run):
    """(d) each rank was given its own work dir: rank 1's stays absent, rank 0's has the
    log, the JSON log and both epoch checkpoints."""
    out, ranks, _, _ = main_run
    assert not (out / 'work_rank1').exists()
    files = set(os.listdir(out / 'work_rank0'))
    stamp = ranks[0]['timestamp']
    assert {f'{stamp}.log', f'{stamp}.log.json', 'epoch_1.pth', 'epoch_2.pth', 'last_checkpoint'} <= files
    assert ranks[0]['timestamp'] == ranks[1]['timestamp']  # broadcast from rank 0


def test_evaluation_covers_val_set_once(main_run):
    """13 val samples over 2 ranks: rank 1 gets one wrap-around copy of sample 0, which
    must not count. Accuracy and a function metric equal the whole-set values."""
    _, ranks, _, _ = main_run
    model = W.make_model()
    model.load_state_dict(ranks[0]['weights'])
    x, label = W.val_set()[:]
    with torch.no_grad():
        logits = model(x, label)['logits']
    accuracy = 100.0 * (logits.argmax(1) == label).sum().item() / len(label)
    ce = torch.nn.functional.cross_entropy(logits, label).item()
    # The padded set (sample 0 twice) gives a different value: the test can tell.
    padded = torch.cat([logits, logits[:1]]), torch.cat([label, label[:1]])
    assert abs(torch.nn.functional.cross_entropy(*padded).item() - ce) > 1e-4
    for rank in ranks:
        assert rank['accuracy'] == pytest.approx(accuracy, abs=1e-9)
        assert rank['ce'] == pytest.approx(ce, rel=1e-6)
        if 'tm_accuracy' in rank:  # torchmetrics
            assert 100 * rank['tm_accuracy'] == pytest.approx(accuracy, abs=1e-4)


def test_logged_loss_is_mean_over_ranks(main_run):
    """Rank 0's JSON log shows the loss averaged over the interval and both ranks."""
    out, ranks, _, _ = main_run
    path = out / 'work_rank0' / f'{ranks[0]["timestamp"]}.log.json'
    events = [json.loads(line) for line in path.read_text().splitlines()]
    logged = [e['loss'] for e in events if e.get('mode') == 'train' and 'loss' in e]
    per_iter_global = [(a + b) / 2 for a, b in zip(ranks[0]['losses'], ranks[1]['losses'])]
    interval = 5
    expected = [sum(per_iter_global[i:i + interval]) / interval for i in range(0, len(per_iter_global), interval)]
    assert len(logged) == len(expected)
    assert logged == pytest.approx(expected, rel=1e-4)


def test_accumulation_all_reduces_once_per_window(main_run):
    """(b) cumulative_iters=2: same weights as one process accumulating 2 batches of 8,
    and DDP's gradient all-reduce ran once per window (no_sync in between)."""
    _, ranks, accumulate, _ = main_run
    assert accumulate
    reference = plain_loop(cumulative_iters=2, size=W.ACC_TRAIN_SIZE).state_dict()
    assert_close(ranks[0]['acc_weights'], reference)
    iters = W.EPOCHS * W.ACC_TRAIN_SIZE // W.GLOBAL_BATCH
    windows = iters // 2  # without no_sync there would be one all-reduce per iteration
    assert ranks[0]['acc_allreduces'] == ranks[1]['acc_allreduces'] == windows


def test_kill_both_ranks_and_resume_is_bitwise(tmp_path, main_run):
    """(c) SIGKILL both ranks after iteration 7 (mid epoch 2); auto-resume from the
    iteration-6 checkpoint; the weights equal the uninterrupted run bit for bit."""
    proc, _ = torchrun('kill', tmp_path)
    assert proc.returncode != 0
    assert not (tmp_path / 'kill_rank0.pt').exists()
    pointer = (tmp_path / 'work_resume' / 'last_checkpoint').read_text()
    assert pointer == f'iter_{2 * W.CKPT_INTERVAL}.pth'  # relative to the work dir
    proc, _ = torchrun('resume', tmp_path)
    check_ok(proc)
    assert f'resumed from {tmp_path / "work_resume" / pointer}' in proc.stdout
    uninterrupted = main_run[1][0]['weights']
    for rank in range(2):
        resumed = torch.load(tmp_path / f'resume_rank{rank}.pt', weights_only=True)['weights']
        for key in uninterrupted:
            assert torch.equal(resumed[key], uninterrupted[key]), key


FAIL_CONFIG = """
custom_imports = ['worker']
model = dict(type='DistTestClassifier')
train_dataloader = dict(dataset=dict(type='DistTestData'), batch_size=4, shuffle=True)
optimizer = dict(type='SGD', lr=0.1)
max_epochs = 50
device = 'cpu'
dist_timeout = 30
custom_hooks = [dict(type='DistTestRaiseAt', at=3, stamp={stamp!r})]
work_dir = {work_dir!r}
"""


def test_one_rank_raising_stops_both(tmp_path):
    """(e) ``torchrun -m hookloop train CONFIG``: rank 1 raises; rank 0 is blocked in the
    gradient all-reduce. Both stop and torchrun exits non-zero well within 60 s,
    reporting the original error."""
    config = tmp_path / 'fail_config.py'
    config.write_text(FAIL_CONFIG.format(stamp=str(tmp_path / 'raised_at'), work_dir=str(tmp_path / 'work')))
    proc, _ = torchrun(None, tmp_path, program=['-m', 'hookloop', 'train', str(config)])
    ended = time.time()
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    raised = float((tmp_path / 'raised_at').read_text())
    assert ended - raised < 60, f'the ranks took {ended - raised:.0f} s to stop after the error'
    print(f'all ranks stopped {ended - raised:.1f} s after the error')
    assert 'RuntimeError: injected failure on rank 1' in output
    assert 'rank 1 of 2 stopped by RuntimeError' in output
    # torchrun's summary: rank 1 failed first (exit 1), rank 0 was stopped (SIGTERM).
    assert re.search(r'rank\s*:\s*1 .*\n\s*exitcode\s*:\s*1\b', output)
    assert re.search(r'rank\s*:\s*0 .*\n\s*exitcode\s*:\s*-?\d+', output)


@pytest.mark.skipif(not W.fsdp2_available(),
                    reason='this torch has no FSDP2 (fully_shard); see bench/ddp_gpu.py for CUDA')
def test_fsdp_two_ranks_and_sharded_resume(main_run):
    """FSDP2 on gloo: weights equal the single-process loop; a sharded checkpoint
    (one .distcp per rank plus hookloop.pth) resumes to the same end weights."""
    result = torch.load(main_run[0] / 'fsdp_rank0.pt', weights_only=True)
    assert result['wrapped'].startswith('FSDP')
    assert {'__0_0.distcp', '__1_0.distcp', '.metadata', 'hookloop.pth'} <= set(result['ckpt_files'])
    reference = plain_loop().state_dict()
    assert_close(result['weights'], reference)
    for key in reference:
        assert torch.equal(result['resumed_weights'][key], result['weights'][key]), key


@pytest.mark.slow
@pytest.mark.parametrize('files', [1, 2])  # 1 shard: every 2nd example per rank; 2 shards: one each
def test_hf_streaming_dataset_is_split_across_ranks_disjoint_and_complete(tmp_path, files):
    pytest.importorskip('datasets')
    paths, ident = [], 0
    for index in range(files):
        path = tmp_path / f'part{index}.jsonl'
        with open(path, 'w') as f:
            for _ in range(16 // files):
                f.write(json.dumps({'x': [float(ident), 1.0], 'id': ident}) + '\n')
                ident += 1
        paths.append(str(path))
    program = [os.path.join(ROOT, 'tests', 'dist', 'hf_stream_worker.py'), str(tmp_path), ','.join(paths), '4']
    proc, _ = torchrun(None, tmp_path, program=program)  # 4 iterations of 2 = one pass of 8 per rank
    check_ok(proc)
    ids = [json.load(open(tmp_path / f'ids_rank{rank}.json')) for rank in range(2)]
    assert len(ids[0]) == len(ids[1]) == 8
    assert not set(ids[0]) & set(ids[1])
    assert sorted(ids[0] + ids[1]) == list(range(16))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not W.fsdp2_available(), reason='this torch has no FSDP2 (fully_shard)')
@pytest.mark.parametrize('saved_on, resumed_on', [(2, 1), (1, 2)], ids=['2to1', '1to2'])
def test_fsdp_checkpoint_reshards_to_another_world_size_with_ema(tmp_path, saved_on, resumed_on):
    """A sharded checkpoint (model, optimizer and EMA averages, each rank's shards) saved on
    ``saved_on`` ranks, resumed on ``resumed_on``: before the first resumed iteration the
    gathered model, momentum and EMA tensors equal those at the save, bit for bit, and
    training continues to the end. The 2-rank save is asynchronous (``async_save=True``:
    ``torch.distributed.checkpoint.async_save``), the 1-rank one synchronous."""
    async_save = int(saved_on == 2)
    check_ok(torchrun(None, tmp_path, nproc=saved_on,
                      program=[WORKER, 'reshard_save', str(tmp_path), '0', str(async_save)])[0])
    if async_save:
        pointer = (tmp_path / 'work_reshard_w2' / 'last_checkpoint').read_text()
        assert pointer.endswith('iter_10.pth')  # the last save, finished before the run ended
        assert (tmp_path / 'work_reshard_w2' / 'iter_10.pth' / 'hookloop.pth').is_file()
    proc, _ = torchrun(None, tmp_path, nproc=resumed_on,
                       program=[WORKER, 'reshard_load', str(tmp_path), str(saved_on)])
    check_ok(proc)
    saved = torch.load(tmp_path / f'saved_w{saved_on}.pt', weights_only=True)
    loaded = torch.load(tmp_path / f'loaded_w{saved_on}_on_w{resumed_on}.pt', weights_only=True)
    assert saved['world_size'] == saved_on and loaded['world_size'] == resumed_on
    assert loaded['iter'] == saved['iter'] + 1 == 2 * W.CKPT_INTERVAL
    for part in ('model', 'momentum', 'ema'):
        assert saved[part].keys() == loaded[part].keys() and saved[part]
        for key in saved[part]:
            assert torch.equal(saved[part][key], loaded[part][key]), f'{part}.{key}'
    # The EMA differs from the weights (so the test would see rank 0's shard alone, or none).
    assert any(not torch.equal(saved['ema'][k], saved['model'][k]) for k in saved['ema'])


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_torchrun_agents_train_like_one_standalone_job(tmp_path, main_run):
    """``torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d`` started twice on
    127.0.0.1 (two "machines" of one process): the same weights, bit for bit, as the
    2-process standalone run of the main test, on both ranks."""
    import threading
    launch = ('--nnodes', '2', '--rdzv-backend', 'c10d', '--rdzv-endpoint', f'127.0.0.1:{free_port()}',
              '--rdzv-id', f'hookloop-test-{os.getpid()}', '--max-restarts', '0')
    results = [None, None]

    def agent(index):
        results[index] = torchrun('multinode', tmp_path, nproc=1, launch=launch, timeout=240)[0]
    agents = [threading.Thread(target=agent, args=(i,)) for i in range(2)]
    for thread in agents:
        thread.start()
    for thread in agents:
        thread.join()
    for proc in results:
        assert proc is not None, 'a torchrun agent ran over its timeout'
        check_ok(proc)
    standalone = main_run[1][0]['weights']
    nodes = set()
    for rank in range(2):
        result = torch.load(tmp_path / f'multinode_rank{rank}.pt', weights_only=True)
        nodes.add(result['node_rank'])
        for key in standalone:
            assert torch.equal(result['weights'][key], standalone[key]), key
    assert nodes == {0, 1}  # one process on each agent


# -- elastic resume across world sizes (issue 23) ------------------------------------------------
import elastic_worker as E  # noqa: E402

ELASTIC = os.path.join(ROOT, 'tests', 'dist', 'elastic_worker.py')


@pytest.fixture(scope='module')
def elastic_runs(tmp_path_factory):
    """Three launches: 2-rank runs (DDP, FSDP2) saving; one rank resuming them and saving its
    own; 2 ranks resuming those. Each saves at an epoch boundary and mid-epoch."""
    out = tmp_path_factory.mktemp('elastic')
    for nproc, args in ((2, ['save']), (1, ['save,resume', '2']), (2, ['resume', '1'])):
        check_ok(torchrun(None, out, nproc=nproc, program=[ELASTIC, args[0], str(out), *args[1:]])[0])
    return out


def _records(out, tag, world):
    return [row for rank in range(world) for row in torch.load(out / f'records_{tag}_rank{rank}.pt')]


def _cosine(t, total):
    return 0.5 * E.LR * (1 + math.cos(math.pi * t / total))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not W.fsdp2_available(), reason='this torch has no FSDP2 (fully_shard)')
@pytest.mark.parametrize('strategy', E.STRATEGIES)
@pytest.mark.parametrize('saved_on, resumed_on', [(2, 1), (1, 2)], ids=['2to1', '1to2'])
def test_elastic_resume_to_another_world_size_trains_each_sample_of_the_epoch_once(elastic_runs, strategy,
                                                                                     saved_on, resumed_on):
    """From an epoch-boundary and a mid-epoch checkpoint of a ``saved_on``-rank run (per-rank
    batch 4, so the epoch has 6 or 12 iterations): the resumed ``resumed_on``-rank run trains
    every sample of the interrupted epoch not seen before the save, once in total over its
    ranks; model, momentum and EMA are restored bit for bit; the iteration is re-based and the
    cosine LR follows the new length (iteration t of 3 * iters_per_epoch)."""
    out = elastic_runs
    per_epoch = {w: E.N // (E.BATCH * w) for w in (1, 2)}
    original = _records(out, f'{strategy}_w{saved_on}', saved_on)
    for n in E.save_points(saved_on):
        tag = f'{strategy}_w{saved_on}_{n}_on_w{resumed_on}'
        resumed = _records(out, tag, resumed_on)
        epoch, done = divmod(n, per_epoch[saved_on])  # the checkpoint's epoch and batches done in it
        seen = done * E.BATCH * saved_on
        left = (E.N - seen) // resumed_on
        first = epoch * per_epoch[resumed_on] + per_epoch[resumed_on] - math.ceil(left / E.BATCH)
        assert min(it for _, it, _, _ in resumed) == first, tag
        before = [i for e, it, _, ids in original if e == epoch and it < n for i in ids]
        during = [i for e, _, _, ids in resumed if e == epoch for i in ids]
        assert len(before) == seen and sorted(before + during) == list(range(E.N)), tag
        for e in range(epoch + 1, E.EPOCHS):  # later epochs: whole, in the new shape
            assert sorted(i for ep, _, _, ids in resumed if ep == e for i in ids) == list(range(E.N)), tag
        total = E.EPOCHS * per_epoch[resumed_on]
        for _, it, lr, _ in resumed:
            assert math.isclose(lr, _cosine(it, total), rel_tol=1e-9, abs_tol=1e-12), (tag, it, lr)
        saved = torch.load(out / f'saved_{strategy}_w{saved_on}_{n}.pt')
        loaded = torch.load(out / f'loaded_{tag}.pt')
        assert loaded['iter'] == first
        for part in ('model', 'momentum', 'ema'):
            assert saved[part].keys() == loaded[part].keys() and saved[part], (tag, part)
            for key in saved[part]:
                assert torch.equal(saved[part][key], loaded[part][key]), (tag, part, key)
