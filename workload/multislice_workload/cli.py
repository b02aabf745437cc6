"""Command line: ``python -m multislice_workload {shardings,train,prepare,compile} [flags]``.

Maps every outcome to the exit codes of `exitcodes` and leaves the termination message
(`termination.py`) on each: configuration problems (bad environment, inconsistent variables, bad
flags) to 78 so the operator does not retry them, ``sys.exit(42)`` to a requested restart,
anything unexpected to a retryable code.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from multislice_workload import compile as tpu_compile
from multislice_workload import exitcodes, logs, prepare, runtime, shardings, termination, train
from multislice_workload.env import ConfigError, WorkloadEnv, from_environ

Mode = Callable[[WorkloadEnv, argparse.Namespace], int]
MODES: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Mode, str]] = {
    "shardings": (shardings.add_arguments, shardings.run, "sharding benchmark: TFLOP/s and MFU"),
    "train": (train.add_arguments, train.run, "train the transformer LM, resumable exactly"),
}
# Modes that run on one machine, outside any mesh: no environment contract, no JAX start-up.
OFFLINE: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[..., int], str]] = {
    "prepare": (prepare.add_arguments, prepare.run, "corpus -> tokenizer + ArrayRecord shards"),
    "compile": (tpu_compile.add_arguments, tpu_compile.run, "compile for a TPU topology, on CPU"),
}


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on a bad flag; the failure policy needs 78 (fatal, not retried)."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="multislice_workload", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--init_timeout",
        type=int,
        default=runtime.DEFAULT_INIT_TIMEOUT_S,
        help="seconds to wait for every process to join",
    )
    sub = parser.add_subparsers(dest="mode", required=True)
    for name, (add_arguments, _, help_text) in {**MODES, **OFFLINE}.items():
        add_arguments(sub.add_parser(name, help=help_text))
    return parser


def _local_device_count() -> int:
    """Chips of this host (standalone mode): JAX devices, less on TPU7x (2 devices per chip)."""
    import jax

    from multislice_workload.hardware import devices_per_chip

    local = jax.local_devices()
    return len(local) // devices_per_chip(local)


def run(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.mode in OFFLINE:
        return OFFLINE[args.mode][1](args)
    env = from_environ(os.environ, local_device_count=_local_device_count)
    logs.set_context(
        process=env.process_id,
        slice=env.slice_id,
        worker=env.worker_id,
        attempt=env.restart_attempt,
    )
    logs.emit("start", mode=args.mode, pid=os.getpid(), **env.summary())
    if env.parallelism.dcn_tensor > 1:
        logs.emit("warning", message="dcn_tensor > 1: tensor parallelism over DCN is slow")
    runtime.initialize(env, tpu=runtime.on_tpu(), init_timeout_s=args.init_timeout)
    return MODES[args.mode][1](env, args)


def main(argv: Sequence[str] | None = None) -> int:
    code, message = _outcome(argv)
    termination.write(code, message)
    logs.emit("exit", exit_code=code, reason=exitcodes.REASONS.get(code, "crash"))
    return code


def _outcome(argv: Sequence[str] | None) -> tuple[int, str]:
    try:
        code = run(argv)
    except ConfigError as err:
        logs.emit("config_error", message=str(err), exit_code=exitcodes.EXIT_CONFIG_ERROR)
        print(f"configuration error: {err}", file=sys.stderr)
        return exitcodes.EXIT_CONFIG_ERROR, str(err)
    except SystemExit as err:  # sys.exit(42) from the program asks for a restart
        code = err.code if isinstance(err.code, int) else exitcodes.EXIT_CRASH
        return code, f"exit {code}"
    except Exception as err:  # any crash must still map to a retryable exit code
        traceback.print_exc()
        logs.emit("crash", error=repr(err), exit_code=exitcodes.EXIT_CRASH)
        return exitcodes.EXIT_CRASH, repr(err)
    return code, _message(code)


def _message(code: int) -> str:
    step = termination.STATUS.step
    return f"{exitcodes.REASONS.get(code, 'exit')} at step {step}" if step else ""
