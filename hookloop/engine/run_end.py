"""The end of a run, on every exit path: wait for the last checkpoint write, every hook's
``after_run`` (loggers close even when a hook fails), the closing summary, and the work dir's
lock released. The error that stopped training stays the one raised.
"""
from ..dist.process_group import teardown
from ..errors import CheckpointError
from ..logging.flusher import flush_logs
from .dispatch import hook_name
from .run_summary import log_run_summary


def finish_run(trainer, run_start):
    """``after_run`` on every exit path; on an error path a failing hook is logged,
    not raised, so the original error stays visible. Then the closing summary
    (``run_start``: ``(perf_counter at the start, iteration at the start)``). A failed
    background checkpoint write (``async_save``) fails the run here."""
    try:
        _end(trainer, run_start)
    finally:
        trainer.workspace.release()


def _end(trainer, run_start):
    save_error = None
    try:
        trainer.wait_for_checkpoint()  # after_run and error paths see the last save on disk
    except CheckpointError as exc:
        save_error = exc
        if trainer.exception is None:
            trainer.exception = exc
        else:
            trainer.logger.error('%s (while handling %r)', exc, trainer.exception)
    failed = trainer.exception is not None
    if failed and trainer.world_size > 1:  # other ranks print errors too: say which rank failed first-hand
        trainer.logger.error('rank %d of %d stopped by %r', trainer.rank, trainer.world_size, trainer.exception)
    call_after_run(trainer)
    if failed:
        # Leave the process group now: ranks waiting for this one in a collective see
        # the connection close and fail at once instead of waiting for dist_timeout.
        teardown()
    if trainer.stop_reason is not None:
        trainer.logger.info('training stopped at epoch %d, iteration %d: %s', trainer.epoch, trainer.iter,
                            trainer.stop_reason)
    log_run_summary(trainer, *run_start)
    if trainer.profile_hooks:
        from ..logging.profiling import report_hook_timings
        report_hook_timings(trainer)
    if trainer.rank == 0:
        trainer.workspace.upload_logs(trainer.logger)  # a URL work dir: the local mirror's logs go there
    if save_error is not None and trainer.exception is save_error:
        raise save_error


def call_after_run(trainer):
    """Every hook's ``after_run`` (loggers close) even when an earlier one fails. After a
    successful run the first failure is raised (and becomes ``trainer.exception``); on an
    error path failures are logged, so the error that stopped training stays the one raised."""
    logger = trainer.logger
    flush_logs()  # the trackers' waiting records: an after_run hook may copy or upload what they wrote
    if trainer.exception is None:
        failure = None
        for method in trainer._dispatch['after_run']:
            try:
                method(trainer)
            except BaseException as exc:
                if failure is None:
                    failure = exc
                else:
                    logger.error('%s.after_run also failed: %r', hook_name(method), exc)
        if failure is not None:
            trainer.exception = failure
            raise failure
        return
    for method in trainer._dispatch['after_run']:
        try:
            method(trainer)
        except Exception as hook_error:  # keep the error that stopped training
            logger.error('%s.after_run failed while handling %r: %r', hook_name(method), trainer.exception, hook_error)


__all__ = ['call_after_run', 'finish_run']
