"""Small helpers over torch.distributed; everything works when it is not initialised."""
import torch.distributed as torch_dist


def is_distributed():
    return torch_dist.is_available() and torch_dist.is_initialized()


def get_rank():
    return torch_dist.get_rank() if is_distributed() else 0


def get_world_size():
    return torch_dist.get_world_size() if is_distributed() else 1


def is_main_process():
    return get_rank() == 0


def broadcast_object(obj, src=0):
    """``obj`` as rank ``src`` has it, on every rank (identity when not distributed)."""
    if not is_distributed():
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=src)
    return box[0]


def init_distributed(launcher='auto', backend=None, timeout=1800, device=None):
    """Join the process group torchrun describes; ``(rank, world_size)``.

    ``launcher='auto'`` joins when the torchrun environment (``WORLD_SIZE`` > 1) is
    present; ``'none'`` always runs single-process. (The distributed issue fills this in.)
    """
    return get_rank(), get_world_size()


def wrap_model(model, strategy=None, device=None, find_unused_parameters=False):
    """The model the training step calls: ``model`` itself when not distributed."""
    return model
