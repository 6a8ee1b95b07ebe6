"""hookloop against a plain loop, each in its own process, a token passed between them.

``bench/overhead.py`` runs both loops in one process: it sees hookloop's own costs, but the two
loops share one heap and one allocator, so what hookloop leaves in the process's memory (and
what that does to the step's allocations) is invisible to it. Here each loop runs in a fresh
process of its own; the two take turns, one block of ``--block`` iterations each, passing a
token through a pipe, so a shared machine's drift reaches both alike while each keeps its heap.

* ``--runs 1`` (fresh): one run per process, as a script does.
* ``--runs 7`` (sweep): seven runs in each process, a new ``Trainer`` (or a new plain loop:
  model, optimizer, loader) for each, closed after it, as a hyperparameter search, a notebook or
  a k-fold loop does.

Per run it reports the time ratio hookloop / plain (the sum of the blocks' times, the first
block of each run left out: both set up there) and each loop's minor page faults per iteration
(``resource.getrusage``: the kernel's count, which machine load does not move; a step whose
memory goes back to the kernel and is faulted in again shows here first). ``--pairs`` repeats
with new processes, the first mover alternating.

    python bench/processes.py --model mlp --runs 1 --pairs 3       # fresh: median ratio of 3 pairs
    python bench/processes.py --model mlp --runs 7                   # a sweep of 7 runs
    python bench/processes.py --model mlp --runs 7 --mode ema        # both with an EMA (interval 1)
"""
import argparse
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead import MODELS, MODES, Loss, PlainLoop, make_data  # noqa: E402


def minor_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class Turns:
    """One side of the token: ``wait()`` until it is this process's turn, ``done()`` to pass it;
    the time and faults between the two are this process's block."""

    def __init__(self, receive, send, clock):
        self.receive, self.send, self.clock = receive, send, clock
        self.blocks = []  # (seconds, faults) per block of the current run
        self._start = None

    def wait(self):
        self.receive.recv()
        self._faults, self._start = minor_faults(), self.clock()

    def done(self):
        seconds, faults = self.clock() - self._start, minor_faults() - self._faults
        self.blocks.append((seconds, faults))
        self.send.send(None)

    def take_run(self):
        blocks, self.blocks = self.blocks, []
        return blocks


def _plain_runs(args, turns, data, initial):
    import torch
    build, _, batch, _ = MODELS[args.model]
    for _ in range(args.runs):
        model = Loss(build())
        model.load_state_dict(initial)
        model.stamps = []
        loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, drop_last=True)
        plain = PlainLoop(args.mode, model, loader)
        for _ in range(args.iters // args.block):
            turns.wait()
            plain.run(args.block)
            model.stamps.clear()
            turns.done()
        yield turns.take_run()


def _hookloop_runs(args, turns, data, initial):
    import torch
    from hookloop import Hook, Trainer
    from hookloop.hooks.order import HookOrderWarning
    build, _, batch, _ = MODELS[args.model]

    class Token(Hook):  # the block's end: pass the token, wait for it back (called only there)
        def next_call(self, trainer, stage, start):
            return self.next_every_n_iters(start, args.block) if stage == 'after_train_iter' else None

        def before_run(self, trainer):
            turns.wait()

        def after_train_iter(self, trainer):
            turns.done()
            if trainer.iter + 1 < trainer.max_iters:
                turns.wait()

    for _ in range(args.runs):
        model = Loss(build())
        model.load_state_dict(initial)
        loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, drop_last=True)
        work_dir = tempfile.mkdtemp(prefix='hookloop-bench-')
        with open(os.devnull, 'w') as terminal:  # the terminal lines are written, to /dev/null
            stdout, sys.stdout = sys.stdout, terminal
            try:
                trainer = Trainer(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                  train_dataloader=loader, max_iters=args.iters // args.block * args.block,
                                  work_dir=work_dir, seed=0, device='cpu', log_level=args.log_level,
                                  **MODES[args.mode])
                with warnings.catch_warnings():  # loggers run after every other hook: this one comes before
                    warnings.simplefilter('ignore', HookOrderWarning)
                    trainer.register_hook(Token(), priority='LOWEST')
                    trainer.resolve_hooks()  # the defaults (loggers among them) join here
                trainer.train()
                trainer.close()
            finally:
                sys.stdout = stdout
        shutil.rmtree(work_dir, ignore_errors=True)
        yield turns.take_run()


def child(side, args, receive, send, results):
    import torch
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == 'thread' else time.perf_counter
    build, features, batch, _ = MODELS[args.model]
    data = make_data(features, batch, args.iters)
    torch.manual_seed(0)
    initial = Loss(build()).state_dict()
    turns = Turns(receive, send, clock)
    runs = (_plain_runs if side == 'plain' else _hookloop_runs)(args, turns, data, initial)
    results.send([run for run in runs])


def one_pair(args, hookloop_first):
    context = multiprocessing.get_context('spawn')  # fresh interpreters: nothing of this one's heap
    to_plain, plain_in = context.Pipe()
    to_hookloop, hookloop_in = context.Pipe()
    plain_results, plain_out = context.Pipe(duplex=False)
    hookloop_results, hookloop_out = context.Pipe(duplex=False)
    # each side receives on its own pipe and sends on the other's
    plain = context.Process(target=child, args=('plain', args, plain_in, to_hookloop, plain_out))
    hooked = context.Process(target=child, args=('hookloop', args, hookloop_in, to_plain, hookloop_out))
    plain.start()
    hooked.start()
    (to_hookloop if hookloop_first else to_plain).send(None)
    plain_runs, hookloop_runs = plain_results.recv(), hookloop_results.recv()
    for process in (plain, hooked):
        process.join()
    # the token goes around once more after the last block: drain it
    rows = []
    for number, (p, h) in enumerate(zip(plain_runs, hookloop_runs), 1):
        p, h = p[1:], h[1:]  # the first block of a run: set-up on both sides
        iterations = len(p) * args.block
        rows.append({'run': number, 'ratio': round(sum(s for s, _ in h) / sum(s for s, _ in p), 4),
                     'plain_ms': round(sum(s for s, _ in p) * 1e3 / iterations, 2),
                     'hookloop_ms': round(sum(s for s, _ in h) * 1e3 / iterations, 2),
                     'plain_faults': round(sum(f for _, f in p) / iterations),
                     'hookloop_faults': round(sum(f for _, f in h) / iterations)})
    return rows


def summary(rows, runs):
    """The medians the issue's budgets are written in: over every pair's run 1 (fresh), over runs
    2.. of a sweep."""
    chosen = [r for r in rows if r['run'] > 1] if runs > 1 else rows
    return {key: round(statistics.median(r[key] for r in chosen), 4)
            for key in ('ratio', 'plain_faults', 'hookloop_faults')}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--model', default='mlp', choices=sorted(MODELS))
    parser.add_argument('--runs', type=int, default=1, help='runs in each process (1: fresh; 7: a sweep)')
    parser.add_argument('--iters', type=int, default=70, help='iterations per run')
    parser.add_argument('--block', type=int, default=7, help='iterations of one loop before the token passes')
    parser.add_argument('--pairs', type=int, default=1, help='pairs of processes, one after the other')
    parser.add_argument('--mode', default='default', choices=('default', 'ema'),
                        help="default hooks; or EMAHook(interval=1) against the plain loop's _foreach_lerp_ EMA")
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--log-level', default='INFO')
    parser.add_argument('--clock', choices=('wall', 'thread'), default='wall')
    args = parser.parse_args(argv)
    if args.iters < 2 * args.block:
        parser.error('--iters must hold at least two blocks (the first one is left out)')
    rows = []
    for pair in range(args.pairs):
        for row in one_pair(args, hookloop_first=pair % 2 == 1):
            row['pair'] = pair + 1
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps(dict(summary(rows, args.runs), model=args.model, runs=args.runs, pairs=args.pairs,
                          iters=args.iters, block=args.block, mode=args.mode, clock=args.clock,
                          load=round(os.getloadavg()[0], 1))), flush=True)


if __name__ == '__main__':
    main()
