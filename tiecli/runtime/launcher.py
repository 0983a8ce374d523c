# Used by `tiecli train --nproc N` (which starts the ranks) and by every rank torchrun starts.
"""Starting and stopping the ranks: --nproc's launcher, and how a signal becomes one clean stop.

`tiecli train --nproc N` runs torchrun's own launcher in its process (torchrun), which starts N
copies of `tiecli train` and acts as their agent. A stop signal to it reaches every rank; each rank
checkpoints after the same step (distributed.any_rank) and says what it kept, and the launcher's
exit code says how the ranks ended. The training itself, once the ranks run, is distributed.py's.
"""

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from tiecli.errors import Interrupted, TiecliError

SHUTDOWN_S = 300  # how long --nproc's launcher waits for the ranks to checkpoint after a signal


def launched() -> bool:
    """Whether torchrun (or another launcher setting its variables) started this process."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def run_rank(main: Callable[[], object]) -> NoReturn:
    """main() in a rank that torchrun started; then the process ends with os._exit, its output flushed.

    CI once saw a rank stopped by SIGUSR2 abort after everything was written ("terminate called without
    an active exception", SIGABRT; not reproduced here). The likely cause is interpreter shutdown racing
    gloo's threads, which outlive destroy_process_group: one that drops its last tensor after the
    interpreter began to finalize takes the GIL and is ended inside C++ (pytorch/pytorch#179291).
    Everything a rank writes is written by then: files atomically, streams flushed here.
    """
    try:
        main()
        code = 0
    except SystemExit as e:  # Typer ends every command with one; its code is an int, or None for 0
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def torchrun(nproc: int, args: list[str]) -> int:
    """Run `tiecli ARGS` on nproc local processes and wait; their exit code (130 after a stop).

    torchrun's own launcher (`torchrun --standalone`), called in this process, which then acts as
    its agent: Ctrl-C, SIGTERM or a cluster's SIGUSR2 here is handed to every rank, and the ranks
    stop after the same step; it waits SHUTDOWN_S for their checkpoint before it kills them. Its
    failure reports are left out: the ranks have said what went wrong. Like torchrun, it shares
    the CPU threads out among the ranks unless OMP_NUM_THREADS is set.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from tiecli.runtime.device import affinity

    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(affinity()) // nproc)))  # the allocation's cores
    config = launch_config(
        LaunchConfig,
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        signals_to_handle="SIGTERM,SIGUSR2",  # and SIGINT, below
        shutdown_timeout=SHUTDOWN_S,
    )
    said = Path(tempfile.mkdtemp(prefix="tiecli-ranks-")) / "stop-said"
    os.environ[STOP_SAID] = str(said)  # the ranks inherit it

    def interrupt(signum, frame):  # Ctrl-C reaches the ranks as SIGTERM: the same stop, but a rank still
        # starting Python ends silently rather than in a "Fatal Python error" with a KeyboardInterrupt traceback
        raise SignalException(f"Process {os.getpid()} got signal: SIGINT", sigval=signal.SIGTERM)

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        elastic_launch(config, sys.executable)("-m", "tiecli", *args)
    except SignalException:
        if said.exists():  # a rank caught the stop and said what it kept
            return 130
        # the ranks were still starting (imports, the process group): the signal ended them before
        # they could catch it, and before anything of the run was written
        raise stopped_while_starting() from None
    except ChildFailedError as e:
        return failed_ranks({rank: f.exitcode for rank, f in e.failures.items()}, nproc)
    finally:
        signal.signal(signal.SIGINT, previous)
        os.environ.pop(STOP_SAID, None)
        shutil.rmtree(said.parent, ignore_errors=True)
    return 0


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)  # what train.StopFlag turns into a clean stop
STOP_SAID = "TIECLI_STOP_SAID"  # under --nproc: the file a rank makes once it has said why it stopped (said_stop)


def said_stop() -> None:
    """Tell --nproc's launcher that this rank printed its stop line, so that it prints none of its own."""
    if os.environ.get(STOP_SAID):
        with contextlib.suppress(OSError):
            Path(os.environ[STOP_SAID]).touch()


def stop_with_launcher() -> None:
    """SIGTERM to this rank when its launcher (torchrun's agent, or --nproc's process) dies, even by
    kill -9: the rank then checkpoints and stops like any stopped run rather than train on as an
    orphan that holds the run's lock. A watching thread, not PR_SET_PDEATHSIG, which fires when the
    agent's thread that started the rank ends, not the agent."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="tiecli-launcher-watch", daemon=True).start()


def stopped_while_starting() -> Interrupted:
    return Interrupted("interrupted before the run started; nothing was written")


def failed_ranks(codes: dict[int, int], nproc: int) -> int:
    """The exit code of `--nproc` when ranks failed (codes: each failed rank's; -N: ended by signal N).

    A rank ended by a signal that is not a stop (SIGKILL, a crash) is the cause: the agent then stops
    the others with SIGTERM, and those show up here too, so it is named, and the exit is 128 + N. Else a
    rank's own exit code (it printed why); else the first rank ended by a stop signal, exit 130."""
    codes = dict(sorted(codes.items()))
    killed = next((rank for rank, code in codes.items() if code < 0 and -code not in STOP_SIGNALS), None)
    if killed is not None:
        raise killed_by_signal(killed, nproc, -codes[killed])
    code = next((code for code in codes.values() if code > 0), None)
    if code is None:  # every failed rank was ended by a stop signal, so none could say what happened
        first = next(iter(codes))
        raise killed_by_signal(first, nproc, -codes[first])
    return code


def killed_by_signal(rank: int, nproc: int, signum: int) -> TiecliError:
    """The one line for a rank that a signal ended before it could say anything: a stop signal that
    came while it was starting (imports, the process group, planning) or finishing, or a SIGKILL.
    Exit code 130 for a stop signal, as for any interrupted run; else 128 + the signal's number."""
    name = signal.Signals(signum).name if signum in signal.valid_signals() else f"signal {signum}"
    why = "kill -9 or the out-of-memory killer" if signum == signal.SIGKILL else "before it could catch it"
    line = (
        f"rank {rank} of {nproc} was ended by {name} ({why}); what the run had saved is kept: "
        "run the same command again, with --resume if the run exists"
    )
    if signum in STOP_SIGNALS:
        return Interrupted(line)
    error = TiecliError(line)
    error.exit_code = 128 + signum
    return error


def launch_config(cls: type, **wanted: Any) -> Any:
    """cls(**wanted) with only the fields this torch's LaunchConfig has (cls: that dataclass).

    LaunchConfig gains fields across releases: signals_to_handle (SIGUSR2 passed on to the ranks)
    came in torch 2.9, shutdown_timeout later; torch 2.4-2.8 would raise a TypeError on them. An
    older torch's agent then handles its own default signals (SIGTERM, SIGINT, SIGHUP, SIGQUIT)
    and stops the ranks after its own grace period.
    """
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{key: value for key, value in wanted.items() if key in known})
