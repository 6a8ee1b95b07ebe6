"""The image channel: any hook or model publishes images, every hook that accepts them writes them.

``publish_images(trainer, tag, images, step)`` asks each registered hook ``accepts_images(trainer)``
(the channel's declaration: :class:`~hookloop.hooks.loggers.base.LoggerHook` says True on rank 0,
while it is open, when its class implements ``log_images``) and hands the images to those that do,
through their ``log_images(trainer, tag, images, step)``: TensorBoard image summaries, W&B
``wandb.Image``, MLflow ``log_image``, Neptune ``File.as_image`` series, DVCLive ``log_image``
(the text logger has no image API: it does not accept them). A hook without ``accepts_images`` is not part of the channel.

Images are PIL images, or ``(H, W, 3)`` / ``(H, W)`` uint8 arrays, or ``(3, H, W)`` float
tensors in [-1, 1] (a sample as the diffusion back-ends produce it); loggers receive
``(H, W, 3)`` uint8 NumPy arrays. ``step`` is the number of training iterations completed,
as for scalars. Nothing here syncs the device per iteration: images are published when
produced (e.g. every K iterations), not on a schedule of their own.
"""
import numpy as np
import torch


def as_uint8_hwc(image):
    """One image as an ``(H, W, 3)`` uint8 array (see the module doc for what is accepted)."""
    if isinstance(image, torch.Tensor):
        data = ((image.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        image = data.permute(1, 2, 0).numpy() if data.dim() == 3 else data.numpy()
    array = np.asarray(image.convert('RGB')) if hasattr(image, 'convert') else np.asarray(image)
    if array.dtype != np.uint8:
        raise TypeError(f'publish_images: images must be uint8 arrays, PIL images or tensors in [-1, 1], '
                        f'got an array of {array.dtype}')
    if array.ndim == 2:
        array = np.repeat(array[..., None], 3, axis=-1)
    if array.ndim != 3 or array.shape[-1] not in (1, 3):
        raise TypeError(f'publish_images: an image must be (H, W), (H, W, 1) or (H, W, 3), got {array.shape}')
    if array.shape[-1] == 1:
        array = np.repeat(array, 3, axis=-1)
    return np.ascontiguousarray(array)


def publish_images(trainer, tag, images, step):
    """Give ``images`` (a list) under ``tag`` (e.g. ``'validation/a photo of sks dog'``)
    at ``step`` to every hook of ``trainer`` that accepts images. Returns the images as converted."""
    receivers = [hook for hook in trainer.hooks
                 if getattr(hook, 'accepts_images', None) is not None and hook.accepts_images(trainer)]
    arrays = [as_uint8_hwc(image) for image in images]
    for hook in receivers:
        hook.log_images(trainer, tag, arrays, step)
    return arrays
