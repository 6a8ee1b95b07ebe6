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
    float32 also under autocast.
    """

    def __init__(self, prior_loss_weight=1.0, with_prior_preservation=False):
        self.prior_loss_weight = prior_loss_weight
        self.with_prior_preservation = with_prior_preservation

    def __call__(self, outputs, batch):
        prediction, target = outputs['model_pred'].float(), outputs['target'].float()
        if not self.with_prior_preservation:
            loss = F.mse_loss(prediction, target)
            return {**outputs, 'loss': loss, 'loss_instance': loss.detach()}
        prediction, prior_prediction = prediction.chunk(2)
        target, prior_target = target.chunk(2)
        loss_instance = F.mse_loss(prediction, target)
        loss_prior = F.mse_loss(prior_prediction, prior_target)
        return {**outputs, 'loss': loss_instance + self.prior_loss_weight * loss_prior,
                'loss_instance': loss_instance.detach(), 'loss_prior': loss_prior.detach()}
