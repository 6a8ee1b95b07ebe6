"""Issue 37: ModelScope's Stable Diffusion DreamBooth and LoRA examples
(``examples/pytorch/stable_diffusion/{dreambooth,lora}``, with their ``run_train_*.sh`` arguments)
and their tests (``tests/trainers/test_{dreambooth,lora}_diffusion_trainer.py``), written from what
those files do and run on hookloop through a rename-only alias of the ``modelscope`` modules
(tests/modelscope_alias.py); the hub model and dataset are local directories. Shorter runs (1-2
epochs instead of 100-500) and the workarounds of ModelScope's own bugs are the only changes:

* the examples' local-dataset branch calls ``MsDataset.load(dir)`` without ``split=``: the local
  dataset here has one split file, which is what that branch needs to get one split;
* the DreamBooth example never passes ``--with_prior_preservation`` to the trainer: passed here;
* the DreamBooth test uses ``Tasks`` without importing it: imported here;
* the LoRA tests are skipped upstream (they need diffusers 0.24): run here.
"""
import os
import shutil

import pytest
import torch

from modelscope_alias import install
from modelscope_sd_helpers import make_dataset_dir, model_dir, one_thread  # noqa: F401 (fixtures)

pytest.importorskip('diffusers')
pytest.importorskip('peft')


@pytest.fixture(scope='module')
def hub_dataset(tmp_path_factory):
    """The hub dataset's splits (train.csv, validation.csv), downloaded to a local directory."""
    return make_dataset_dir(tmp_path_factory.mktemp('ex_data'), rows=2)


@pytest.fixture
def one_split(hub_dataset, tmp_path):
    """A local dataset directory of one split, as the examples' local branch loads it."""
    directory = tmp_path / 'local_dataset'
    shutil.copytree(hub_dataset, directory)
    os.remove(directory / 'validation.csv')
    return str(directory)


@pytest.fixture
def modelscope(monkeypatch):
    install(monkeypatch)


def shell_arguments(model_dir, work_dir, dataset, **more):
    """run_train_*.sh's arguments with the hub names replaced by local directories (1 epoch)."""
    args = {'model': model_dir, 'model_revision': 'v1.0.8', 'work_dir': str(work_dir),
            'train_dataset_name': dataset, 'max_epochs': '1', 'save_ckpt_strategy': 'by_epoch',
            'logging_interval': '1', 'train.dataloader.workers_per_gpu': '0',
            'evaluation.dataloader.workers_per_gpu': '0', 'use_model_config': 'true', **more}
    return [token for key, value in args.items() for token in (f'--{key}', value)]


def example_datasets(args):
    """The examples' dataset loading: the local branch (one split) or the hub one (split=)."""
    from modelscope.msdatasets import MsDataset
    from modelscope.utils.constant import DownloadMode
    if os.path.exists(args.train_dataset_name):
        return MsDataset.load(args.train_dataset_name), MsDataset.load(args.train_dataset_name)
    return (MsDataset.load(args.train_dataset_name, split='train', download_mode=DownloadMode.FORCE_REDOWNLOAD),
            MsDataset.load(args.train_dataset_name, split='validation', download_mode=DownloadMode.FORCE_REDOWNLOAD))


def example_cfg_modify_fn(config, args):
    def cfg_modify_fn(cfg):
        if args.use_model_config:
            cfg.merge_from_dict(config)
        else:
            cfg = config
        cfg.train.lr_scheduler = {'type': 'LambdaLR', 'lr_lambda': lambda _: 1, 'last_epoch': -1}
        return cfg
    return cfg_modify_fn


def test_the_dreambooth_example_trains_and_its_pipeline_generates_from_output(modelscope, model_dir, one_split,
                                                                             tmp_path):
    from dataclasses import dataclass, field

    import cv2
    from modelscope.metainfo import Trainers
    from modelscope.pipelines import pipeline
    from modelscope.trainers import build_trainer
    from modelscope.trainers.training_args import TrainingArgs
    from modelscope.utils.constant import Tasks

    @dataclass(init=False)
    class DreamboothArguments(TrainingArgs):
        with_prior_preservation: bool = field(default=False, metadata={'help': 'prior loss'})
        instance_prompt: str = field(default='a photo of sks dog', metadata={'help': 'instance prompt'})
        class_prompt: str = field(default='a photo of dog', metadata={'help': 'class prompt'})
        class_data_dir: str = field(default='./tmp/class_data', metadata={'help': 'class images'})
        num_class_images: int = field(default=200, metadata={'help': 'class images'})
        resolution: int = field(default=512, metadata={'help': 'class image resolution'})
        prior_loss_weight: float = field(default=1.0, metadata={'help': 'prior loss weight'})
        prompt: str = field(default='dog', metadata={'help': 'the pipeline prompt'})

    work_dir = tmp_path / 'dreambooth_diffusion'
    training_args = DreamboothArguments(task='text-to-image-synthesis').parse_cli(shell_arguments(
        model_dir, work_dir, one_split, with_prior_preservation='true', instance_prompt='a photo of sks dog',
        class_prompt='a photo of dog', class_data_dir=str(tmp_path / 'class_data'), num_class_images='1',
        resolution='16', prior_loss_weight='1.0', prompt='dog', **{'train.optimizer.lr': '5e-6'}))
    config, args = training_args.to_config()
    train_dataset, validation_dataset = example_datasets(args)
    kwargs = dict(model=training_args.model, model_revision=args.model_revision, work_dir=training_args.work_dir,
                  train_dataset=train_dataset, eval_dataset=validation_dataset, instance_prompt=args.instance_prompt,
                  class_prompt=args.class_prompt, class_data_dir=args.class_data_dir,
                  num_class_images=args.num_class_images, resolution=args.resolution,
                  prior_loss_weight=args.prior_loss_weight, prompt=args.prompt,
                  with_prior_preservation=args.with_prior_preservation,  # the example's missing argument
                  cfg_modify_fn=example_cfg_modify_fn(config, args), device='cpu')
    trainer = build_trainer(name=Trainers.dreambooth_diffusion, default_args=kwargs)
    try:
        trainer.train()
        assert trainer.optimizer.param_groups[0]['lr'] == 5e-6 and trainer.iter == 2  # 2 rows, 1 epoch
        assert os.listdir(args.class_data_dir) == ['class_00000.png']
    finally:
        trainer.close()
    pipe = pipeline(task=Tasks.text_to_image_synthesis, model=training_args.work_dir + '/output',
                    model_revision=args.model_revision)
    output = pipe({'text': args.prompt, 'num_inference_steps': 2})
    assert output['output_imgs'][0].shape == (16, 16, 3)
    assert cv2.imwrite(str(tmp_path / 'dreambooth_result.png'), output['output_imgs'][0])


def test_the_lora_example_trains_and_the_pipeline_loads_its_lora_weights(modelscope, model_dir, one_split, tmp_path):
    from dataclasses import dataclass, field

    from modelscope.metainfo import Trainers
    from modelscope.pipelines import pipeline
    from modelscope.trainers import build_trainer
    from modelscope.trainers.training_args import TrainingArgs
    from modelscope.utils.constant import Tasks

    @dataclass(init=False)
    class LoraArguments(TrainingArgs):
        prompt: str = field(default='dog', metadata={'help': 'the pipeline prompt'})
        lora_rank: int = field(default=4, metadata={'help': 'the LoRA rank'})

    work_dir = tmp_path / 'lora_diffusion'
    training_args = LoraArguments(task='text-to-image-synthesis').parse_cli(shell_arguments(
        model_dir, work_dir, one_split, prompt='a dog', lora_rank='8', **{'train.optimizer.lr': '1e-2'}))
    config, args = training_args.to_config()
    train_dataset, validation_dataset = example_datasets(args)
    kwargs = dict(model=training_args.model, model_revision=args.model_revision, work_dir=training_args.work_dir,
                  train_dataset=train_dataset, eval_dataset=validation_dataset, lora_rank=args.lora_rank,
                  cfg_modify_fn=example_cfg_modify_fn(config, args), device='cpu')
    trainer = build_trainer(name=Trainers.lora_diffusion, default_args=kwargs)
    try:
        trainer.train()
        assert trainer.model.unet.peft_config['default'].r == 8
    finally:
        trainer.close()
    output = os.path.join(training_args.work_dir, 'output')
    assert 'pytorch_lora_weights.bin' in os.listdir(output)  # safe_serialization=False, ModelScope's default
    base = pipeline(task=Tasks.text_to_image_synthesis, model=training_args.model)
    tuned = pipeline(task=Tasks.text_to_image_synthesis, model=training_args.model, lora_dir=output,
                     model_revision=args.model_revision)
    inputs = lambda: {'text': args.prompt, 'num_inference_steps': 2, 'generator': torch.Generator().manual_seed(0)}
    with_lora, without = tuned(inputs())['output_imgs'][0], base(inputs())['output_imgs'][0]
    assert with_lora.shape == (16, 16, 3) and (with_lora != without).any()  # the adapters change the image


def modify_as_the_tests_do(max_epochs, lr):
    def cfg_modify_fn(cfg):
        cfg.train.max_epochs = max_epochs
        cfg.train.lr_scheduler = {'type': 'LambdaLR', 'lr_lambda': lambda _: 1, 'last_epoch': -1}
        cfg.train.optimizer.lr = lr
        return cfg
    return cfg_modify_fn


@pytest.mark.parametrize('trainer_name, lr', [('dreambooth_diffusion', 5e-6), ('lora_diffusion', 1e-4)])
def test_the_modelscope_trainer_tests_train_then_evaluate(modelscope, model_dir, hub_dataset, tmp_path, trainer_name,
                                                          lr):
    from modelscope.metainfo import Trainers
    from modelscope.msdatasets import MsDataset
    from modelscope.pipelines import pipeline
    from modelscope.trainers import build_trainer
    from modelscope.utils.constant import DownloadMode, Tasks  # the DreamBooth test's missing import

    train_dataset = MsDataset.load(hub_dataset, split='train', download_mode=DownloadMode.FORCE_REDOWNLOAD)
    eval_dataset = MsDataset.load(hub_dataset, split='validation', download_mode=DownloadMode.FORCE_REDOWNLOAD)
    kwargs = dict(model=model_dir, model_revision='v1.0.8', work_dir=str(tmp_path), train_dataset=train_dataset,
                  eval_dataset=eval_dataset, cfg_modify_fn=modify_as_the_tests_do(1, lr), device='cpu')
    trainer = build_trainer(name=getattr(Trainers, trainer_name), default_args=kwargs)
    try:
        trainer.train()
        result = trainer.evaluate()
        assert set(result) == {'loss'} and result['loss'] > 0
        assert f'{trainer.timestamp}.log.json' in os.listdir(str(tmp_path))
    finally:
        trainer.close()
    if trainer_name == 'dreambooth_diffusion':
        pipe = pipeline(task=Tasks.text_to_image_synthesis, model=f'{tmp_path}/output')
        assert pipe({'text': 'a dog.', 'num_inference_steps': 2})['output_imgs'][0].shape == (16, 16, 3)


@pytest.mark.parametrize('trainer_name', ['dreambooth_diffusion', 'lora_diffusion'])
def test_the_modelscope_eval_tests_evaluate_without_training(modelscope, model_dir, hub_dataset, tmp_path,
                                                             trainer_name):
    from modelscope.metainfo import Trainers
    from modelscope.msdatasets import MsDataset
    from modelscope.trainers import build_trainer
    from modelscope.utils.constant import DownloadMode

    eval_dataset = MsDataset.load(hub_dataset, split='validation', download_mode=DownloadMode.FORCE_REDOWNLOAD)
    kwargs = dict(model=model_dir, model_revision='v1.0.8', work_dir=str(tmp_path), train_dataset=None,
                  eval_dataset=eval_dataset, device='cpu')
    trainer = build_trainer(name=getattr(Trainers, trainer_name), default_args=kwargs)
    try:
        assert set(trainer.evaluate()) == {'loss'}
    finally:
        trainer.close()


def test_msdataset_reads_local_splits_and_refuses_hub_names(tmp_path, hub_dataset):
    from hookloop import ConfigError
    from hookloop.compat.modelscope_api import MsDataset
    splits = MsDataset.load(hub_dataset)  # two split files and no split=: both, as ModelScope returns them
    assert sorted(splits) == ['train', 'validation'] and len(splits['train']) == 2
    row = MsDataset.load(hub_dataset, split='train')[0]
    assert os.path.isabs(row['Target:FILE']) and os.path.isfile(row['Target:FILE']) and row['Text']
    with pytest.raises(ConfigError, match="'buptwq/lora-stable-diffusion-finetune' is not a local directory"):
        MsDataset.load('buptwq/lora-stable-diffusion-finetune', split='train')
    with pytest.raises(ConfigError, match="has no split 'test'"):
        MsDataset.load(hub_dataset, split='test')
