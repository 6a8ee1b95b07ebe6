"""The image channel: a hook publishes images, each tracker writes them through its own
image API, and the test reads them back from the tracker's files."""
import glob
import io
import json
import os

import numpy as np
import pytest

from hookloop import Hook
from hookloop.logging.images import as_uint8_hwc, publish_images
from log_utils import make_trainer, run

STEPS = (5, 10)


def picture(step, index):
    """A distinctive 8x12 RGB image per (step, index)."""
    rng = np.random.default_rng(step * 10 + index)
    return rng.integers(0, 256, size=(8, 12, 3), dtype=np.uint8)


class PublishImages(Hook):
    def after_train_iter(self, trainer):
        if trainer.iter + 1 in STEPS:
            publish_images(trainer, 'samples/grid', [picture(trainer.iter + 1, i) for i in range(2)], trainer.iter + 1)


def train_with(tmp_path, tracker):
    trainer = make_trainer(tmp_path, [tracker], interval=5, max_epochs=1)
    trainer.register_hook(PublishImages())
    return run(trainer)


def png(data):
    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(data) if isinstance(data, bytes) else data).convert('RGB'))


def test_tensorboard_image_summaries_read_back(tmp_path):
    pytest.importorskip('tensorboard')
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    train_with(tmp_path, dict(type='TensorboardLoggerHook'))
    events = EventAccumulator(str(tmp_path / 'tf_logs'), size_guidance={'images': 0})
    events.Reload()
    assert sorted(events.Tags()['images']) == ['samples/grid/0', 'samples/grid/1']
    for index in range(2):
        found = events.Images(f'samples/grid/{index}')
        assert [e.step for e in found] == list(STEPS)
        for event, step in zip(found, STEPS):
            assert (event.width, event.height) == (12, 8)
            assert np.array_equal(png(event.encoded_image_string), picture(step, index))


def test_dvclive_image_files_read_back(tmp_path, monkeypatch):
    pytest.importorskip('dvclive')
    monkeypatch.chdir(tmp_path)
    train_with(tmp_path, dict(type='DvcliveLoggerHook'))
    for step in STEPS:
        for index in range(2):
            path = tmp_path / 'dvclive' / 'plots' / 'images' / 'samples' / 'grid' / f'iter_{step}' / f'{index}.png'
            assert np.array_equal(png(str(path)), picture(step, index))


def test_mlflow_keyed_images_read_back(tmp_path):
    pytest.importorskip('mlflow')
    train_with(tmp_path, dict(type='MlflowLoggerHook', exp_name='images'))
    files = sorted(glob.glob(str(tmp_path / 'mlartifacts' / '**' / 'images' / '**' / '*.png'), recursive=True))
    full = [f for f in files if 'compressed' not in os.path.basename(f)]
    assert len(full) == 4, files
    found = sorted(tuple(png(f).reshape(-1)[:16]) for f in full)
    expected = sorted(tuple(picture(s, i).reshape(-1)[:16]) for s in STEPS for i in range(2))
    assert found == expected


def test_wandb_offline_media_read_back(tmp_path, monkeypatch):
    pytest.importorskip('wandb')
    monkeypatch.setenv('WANDB_MODE', 'offline')
    monkeypatch.setenv('WANDB_SILENT', 'true')
    train_with(tmp_path, dict(type='WandbLoggerHook', init_kwargs=dict(project='hookloop-test')))
    files = glob.glob(str(tmp_path / 'wandb' / 'offline-run-*' / 'files' / 'media' / 'images' / '**' / '*.png'),
                      recursive=True)
    found = sorted(png(f).tobytes() for f in files)
    assert found == sorted(picture(s, i).tobytes() for s in STEPS for i in range(2))


def test_neptune_offline_image_series(tmp_path, monkeypatch):
    pytest.importorskip('neptune')
    monkeypatch.chdir(tmp_path)
    train_with(tmp_path, dict(type='NeptuneLoggerHook', init_kwargs=dict(
        mode='offline', project='a/b', capture_hardware_metrics=False, capture_stdout=False,
        capture_stderr=False, capture_traceback=False, git_ref=False)))
    steps = {}
    for path in glob.glob(str(tmp_path / '.neptune' / 'offline' / '*' / '*.log')):
        for line in open(path, encoding='utf-8'):
            op = json.loads(line)
            op = op.get('obj', op)
            if op.get('type') == 'LogImages':
                steps.setdefault('/'.join(op['path']), []).extend(v['step'] for v in op['values'])
    assert steps == {'samples/grid/0': list(STEPS), 'samples/grid/1': list(STEPS)}


def test_images_are_converted_to_uint8_rgb():
    import torch
    assert as_uint8_hwc(torch.ones(3, 4, 5)).shape == (4, 5, 3)
    assert as_uint8_hwc(torch.full((1, 2, 2), -1.0)).tolist() == [[[0, 0, 0]] * 2] * 2
    assert as_uint8_hwc(np.zeros((3, 3), np.uint8)).shape == (3, 3, 3)
    with pytest.raises(TypeError, match='uint8'):
        as_uint8_hwc(np.zeros((3, 3, 3), np.float32))
