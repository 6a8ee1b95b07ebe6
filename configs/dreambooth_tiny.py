# DreamBooth with the built-in tiny back-end, on the CPU in well under a minute:
# a tiny text-to-image model pretrained on toy 8x8 "dog", "cat" and "car" images learns a
# subject ("sks dog") from 4 samples, with prior preservation against language drift.
#   hookloop train configs/dreambooth_tiny.py
# The fine-tuned model is written to work_dirs/dreambooth_tiny/pipeline
# (load it with hookloop.dreambooth.TinyDiffusion.from_pretrained).
custom_imports = ['hookloop.dreambooth']
trainer = 'dreambooth_diffusion'
model = dict(type='ToyPretrainedTinyDiffusion', steps=600, hidden=128)  # pretrains in a few seconds
instance_data = dict(type='ToySubjectSamples', count=4)  # or instance_data_dir='path/to/images'
instance_prompt = 'a sks dog'
with_prior_preservation = True
class_prompt = 'a dog'
prior_loss_weight = 1.0
num_class_images = 16
train_dataloader = dict(batch_size=2)
optimizer = dict(type='Adam', lr=1e-3)
optimizer_config = dict()
max_iters = 300
checkpoint_config = dict(interval=100, by_epoch=False)
log_config = dict(interval=50, hooks=[dict(type='TextLoggerHook', by_epoch=False)])
seed = 0
device = 'cpu'
work_dir = 'work_dirs/dreambooth_tiny'
