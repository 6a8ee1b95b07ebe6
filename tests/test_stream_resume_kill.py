"""kill -9 a run over a stream at random moments, resume with ``--resume auto`` each time: the
end is bitwise equal to an uninterrupted run, and a stateful loader reads each remaining batch
once (a stateless one re-reads the start of its pass)."""
import os
import random
import signal
import time

import pytest

from hookloop.checkpoint.format import load_checkpoint, read_pointer
from resume_helpers import ForkedRun, assert_states_equal, kill_leftovers
from stream_helpers import write_json_lines
from test_resume_kill import wait_for

BATCH, SAMPLES, MAX_ITERS = 4, 24, 18  # 6 batches a pass, 3 passes

LOADERS = {
    'stateful_dataloader_map_style_2_workers': (
        "dict(type='StatefulDataLoader', dataset=dict(type='CountedSamples', read_log={log!r}, delay={delay}), "
        "batch_size=4, shuffle=True, num_workers=2)", True),
    'hf_streaming_json_lines': (
        "dict(dataset=dict(type='CountedHFStream', data_files={data!r}, read_log={log!r}, delay={delay}), "
        "batch_size=4)", True),
    'hf_streaming_with_shuffle_buffer': (
        "dict(dataset=dict(type='CountedHFStream', data_files={data!r}, read_log={log!r}, delay={delay}, "
        "shuffle_buffer_size=8), batch_size=4)", False),
    'stateless_iterable_dataset': (
        "dict(dataset=dict(type='CountedStream', read_log={log!r}, delay={delay}), batch_size=4)", False),
}

CONFIG = '''custom_imports = ['stream_helpers']
model = dict(type='StreamRegressor')
optimizer = dict(type='SGD', lr=0.02, momentum=0.9)
train_dataloader = {loader}
max_iters = {max_iters}
seed = 0
device = 'cpu'
checkpoint_config = dict(interval=1, by_epoch=False)
log_config = dict(interval=1)
'''


def write_config(directory, name, loader, data, log, delay):
    path = os.path.join(directory, f'{name}.py')
    with open(path, 'w') as f:
        f.write(CONFIG.format(loader=loader.format(data=data, log=log, delay=delay), max_iters=MAX_ITERS))
    return path


def reads(log):
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [int(line) for line in f]


def weights(checkpoint):
    state = {f'model.{k}': v for k, v in checkpoint['state_dict'].items()}
    for index, values in checkpoint['optimizer']['state'].items():
        state.update({f'optim.{index}.{k}': v for k, v in values.items() if hasattr(v, 'shape')})
    return state


@pytest.fixture(autouse=True)
def no_stray_processes():
    yield
    kill_leftovers()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize('case', sorted(LOADERS))
def test_kill_9_at_random_moments_then_resume_auto_matches_uninterrupted_run(tmp_path, case):
    loader, stateful = LOADERS[case]
    data = write_json_lines(tmp_path / 'data.jsonl', SAMPLES)
    reference = ForkedRun(write_config(tmp_path, 'reference', loader, data, str(tmp_path / 'reference.reads'), 0.0),
                          tmp_path / 'reference', str(tmp_path / 'reference.log'))
    assert reference.wait(timeout=120) == 0, reference.output()[-3000:]
    work_dir = tmp_path / 'run'
    rng = random.Random(case)
    kills = []
    while len(kills) < 3:
        config = write_config(tmp_path, f'run_{len(kills)}', loader, data, str(tmp_path / f'run_{len(kills)}.reads'),
                              0.01)
        before = read_pointer(str(work_dir))
        process = ForkedRun(config, work_dir, str(tmp_path / f'run_{len(kills)}.log'))
        if not wait_for(lambda: read_pointer(str(work_dir)) not in (None, before), process):
            break
        time.sleep(rng.uniform(0.0, 0.3))
        process.send_signal(signal.SIGKILL)
        process.wait()
        kills.append(load_checkpoint(read_pointer(str(work_dir)))['meta']['iter'])
    assert len(kills) == 3 and kills[-1] < MAX_ITERS, f'killed after {kills}'
    resumed_at = kills[-1]
    last_reads = str(tmp_path / 'last.reads')
    last = ForkedRun(write_config(tmp_path, 'last', loader, data, last_reads, 0.0), work_dir,
                     str(tmp_path / 'last.log'))
    assert last.wait(timeout=120) == 0, last.output()[-3000:]
    final = load_checkpoint(read_pointer(str(work_dir)))
    assert final['meta']['iter'] == MAX_ITERS
    assert_states_equal(weights(final), weights(load_checkpoint(read_pointer(str(tmp_path / 'reference')))))

    remaining = (MAX_ITERS - resumed_at) * BATCH
    # The start of the interrupted pass. A stream without a length learns that a pass is over
    # only from its StopIteration, so a checkpoint right after a pass's last batch re-reads that
    # whole pass before the next one starts.
    dropped = ((resumed_at - 1) % (SAMPLES // BATCH) + 1) * BATCH
    if stateful:  # each remaining batch read once, nothing before it
        assert len(reads(last_reads)) == remaining, (resumed_at, reads(last_reads))
        assert final['data']['way'] == 'state'
    elif case == 'stateless_iterable_dataset':
        assert len(reads(last_reads)) == dropped + remaining, (resumed_at, reads(last_reads))
        assert final['data']['way'] == 'fast_forward'
    assert len(reads(str(tmp_path / 'reference.reads'))) == MAX_ITERS * BATCH
