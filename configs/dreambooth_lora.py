# DreamBooth with LoRA on a Stable Diffusion pipeline (the diffusers back-end), as diffusers'
# train_dreambooth_lora.py does it, plus exact resume, validation images and trackers:
#   hookloop train configs/dreambooth_lora.py --cfg-options model=/models/stable-diffusion-v1-5 \
#       instance_data_dir=data/my_dog
#   hookloop train configs/dreambooth_lora.py --resume auto          # continue after a kill
# The LoRA weights land in work_dirs/dreambooth_lora/pipeline; load them with
#   StableDiffusionPipeline.from_pretrained(BASE).load_lora_weights('work_dirs/dreambooth_lora/pipeline')
# Checkpoints hold only the adapters, their optimizer state, schedule, RNG and hook states
# (a few MB for SD 1.5 at rank 4); a resume checks that the base pipeline is the same.
trainer = 'dreambooth_diffusion'
model = 'models/stable-diffusion-v1-5'      # a local diffusers pipeline directory
instance_data_dir = 'data/my_dog'           # a few photos of the subject (EXIF orientation is applied)
instance_prompt = 'a photo of sks dog'
with_prior_preservation = True
class_prompt = 'a photo of dog'
num_class_images = 100                      # generated before the run, split across ranks
resolution = 512
center_crop = False                         # random crop, as diffusers' default
random_flip = True
image_interpolation_mode = 'lanczos'       # the LoRA script's default resize filter (bilinear: train_dreambooth.py)
lora = dict(rank=4, alpha=4, target_modules=None, dropout=0.0, text_encoder=False)
snr_gamma = 5.0                             # min-SNR weighting
max_grad_norm = 1.0
train_dataloader = dict(batch_size=1, num_workers=2)
optimizer = dict(type='AdamW', lr=1e-4, weight_decay=1e-2)
optimizer_config = dict(precision='fp16')   # also casts the frozen VAE, text encoder and UNet base to fp16
lr_config = dict(policy='Fixed', warmup='linear', warmup_iters=50)
max_iters = 500
checkpoint_config = dict(interval=100, by_epoch=False, max_keep_ckpts=2)   # save_frozen=False by default
validation = dict(prompts=['a photo of sks dog in a bucket'], every_n_iters=100, num_images=2,
                  num_inference_steps=25, guidance_scale=7.5, seed=0)
log_config = dict(interval=10, hooks=[dict(type='TextLoggerHook', by_epoch=False),
                                      dict(type='TensorboardLoggerHook', by_epoch=False)])
seed = 0
work_dir = 'work_dirs/dreambooth_lora'
