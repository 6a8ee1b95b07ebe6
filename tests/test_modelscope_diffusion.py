"""Issue 37: ModelScope's DreamBooth and LoRA trainers as ModelScope users run them
('dreambooth-diffusion', 'lora-diffusion'), written from what ModelScope's trainers, their
example scripts and their tests do, on a tiny Stable-Diffusion-shaped model directory with
ModelScope's configuration.json and a local dataset of image + caption rows."""
import json
import os

import pytest
import torch

from conftest import train_and_close as train
from hookloop import TRAINERS, ConfigError, Hook, build_trainer
from log_utils import json_records
from modelscope_sd_helpers import make_dataset_dir, model_dir, noise_png, one_thread, rows_of  # noqa: F401 (fixtures)

pytest.importorskip('diffusers')
pytest.importorskip('peft')


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    return make_dataset_dir(tmp_path_factory.mktemp('ms_data'), rows=3)


@pytest.fixture(scope='module')
def class_dir(tmp_path_factory):
    """Two class images already there (generating them is tested once, below)."""
    directory = tmp_path_factory.mktemp('ms_class')
    for index in range(2):
        noise_png(os.path.join(directory, f'class_{index:05d}.png'), 50 + index, size=(16, 16))
    return os.fspath(directory)


def constant_lr(epochs=2, logging=1):
    """The examples' cfg_modify_fn: epochs, log interval and a constant LambdaLR."""
    def modify(cfg):
        cfg.train.max_epochs = epochs
        cfg.train.logging = {'interval': logging}
        cfg.train.lr_scheduler = {'type': 'LambdaLR', 'lr_lambda': lambda _: 1, 'last_epoch': -1}
        return cfg
    return modify


def modelscope_trainer(name, model_dir, data_dir, work_dir, **kwargs):
    args = dict(model=model_dir, work_dir=str(work_dir), train_dataset=rows_of(data_dir),
                eval_dataset=rows_of(data_dir, 'validation'), cfg_modify_fn=constant_lr(), device='cpu')
    args.update(kwargs)
    return build_trainer(name, default_args=args)


class Record(Hook):
    """What each step trained on and its loss."""

    def __init__(self):
        self.texts, self.shapes, self.losses = [], [], []

    def after_train_iter(self, trainer):
        self.texts.append(list(trainer.data_batch['text']))
        self.shapes.append(tuple(trainer.data_batch['target'].shape))
        self.losses.append(trainer.outputs['loss'].detach().clone())


@pytest.fixture(scope='module')
def dreambooth_run(tmp_path_factory, model_dir, data_dir, class_dir):
    """One prior-preservation run (2 epochs over 3 rows), shared by the tests that read what it wrote."""
    work_dir = tmp_path_factory.mktemp('ms_run')
    record = Record()
    trainer = modelscope_trainer('dreambooth-diffusion', model_dir, data_dir, work_dir, with_prior_preservation=True,
                                 class_data_dir=class_dir, num_class_images=2, resolution=16, callbacks=[record],
                                 model_revision='v1.0.8', prompt='dog')
    train(trainer)
    return trainer, record


# -- 1: dreambooth_diffusion drops nothing ---------------------------------------------------
@pytest.mark.parametrize('extra, named', [
    (dict(train_dataset=[{'Target:FILE': 'a.png', 'Text': 'a'}]), "ModelScope's train_dataset= .*instance_data_dir"),
    (dict(eval_dataset=[]), "ModelScope's eval_dataset= .*validation="),
    (dict(cfg_modify_fn=lambda cfg: cfg), "ModelScope's cfg_modify_fn= .*dreambooth-diffusion"),
    (dict(torch_type=torch.float16), "ModelScope's torch_type= .*precision="),
    (dict(safe_serialization=True), "ModelScope's safe_serialization="),
    (dict(model_revision='v1.0.8'), "ModelScope's model_revision= .*revision="),
    (dict(lora_rank=4), r"ModelScope's lora_rank= .*lora=dict\(rank=N\)"),
    (dict(prior_preservation=True), "'prior_preservation'.*did you mean 'with_prior_preservation'"),
    (dict(torch_dtype='fp16'), "'torch_dtype'.*did you mean 'torch_type'"),
])
@pytest.mark.parametrize('route', ['build_trainer', 'TRAINERS.build'])
def test_dreambooth_diffusion_refuses_what_it_does_not_take(tmp_path, extra, named, route):
    args = dict(model=dict(type='TinyDiffusion'), instance_data=torch.zeros(1, 1, 8, 8), instance_prompt='a sks dog',
                optimizer=dict(type='Adam', lr=1e-3), max_iters=1, work_dir=str(tmp_path), device='cpu', **extra)
    with pytest.raises(ConfigError, match=named):
        if route == 'build_trainer':
            build_trainer('dreambooth_diffusion', default_args=args)
        else:
            TRAINERS.build(dict(type='dreambooth_diffusion', **args))
    assert not os.listdir(tmp_path)  # refused before anything was written


# -- 2: the model's configuration.json, cfg_modify_fn and cfg_options ------------------------
def test_configuration_cfg_modify_fn_and_cfg_options_give_length_optimizer_schedule_and_log(tmp_path, model_dir,
                                                                                           data_dir):
    def modify(cfg):
        cfg.train.max_epochs = 3
        cfg.train.optimizer.lr = 5e-6
        cfg.train.logging = {'interval': 2}
        cfg.train.lr_scheduler = {'type': 'LambdaLR', 'lr_lambda': lambda _: 1, 'last_epoch': -1}
        return cfg
    trainer = modelscope_trainer('dreambooth-diffusion', model_dir, data_dir, tmp_path, cfg_modify_fn=modify,
                                 cfg_options={'train.dataloader.batch_size_per_gpu': 3})
    try:
        assert trainer.max_epochs == 3 and trainer.iters_per_epoch == 1  # 3 rows, batch 3 (cfg_options)
        assert trainer.optimizer.param_groups[0]['lr'] == 5e-6 and type(trainer.optimizer).__name__ == 'AdamW'
        assert trainer.optimizer.param_groups[0]['weight_decay'] == 1e-2  # the file's, kept by the merge
        names = [type(hook).__name__ for hook in trainer.hooks]
        assert 'TorchSchedulerHook' in names and 'ModelScopeDiffusionCheckpointHook' in names
        [logger] = [hook for hook in trainer.hooks if type(hook).__name__ == 'ModelScopeTextLoggerHook']
        assert logger.interval == 2
        only_unet = {id(p) for p in trainer.model.unet.parameters()}
        assert {id(p) for group in trainer.optimizer.param_groups for p in group['params']} == only_unet
    finally:
        trainer.close()


# -- 3: ModelScope's meaning of the data arguments -------------------------------------------
def test_an_epoch_is_the_rows_and_their_captions_are_the_prompts(dreambooth_run, data_dir):
    trainer, record = dreambooth_run
    assert trainer.iters_per_epoch == 3 and trainer.max_iters == 6  # not max(#rows, num_class_images) per epoch
    captions = sorted(row['Text'] for row in rows_of(data_dir))
    assert sorted(text for texts in record.texts[:3] for text in texts) == captions  # each row once per epoch
    assert all(shape == (1, 3, 16, 16) for shape in record.shapes)  # the preprocessor's resolution


def test_class_images_use_class_prompt_and_resolution_and_are_generated_once(tmp_path, model_dir, data_dir):
    trainer = modelscope_trainer('dreambooth-diffusion', model_dir, data_dir, tmp_path / 'work',
                                 with_prior_preservation=True, class_data_dir=str(tmp_path / 'class'),
                                 num_class_images=1, resolution=8, class_prompt='a photo of dog',
                                 instance_prompt='a photo of sks dog', cfg_modify_fn=constant_lr(epochs=1))
    prompts = []
    generate = trainer.model.generate
    trainer.model.generate = lambda texts, **kw: prompts.extend(texts) or generate(texts, **kw)
    try:
        trainer.generate_class_images()
        assert prompts == ['a photo of dog']  # ModelScope generates from instance_prompt (a bug)
        item = trainer.class_rows[0]
        assert item['target'].shape == (3, 8, 8) and item['text'] == 'a photo of dog'
        trainer.generate_class_images()  # already there: reused, nothing generated
        assert prompts == ['a photo of dog']
    finally:
        trainer.close()


# -- 4: the training log ---------------------------------------------------------------------
def test_the_log_has_modelscope_records_every_logging_interval(dreambooth_run):
    trainer, _ = dreambooth_run
    train_records = json_records(trainer.work_dir, 'train')
    assert [(r['epoch'], r['iter']) for r in train_records] == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]
    for record in train_records:
        assert {'lr', 'loss', 'loss_prior', 'iter_time', 'data_load_time'} <= set(record)


# -- 5: output/ is what ModelScope's pipeline() loads -----------------------------------------
def test_output_holds_configuration_and_bin_weights_that_modelscope_pipeline_loads(dreambooth_run):
    from diffusers import DiffusionPipeline
    trainer, _ = dreambooth_run
    output = os.path.join(trainer.work_dir, 'output')
    with open(os.path.join(output, 'configuration.json'), encoding='utf-8') as f:
        configuration = json.load(f)
    assert configuration['task'] == 'text-to-image-synthesis'
    assert configuration['pipeline'] == {'type': 'diffusers-stable-diffusion'}
    for part, name in (('unet', 'diffusion_pytorch_model.bin'), ('vae', 'diffusion_pytorch_model.bin'),
                       ('text_encoder', 'pytorch_model.bin')):
        assert name in os.listdir(os.path.join(output, part)), part
    # ModelScope's StableDiffusionPipeline: DiffusionPipeline.from_pretrained(model, use_safetensors=False)
    pipe = DiffusionPipeline.from_pretrained(output, use_safetensors=False)
    for key, value in trainer.model.unet.state_dict().items():
        assert torch.equal(pipe.unet.state_dict()[key], value), key
    pipe.set_progress_bar_config(disable=True)
    image = pipe('a dog', num_inference_steps=2, height=16, width=16, output_type='np',
                 generator=torch.Generator().manual_seed(0)).images[0]
    assert image.shape == (16, 16, 3)


# -- 6: evaluate() ---------------------------------------------------------------------------
def test_evaluate_computes_the_metrics_and_leaves_training_randomness_alone(dreambooth_run):
    trainer, _ = dreambooth_run
    state = torch.get_rng_state()
    first = trainer.evaluate()
    assert set(first) == {'loss'} and first['loss'] > 0
    assert torch.equal(torch.get_rng_state(), state)
    assert trainer.evaluate() == first  # its own seeded noise: the same number each time
    assert json_records(trainer.work_dir, 'eval') == []  # no EvaluationHook configured: none during training


def test_a_trainer_built_only_to_evaluate_needs_no_run_length(tmp_path, model_dir, data_dir):
    def no_length(cfg):
        cfg.train.pop('max_epochs')
        return cfg
    trainer = build_trainer('dreambooth-diffusion', default_args=dict(
        model=model_dir, work_dir=str(tmp_path), train_dataset=None, eval_dataset=rows_of(data_dir, 'validation'),
        cfg_modify_fn=no_length, device='cpu'))
    try:
        assert set(trainer.evaluate()) == {'loss'}
    finally:
        trainer.close()


# -- 7: seed 42 ------------------------------------------------------------------------------
def test_modelscope_trainers_and_configurations_seed_42(dreambooth_run, tmp_path):
    from hookloop.compat import modelscope
    trainer, _ = dreambooth_run
    assert trainer.seed == 42
    assert modelscope.translate({'framework': 'pytorch', 'task': 'text-classification'})['seed'] == 42
    configuration = {'task': 'text-classification', 'train': {'work_dir': str(tmp_path), 'max_epochs': 1,
                                                            'optimizer': {'type': 'SGD', 'lr': 0.1}}}
    path = tmp_path / 'configuration.json'
    path.write_text(json.dumps(configuration))
    plain = build_trainer('trainer', default_args=dict(cfg_file=str(path), model=torch.nn.Linear(2, 1), device='cpu'))
    try:
        assert plain.seed == 42
    finally:
        plain.close()


# -- 8: ModelScope's names ---------------------------------------------------------------------
def test_modelscope_trainer_names_are_registered_and_lora_rank_is_lora_diffusions(tmp_path, model_dir, data_dir):
    assert TRAINERS.get('dreambooth-diffusion').__name__ == 'ModelScopeDreamBoothTrainer'
    assert TRAINERS.get('lora-diffusion').__name__ == 'ModelScopeLoraDiffusionTrainer'
    trainer = modelscope_trainer('lora-diffusion', model_dir, data_dir, tmp_path, lora_rank=3)
    try:
        assert trainer.model.unet.peft_config['default'].r == 3
        assert trainer.model.unet.peft_config['default'].lora_alpha == 3  # LoRAAttnProcessor: no alpha scaling
        trained = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
        assert trained and all('lora_' in n for n in trained)
    finally:
        trainer.close()
    with pytest.raises(ConfigError, match='lora-diffusion lora_rank must be a positive int'):
        modelscope_trainer('lora-diffusion', model_dir, data_dir, tmp_path / 'bad', lora_rank=0)
    with pytest.raises(ConfigError, match="lora_rank is an argument of 'lora-diffusion'"):
        modelscope_trainer('dreambooth-diffusion', model_dir, data_dir, tmp_path / 'bad', lora_rank=4)


# -- 9: a rerun says what the work dir holds ---------------------------------------------------
def test_a_rerun_names_the_checkpoints_and_resume_auto_continues(dreambooth_run, model_dir, data_dir, class_dir,
                                                               capsys):
    trainer, _ = dreambooth_run
    again = modelscope_trainer('dreambooth-diffusion', model_dir, data_dir, trainer.work_dir,
                               with_prior_preservation=True, class_data_dir=class_dir, num_class_images=2,
                               resolution=16, cfg_modify_fn=constant_lr(epochs=2))
    capsys.readouterr()
    again.note_existing_checkpoints()  # what train() says first when resume_from is not given
    again.close()
    assert "holds 2 checkpoint(s) (e.g. epoch_2.pth): this run starts from iteration 0; pass resume_from='auto'" \
        in capsys.readouterr().out
    resumed = modelscope_trainer('dreambooth-diffusion', model_dir, data_dir, trainer.work_dir,
                                 with_prior_preservation=True, class_data_dir=class_dir, num_class_images=2,
                                 resolution=16, resume_from='auto', cfg_modify_fn=constant_lr(epochs=2))
    train(resumed)
    assert resumed.iter == 6  # already complete: restored, nothing trained again
    for key, value in trainer.model.unet.state_dict().items():
        assert torch.equal(resumed.model.unet.state_dict()[key], value), key


# -- arguments ModelScope documents as no-ops, and bad ones ------------------------------------
def test_documented_no_ops_are_logged_and_bad_arguments_refused(dreambooth_run, tmp_path, model_dir, data_dir):
    trainer, _ = dreambooth_run
    log = open(os.path.join(trainer.work_dir, sorted(n for n in os.listdir(trainer.work_dir)
                                                      if n.endswith('.log'))[0]), encoding='utf-8').read()
    assert "model_revision='v1.0.8' is not used" in log and "prompt='dog' is not used" in log
    assert "instance_prompt 'a photo of sks dog' is not used" in log
    for extra, named in ((dict(torch_type='float8'), 'torch_type must be'),
                         (dict(model=str(tmp_path / 'AI-ModelScope')), 'is not a local directory'),
                         (dict(train_dataset=[{'image': 'x.png', 'caption': 'a'}]), 'rows must give an image'),
                         (dict(train_dataset={'train': rows_of(data_dir), 'validation': []}), 'a dict of splits'),
                         (dict(learning_rate=1e-4), 'arguments not supported: learning_rate')):
        with pytest.raises(ConfigError, match=named):
            modelscope_trainer('dreambooth-diffusion', model_dir, data_dir, tmp_path / 'bad', **extra)


def test_rows_read_in_order_train_with_train_iters_per_epoch(tmp_path, model_dir, data_dir):
    from torch.utils.data import IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(rows_of(data_dir))

    record = Record()
    trainer = modelscope_trainer('dreambooth-diffusion', model_dir, data_dir, tmp_path, train_dataset=Stream(),
                                 train_iters_per_epoch=3, cfg_modify_fn=constant_lr(epochs=1), callbacks=[record])
    train(trainer)
    assert trainer.iter == 3 and [t for texts in record.texts for t in texts] == [r['Text'] for r in rows_of(data_dir)]


def test_lora_diffusion_takes_a_built_model_only_with_its_adapters(tmp_path, model_dir, data_dir):
    from hookloop.dreambooth import ModelScopeStableDiffusion
    plain = ModelScopeStableDiffusion(model_dir)
    with pytest.raises(ConfigError, match='lora-diffusion adds LoRA adapters of rank 4'):
        modelscope_trainer('lora-diffusion', plain, data_dir, tmp_path / 'a',
                           cfg_file=os.path.join(model_dir, 'configuration.json'))
    trainer = modelscope_trainer('lora-diffusion', ModelScopeStableDiffusion(model_dir, lora_rank=4), data_dir,
                                 tmp_path / 'b', cfg_file=os.path.join(model_dir, 'configuration.json'))
    trainer.close()
