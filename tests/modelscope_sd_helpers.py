"""What ModelScope's Stable Diffusion trainers read, made locally and tiny: a model directory
(a random SD-shaped diffusers pipeline with ModelScope's ``configuration.json``) and a dataset
directory of rows (``train.csv`` / ``validation.csv`` with ``Target:FILE`` and ``Text``, as the
hub datasets of ModelScope's examples have)."""
import csv
import json
import os

import pytest
import torch

RESOLUTION = 16


@pytest.fixture(scope='module', autouse=True)
def one_thread():
    """The model is tiny: one thread is much faster than two fighting over shared cores
    (a test module that imports this fixture runs with it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope='module')
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp('ms_model'))


def configuration(**train):
    """A ``configuration.json`` shaped like the hub's Stable Diffusion ones (16 px here)."""
    return {
        'framework': 'pytorch',
        'task': 'text-to-image-synthesis',
        'pipeline': {'type': 'diffusers-stable-diffusion'},
        'model': {'type': 'stable-diffusion', 'pretrained_model_name_or_path': 'AI-ModelScope/stable-diffusion-v1-5',
                  'lora_tune': False, 'dreambooth_tune': True},
        'preprocessor': {'type': 'diffusion-image-generation-preprocessor', 'resolution': RESOLUTION,
                         'mean': [0.5], 'std': [0.5]},
        'train': dict({'max_epochs': 2, 'work_dir': './work_dir',
                       'dataloader': {'batch_size_per_gpu': 1, 'workers_per_gpu': 0},
                       'optimizer': {'type': 'AdamW', 'lr': 1e-4, 'weight_decay': 1e-2},
                       'hooks': [{'type': 'CheckpointHook', 'interval': 1},
                                 {'type': 'TextLoggerHook', 'interval': 1},
                                 {'type': 'IterTimerHook'}]}, **train),
        'evaluation': {'dataloader': {'batch_size_per_gpu': 1, 'workers_per_gpu': 0, 'shuffle': False},
                       'metrics': ['loss-metric']},
    }


def make_model_dir(directory, **train):
    """A tiny SD pipeline directory with ModelScope's configuration.json and ``.bin`` weights (what
    ModelScope's pipeline reads by default, as the hub's Stable Diffusion models have); returns its path."""
    from diffusers import StableDiffusionPipeline
    from hookloop.dreambooth.random_pipeline import save_random_pipeline
    save_random_pipeline(directory, resolution=RESOLUTION)
    pipe = StableDiffusionPipeline.from_pretrained(directory)
    pipe.save_pretrained(directory, safe_serialization=False)
    torch.save(pipe.text_encoder.state_dict(), os.path.join(directory, 'text_encoder', 'pytorch_model.bin'))
    with open(os.path.join(directory, 'configuration.json'), 'w', encoding='utf-8') as f:
        json.dump(configuration(**train), f, indent=2)
    return os.fspath(directory)


def noise_png(path, seed, size=(20, 18)):
    from PIL import Image
    data = torch.randint(0, 256, (size[1], size[0], 3), generator=torch.Generator().manual_seed(seed),
                         dtype=torch.uint8)
    Image.fromarray(data.numpy()).save(path)


def make_dataset_dir(directory, rows=3, captions=('a photo of sks dog', 'sks dog on grass', 'sks dog, close up')):
    """A local dataset: ``images/*.png`` and ``train.csv`` / ``validation.csv`` rows
    (``Target:FILE`` relative to the directory, ``Text``); returns its path."""
    os.makedirs(os.path.join(directory, 'images'), exist_ok=True)
    for split, count, first in (('train', rows, 0), ('validation', 2, 100)):
        with open(os.path.join(directory, f'{split}.csv'), 'w', newline='', encoding='utf-8') as f:
            writer = csv.writer(f)
            writer.writerow(['Target:FILE', 'Text'])
            for index in range(count):
                name = f'images/{split}_{index}.png'
                noise_png(os.path.join(directory, name), first + index)
                writer.writerow([name, captions[index % len(captions)]])
    return os.fspath(directory)


def rows_of(dataset_dir, split='train'):
    """The rows of a split as a list of dicts, image paths made absolute (what MsDataset.load gives)."""
    with open(os.path.join(dataset_dir, f'{split}.csv'), newline='', encoding='utf-8') as f:
        rows = list(csv.DictReader(f))
    return [{'Target:FILE': os.path.join(dataset_dir, row['Target:FILE']), 'Text': row['Text']} for row in rows]


def run_trainer(name, model_dir, data_dir, work_dir, class_dir=None, delay=0.0, epochs=2):
    """Train ``name`` ('dreambooth-diffusion' / 'lora-diffusion') on the rows of ``data_dir``,
    a checkpoint every iteration, continuing from the work dir's latest (``resume_from='auto'``);
    ``delay`` seconds of sleep after each iteration let a test kill the run between two."""
    import time

    from hookloop import Hook, build_trainer

    class Slow(Hook):
        def after_train_iter(self, trainer):
            time.sleep(delay)

    def modify(cfg):
        cfg.train.max_epochs = epochs
        cfg.train.logging = {'interval': 1}
        cfg.train.checkpoint = {'period': {'interval': 1, 'save_strategy': 'by_step'}}
        cfg.train.lr_scheduler = {'type': 'LambdaLR', 'lr_lambda': lambda _: 1, 'last_epoch': -1}
        return cfg
    extra = dict(with_prior_preservation=True, class_data_dir=class_dir, num_class_images=2, resolution=RESOLUTION) \
        if class_dir else dict(lora_rank=4)
    trainer = build_trainer(name, default_args=dict(
        model=model_dir, work_dir=str(work_dir), train_dataset=rows_of(data_dir), cfg_modify_fn=modify, device='cpu',
        callbacks=[Slow()], resume_from='auto', **extra))
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


if __name__ == '__main__':  # python -m modelscope_sd_helpers NAME MODEL_DIR DATA_DIR WORK_DIR CLASS_DIR|- DELAY
    import sys
    torch.set_num_threads(1)
    name, model, data, work, classes, wait = sys.argv[1:7]
    run_trainer(name, model, data, work, None if classes == '-' else classes, float(wait))
