"""DreamBooth validation images on a tiny random Stable Diffusion pipeline: PNGs on disk,
the same images in TensorBoard and DVCLive, EMA weights when EMAHook swaps them, and an
unchanged training RNG stream."""
import io
import os

import numpy as np
import pytest
import torch

from conftest import train_and_close as train
from dreambooth_helpers import dreambooth as dreambooth_trainer
from hookloop import ConfigError

pytest.importorskip('diffusers')

from hookloop.dreambooth.random_pipeline import save_random_pipeline  # noqa: E402

PROMPTS = ['a sks dog', 'a dog on the beach']
VALIDATION = dict(prompts=PROMPTS, every_n_iters=2, num_images=2, num_inference_steps=2, seed=7)


@pytest.fixture(scope='module')
def base(tmp_path_factory):
    return save_random_pipeline(str(tmp_path_factory.mktemp('sd')), resolution=16)


def dreambooth(work_dir, base, **overrides):
    return dreambooth_trainer(work_dir, base, max_iters=3, **overrides)


def pngs(directory):
    from PIL import Image
    return {name: np.asarray(Image.open(os.path.join(directory, name))) for name in sorted(os.listdir(directory))}


def test_validation_pngs_on_disk_and_in_tensorboard_and_dvclive(tmp_path, base, monkeypatch):
    pytest.importorskip('dvclive')
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    monkeypatch.chdir(tmp_path)
    train(dreambooth(tmp_path / 'work', base, validation=VALIDATION, log_config=dict(interval=1, hooks=[
        dict(type='TextLoggerHook'), dict(type='TensorboardLoggerHook'), dict(type='DvcliveLoggerHook')])))
    root = tmp_path / 'work' / 'validation'
    assert sorted(os.listdir(root)) == ['iter_2', 'iter_3']  # every 2 iterations and at the end
    names = ['0_a_sks_dog_seed7.png', '0_a_sks_dog_seed8.png', '1_a_dog_on_the_beach_seed7.png',
             '1_a_dog_on_the_beach_seed8.png']
    on_disk = {n: pngs(root / n) for n in ('iter_2', 'iter_3')}
    for images in on_disk.values():
        assert list(images) == names and all(im.shape == (16, 16, 3) for im in images.values())
    assert not np.array_equal(on_disk['iter_2'][names[0]], on_disk['iter_2'][names[1]])  # seeds differ

    events = EventAccumulator(str(tmp_path / 'work' / 'tf_logs'), size_guidance={'images': 0})
    events.Reload()
    for prompt_tag, stem in (('0_a_sks_dog', '0_a_sks_dog'), ('1_a_dog_on_the_beach', '1_a_dog_on_the_beach')):
        for index, seed in enumerate((7, 8)):
            found = events.Images(f'validation/{prompt_tag}/{index}')
            assert [e.step for e in found] == [2, 3]
            for event, it in zip(found, ('iter_2', 'iter_3')):
                decoded = np.asarray(Image.open(io.BytesIO(event.encoded_image_string)).convert('RGB'))
                assert np.array_equal(decoded, on_disk[it][f'{stem}_seed{seed}.png'])
    dvc = pngs(tmp_path / 'work' / 'dvclive' / 'plots' / 'images' / 'validation' / '0_a_sks_dog' / 'iter_3')
    assert np.array_equal(dvc['1.png'], on_disk['iter_3']['0_a_sks_dog_seed8.png'])


def test_validation_does_not_change_the_training_rng_stream(tmp_path, base):
    plain = train(dreambooth(tmp_path / 'plain', base))
    validated = train(dreambooth(tmp_path / 'validated', base, validation=VALIDATION))
    a, b = plain.model.unet.state_dict(), validated.model.unet.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_validation_uses_the_ema_weights_when_ema_swaps_them(tmp_path, base):
    # With a vanishing EMA momentum the averages stay the initial weights, so the images
    # equal those of an untrained model (lr=0), and differ from the trained model's.
    untrained = dreambooth(tmp_path / 'untrained', base, validation=VALIDATION, optimizer=dict(type='SGD', lr=0.0))
    train(untrained)
    trained = train(dreambooth(tmp_path / 'trained', base, validation=VALIDATION))
    ema = train(dreambooth(tmp_path / 'ema', base, validation=VALIDATION,
                           custom_hooks=[dict(type='EMAHook', momentum=1e-30, warm_up=1, swap=True)]))
    expected = pngs(tmp_path / 'untrained' / 'validation' / 'iter_3')
    assert all(np.array_equal(a, expected[n]) for n, a in pngs(tmp_path / 'ema' / 'validation' / 'iter_3').items())
    assert any(not np.array_equal(a, expected[n])
               for n, a in pngs(tmp_path / 'trained' / 'validation' / 'iter_3').items())
    assert all(torch.equal(a, b) for a, b in zip(trained.model.unet.state_dict().values(),
                                                 ema.model.unet.state_dict().values()))


def test_validation_options_are_checked(tmp_path, base):
    with pytest.raises(ConfigError, match='validation prompts must be a non-empty list'):
        dreambooth(tmp_path / 'w', base, validation=dict(prompts=[]))
    with pytest.raises(ConfigError, match="validation got unknown keys \\['every'\\]"):
        dreambooth(tmp_path / 'w', base, validation=dict(prompts=['a'], every=3))
    with pytest.raises(ConfigError, match="runs its own validation loop; do not also give \\['val_dataloader'\\]"):
        dreambooth(tmp_path / 'w', base, validation=dict(prompts=['a']), val_dataloader=dict(dataset=[1]))
