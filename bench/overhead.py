"""Per-iteration overhead of hookloop over a plain PyTorch loop doing the same math (CPU).

Each mode pairs a hookloop configuration with the plain loop that does the same work:

    default   the default hooks (optimizer step, timer, text log every 10)  vs  backward; step; zero_grad
    accum2    OptimizerHook(cumulative_iters=2)        vs  (loss / 2).backward(); step every 2nd iteration
    fp16      OptimizerHook(precision='fp16')          vs  autocast(fp16) + GradScaler('cpu')
    skip      + CheckInvalidLossHook(on_invalid='skip')      vs  the default plain loop (the check's cost)
    ema       + EMAHook(interval=1)                    vs  the default plain loop + a torch._foreach_lerp_ EMA
    rollback  + CheckInvalidLossHook(on_invalid='rollback')  vs  the default plain loop
    logging   text + TensorBoard logging every 10 iterations vs  the default plain loop
              (``tensorboard`` is the same mode)
    default50, accum2_50, tensorboard50, fp16_50: as default / accum2 / logging / fp16, with the text
              log every 50 iterations and a checkpoint per epoch

Models: ``tiny`` = Linear(32,32)-ReLU-Linear(32,1), batch 32 (overhead-bound); ``mlp`` =
4 x Linear(1024,1024)+ReLU, Linear(1024,1), batch 256 (compute-bound). Same data, initial
weights and SGD(momentum 0.9); shuffled loader; one torch thread.

How it is timed. A shared machine changes speed by tens of percent from one second to the
next, far more than the difference measured, so the two loops are interleaved finely: the
hookloop run carries a hook that, every ``--block`` iterations, runs ``--block`` iterations of
the plain loop (its own model, optimizer and loader) right there; it is called only then
(``next_call``). Each iteration of either loop is stamped as its forward starts, by the model
both loops share, so hookloop carries no timing hook. The gaps right after a switch (cold
caches) are dropped; ``framework_us`` is the median over ``--rounds`` runs of (median hookloop
gap - median plain gap): the cost between log events; ``framework_mean_us`` the same with mean
gaps, which include the log events' and checkpoints' share: what a user's run pays on average;
``framework_cycle_us`` the mean over a log cycle of the median gap at each of its positions
(less the plain median): the same mean with the log events' share but not the machine's
stalls (a 5 ms stall of a shared machine in one gap of 2000 moves a plain mean by 2.5 us).
``positions_us``: the median gap at each position of a log cycle (the first one ends with
the log event, the next ones show the cold caches it leaves) less the plain median.
``load`` is the machine's 1-minute load average when the
mode finished. ``--clock wall`` (default) stamps with ``time.perf_counter``;
``--clock thread`` with the main thread's CPU time, which ignores time the process waits.

``records``: the train records the loggers built in a round (one per log event).
``--event`` is an ablation, to see where a log event's time goes: ``full`` (default) runs the
loggers as they are; ``mark`` has them only take their mark at a log event (the meters' sources
hand over their values: no summary, record or line); ``none`` makes their ``after_train_iter`` a
no-op (what is left is the walk that calls them: the floor of any log event on this loop).

    python bench/overhead.py                                   # default mode, tiny and mlp
    python bench/overhead.py --models tiny --event none        # the walk alone
    python bench/overhead.py --models tiny --modes default50,accum2_50,tensorboard50 --rounds 5
"""
import argparse
import contextlib
import functools
import itertools
import json
import os
import statistics
import tempfile
import time
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookloop import Hook, Trainer
from hookloop.hooks.loggers.base import LoggerHook
from hookloop.hooks.order import HookOrderWarning

MODELS = {
    # name: (build, features, batch, default iterations per round)
    'tiny': (lambda: nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)), 32, 32, 2000),
    'mlp': (lambda: nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(1024, 1024), nn.ReLU())],
                                  nn.Linear(1024, 1)), 1024, 256, 60),
}
EMA_MOMENTUM, EMA_WARM_UP = 0.0002, 100  # EMAHook's defaults
# mode: hookloop's extra Trainer arguments
MODES = {
    'default': {},
    'accum2': dict(optimizer_config=dict(cumulative_iters=2)),
    'fp16': dict(optimizer_config=dict(precision='fp16')),
    'skip': dict(custom_hooks=[dict(type='CheckInvalidLossHook', on_invalid='skip')]),
    'rollback': dict(custom_hooks=[dict(type='CheckInvalidLossHook', on_invalid='rollback')]),
    'ema': dict(custom_hooks=[dict(type='EMAHook', momentum=EMA_MOMENTUM, interval=1, warm_up=EMA_WARM_UP)]),
    'logging': dict(log_config=dict(interval=10, hooks=[dict(type='TextLoggerHook'),
                                                        dict(type='TensorboardLoggerHook')])),
    'tensorboard': dict(log_config=dict(interval=10, hooks=[dict(type='TextLoggerHook'),
                                                            dict(type='TensorboardLoggerHook')])),
    # The issue-15 set-up: text log every 50 iterations and a checkpoint per epoch.
    'default50': dict(log_config=dict(interval=50), checkpoint_config=dict(interval=1)),
    'accum2_50': dict(log_config=dict(interval=50), checkpoint_config=dict(interval=1),
                      optimizer_config=dict(cumulative_iters=2)),
    'tensorboard50': dict(log_config=dict(interval=50, hooks=[dict(type='TextLoggerHook'),
                                                              dict(type='TensorboardLoggerHook')]),
                          checkpoint_config=dict(interval=1)),
    'fp16_50': dict(log_config=dict(interval=50), checkpoint_config=dict(interval=1),
                    optimizer_config=dict(precision='fp16')),
}
ALIASES = {'default_50': 'default50', 'tensorboard_50': 'tensorboard50'}  # the names the issue uses
PLAIN_MODE = {'accum2_50': 'accum2', 'fp16_50': 'fp16'}  # the plain loop each hookloop mode is compared with (default: its math)
# Iterations timed together: with accumulation every other iteration steps, so single gaps
# fall in two clusters and their median says little; a window's gap (divided by its size) does.
PERIOD = {'accum2': 2, 'accum2_50': 2}
clock = time.perf_counter
LOG_LEVEL = 'INFO'  # --log-level
records = [0]  # train records built (the log events that ran in full)


def _counted(train_record):
    @functools.wraps(train_record)
    def counted(self, trainer, summary):
        records[0] += 1
        return train_record(self, trainer, summary)
    return counted


LoggerHook.train_record = _counted(LoggerHook.train_record)


class Loss(nn.Module):
    """The model of both loops; each forward is stamped (when ``stamps`` is a list), so both
    loops are timed at the same point by the same code."""

    def __init__(self, net):
        super().__init__()
        self.net = net
        self.stamps = None

    def forward(self, x, y):
        if self.stamps is not None:
            self.stamps.append(clock())
        return nn.functional.mse_loss(self.net(x), y)


def make_data(features, batch, iters):
    generator = torch.Generator().manual_seed(0)
    n = batch * iters
    return TensorDataset(torch.randn(n, features, generator=generator), torch.randn(n, 1, generator=generator))


class PlainLoop:
    """The plain loop of ``mode``, run a block of iterations at a time."""

    def __init__(self, mode, model, loader):
        self.mode, self.model, self.loader = PLAIN_MODE.get(mode, mode), model, loader
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        self.scaler = torch.amp.GradScaler('cpu') if self.mode == 'fp16' else None
        if self.mode == 'ema':  # the averages of a user's EMA, updated after each step
            self.parameters = list(model.parameters())
            self.averages = [p.detach().clone() for p in self.parameters]
        # endless: a new pass of the loader when one ends, with no Python frame per batch
        self.batches, self.index = itertools.chain.from_iterable(itertools.repeat(loader)), 0
        model.train()

    def run(self, count):
        """``count`` iterations, each loop written out as a user would (no mode checks inside)."""
        model, optimizer, scaler = self.model, self.optimizer, self.scaler
        next_batch = functools.partial(next, self.batches)
        model.stamps.append(None)  # a switch: the gaps right after it are dropped
        if scaler is not None:
            for _ in range(count):
                x, y = next_batch()
                with torch.autocast('cpu', dtype=torch.float16):
                    loss = model(x, y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
        elif self.mode == 'ema':
            parameters, averages = self.parameters, self.averages
            for step in range(self.index, self.index + count):
                x, y = next_batch()
                model(x, y).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                with torch.no_grad():  # MMCV's momentum with a warm-up, as EMAHook's
                    torch._foreach_lerp_(averages, parameters, min(EMA_MOMENTUM, (1 + step) / (EMA_WARM_UP + step)))
        elif self.mode == 'accum2':
            for index in range(self.index, self.index + count):
                x, y = next_batch()
                (model(x, y) / 2).backward()
                if index % 2 == 1:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
        else:
            for _ in range(count):
                x, y = next_batch()
                model(x, y).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        self.index += count
        next_batch()  # what the last gap of the block spans in hookloop too: the next fetch
        model.stamps.append(clock())


class Interleave(Hook):
    """Every ``block`` iterations, runs ``block`` iterations of the plain loop; called only
    then (``next_call``), so it adds nothing to hookloop's other iterations."""

    def __init__(self, plain, model, block):
        self.plain, self.model, self.block = plain, model, block

    def next_call(self, trainer, stage, start):
        return self.next_every_n_iters(start, self.block)

    def after_train_iter(self, trainer):
        if (trainer.iter + 1) % self.block:  # (a hookloop without next_call calls it every iteration)
            return
        self.plain.run(self.block)
        self.model.stamps.append(None)


def gaps_us(stamps, skip, period=1, phases=None):
    """Per-iteration gaps over ``period`` consecutive iterations, leaving out the first ``skip``
    after each switch (None). With a list ``phases``, the index of the iteration whose forward
    ends each gap is appended to it (the loop's n-th forward is iteration n)."""
    gaps, run, index = [], [], -1
    for stamp in stamps:
        if stamp is None:
            run = []
            continue
        index += 1
        run.append(stamp)
        if len(run) > skip + period:
            gaps.append((run[-1] - run[-1 - period]) * 1e6 / period)
            if phases is not None:
                phases.append(index)
    return gaps


def position_medians(gaps, indices, cycle):
    """The median gap at each position of a log cycle (position 0: the gap that holds the event).
    Their mean is the mean per iteration with the log events' share, robust to a shared
    machine's stalls (which land in a few gaps and move a plain mean by more than the events do)."""
    by_phase = {}
    for gap, index in zip(gaps, indices):
        by_phase.setdefault(index % cycle, []).append(gap)
    return [statistics.median(by_phase[position]) for position in sorted(by_phase)]


def ablate_event(event):
    """``--event``: what the loggers do at a log event (see the module docstring)."""
    if event == 'full':
        return

    def after_train_iter(self, trainer):
        if event == 'mark' and self.should_log(trainer):
            self._mark = trainer.meters.mark()
    LoggerHook.after_train_iter = after_train_iter


def one_round(mode, build, initial, data, batch, block, skip):
    models = []
    for _ in range(2):
        model = Loss(build())
        model.load_state_dict(initial)
        model.stamps = []
        models.append(model)
    loader = lambda: DataLoader(data, batch_size=batch, shuffle=True, drop_last=True)  # noqa: E731
    records[0] = 0
    # At INFO (the default a user gets) the terminal lines are written as for a user, to /dev/null
    # here: the run's stream handler keeps the stdout it was built with.
    with open(os.devnull, 'w') as terminal, contextlib.redirect_stdout(terminal):
        trainer = Trainer(models[1], optimizer=torch.optim.SGD(models[1].parameters(), lr=0.01, momentum=0.9),
                          train_dataloader=loader(), max_epochs=1,
                          work_dir=tempfile.mkdtemp(prefix='hookloop-bench-'), seed=0, device='cpu',
                          log_level=LOG_LEVEL, **MODES[mode])
        with warnings.catch_warnings():  # loggers run after every other hook: this one comes before them
            warnings.simplefilter('ignore', HookOrderWarning)
            trainer.register_hook(Interleave(PlainLoop(mode, models[0], loader()), models[1], block),
                                  priority='LOWEST')
            trainer.resolve_hooks()  # the defaults (loggers among them) join here
        trainer.train()
        trainer.close()
    period = PERIOD.get(mode, 1)
    indices = []
    plain, hooked = gaps_us(models[0].stamps, skip, period), gaps_us(models[1].stamps, skip, period, indices)
    cycle = MODES[mode].get('log_config', {}).get('interval', 10)
    positions = position_medians(hooked, indices, cycle)
    return (statistics.median(plain), statistics.median(hooked), statistics.mean(plain), statistics.mean(hooked),
            statistics.mean(positions), positions, records[0])


def run(model_name, mode, rounds, iters, block):
    build, features, batch, default_iters = MODELS[model_name]
    iters = iters or default_iters
    block = min(block, iters)
    data = make_data(features, batch, iters)
    torch.manual_seed(0)
    initial = Loss(build()).state_dict()
    skip = min(2, block - 1)
    results = [one_round(mode, build, initial, data, batch, block, skip) for _ in range(rounds)]
    plain_us = statistics.median(r[0] for r in results)
    hook_us = statistics.median(r[1] for r in results)
    return {'model': model_name, 'mode': mode, 'iters': iters, 'rounds': rounds, 'block': block,
            'clock': clock.__name__, 'plain_us': round(plain_us, 1), 'hookloop_us': round(hook_us, 1),
            'ratio': round(hook_us / plain_us, 4),
            'framework_us': round(statistics.median(r[1] - r[0] for r in results), 1),
            'framework_mean_us': round(statistics.median(r[3] - r[2] for r in results), 1),
            'framework_cycle_us': round(statistics.median(r[4] - r[0] for r in results), 1),
            'records': results[-1][6],
            'positions_us': [round(statistics.median(r[5][k] - r[0] for r in results), 1)
                             for k in range(min(len(r[5]) for r in results))],
            'load': round(os.getloadavg()[0], 1)}


def main():
    global clock, LOG_LEVEL
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--models', default='tiny,mlp')
    parser.add_argument('--modes', default='default', help=f'comma-separated, from {", ".join(MODES)}')
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--iters', type=int, default=0, help='iterations per round (default: 2000 tiny, 60 mlp)')
    # 23: prime to the log intervals, so log events fall at every position of a block and the
    # ones dropped with the gaps after a switch are as few, in proportion, as the other iterations
    # (with 25 every event of a 50-interval log fell on a switch and the mean never saw one)
    parser.add_argument('--block', type=int, default=23, help='iterations of one loop before switching to the other')
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--log-level', default='INFO', help="the run's log level (INFO: the default, lines to /dev/null)")
    parser.add_argument('--clock', choices=('wall', 'thread'), default='wall')
    parser.add_argument('--event', choices=('full', 'mark', 'none'), default='full',
                        help='what the loggers do at a log event (an ablation; see above)')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == 'thread' else time.perf_counter
    LOG_LEVEL = args.log_level
    ablate_event(args.event)
    for name in args.models.split(','):
        for mode in args.modes.split(','):
            mode = ALIASES.get(mode, mode)
            print(json.dumps(dict(run(name, mode, args.rounds, args.iters, args.block), event=args.event)), flush=True)


if __name__ == '__main__':
    main()
