"""The DreamBooth objective: denoising error on the subject plus, with prior
preservation, ``prior_loss_weight`` times the error on the model's own class samples."""
import torch.nn.functional as F


class PriorPreservationLoss:
    """``loss_fn(outputs, batch)`` for the trainer.

    ``outputs`` holds ``model_pred`` and ``target``; with ``with_prior_preservation`` the
    first half of the batch are instance samples and the second half class samples
    (see :func:`~hookloop.dreambooth.dataset.collate_dreambooth`). Returns ``loss``
    (what is back-propagated), ``loss_instance`` and, with prior preservation,
    ``loss_prior`` (both logged), next to the model's own outputs. The MSE is taken in
    float32 also under autocast. With ``outputs['sample_weight']`` (one weight per sample,
    e.g. min-SNR) the instance term is the weighted mean of the per-sample errors; the
    prior term stays unweighted, as in diffusers' DreamBooth script.
    """

    def __init__(self, prior_loss_weight=1.0, with_prior_preservation=False):
        self.prior_loss_weight = prior_loss_weight
        self.with_prior_preservation = with_prior_preservation

    def __call__(self, outputs, batch):
        prediction, target = outputs['model_pred'].float(), outputs['target'].float()
        weight = outputs.get('sample_weight')
        if not self.with_prior_preservation:
            loss = _instance_loss(prediction, target, weight)
            return {**outputs, 'loss': loss, 'loss_instance': loss.detach()}
        prediction, prior_prediction = prediction.chunk(2)
        target, prior_target = target.chunk(2)
        loss_instance = _instance_loss(prediction, target, None if weight is None else weight.chunk(2)[0])
        loss_prior = F.mse_loss(prior_prediction, prior_target)
        return {**outputs, 'loss': loss_instance + self.prior_loss_weight * loss_prior,
                'loss_instance': loss_instance.detach(), 'loss_prior': loss_prior.detach()}


def _instance_loss(prediction, target, weight):
    if weight is None:
        return F.mse_loss(prediction, target)
    per_sample = F.mse_loss(prediction, target, reduction='none').mean(dim=tuple(range(1, prediction.dim())))
    return (per_sample * weight.float()).mean()
