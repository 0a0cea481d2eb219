"""The long fuzz campaign: ``python -m tests.fuzzing.campaign --inputs N``.

Engines:

- ``random`` (the default): N inputs from a seeded ``random.Random``: two fifths
  ``records.fuzz_record`` (mostly mutated signed CloudEvents records, a tenth raw bytes),
  a fifth each ``webhooks.as_record`` (forwarded plain webhooks, mutated),
  ``webhooks.fuzz_request`` (HTTP requests through the ingress's translation) and
  ``callbacks.fuzz_callback`` (callback requests through the ingress's reading). Input
  ``i`` has its own seed derived from ``--seed`` and ``i``, so ``--replay i`` regenerates
  exactly that input.
- ``atheris``: the same generator reading its decisions from libFuzzer's bytes
  (``FuzzedDataProvider``), with the gate and the quarantine encoding instrumented for
  coverage, for ``-runs=N``. Needs ``pip install atheris``.

A finding prints the input as Python source (bytes reprs) and the exception, and the exit
status is 1. The last line is ``fuzz: N inputs, K crashes, <seconds>s, <inputs/s>``.
"""

from __future__ import annotations

import argparse
import importlib
import random
import sys
import tempfile
import time
import traceback
from types import ModuleType

from tests.fuzzing.callbacks import CallbackCall, fuzz_callback
from tests.fuzzing.choosers import Chooser, ProviderChooser, RandomChooser
from tests.fuzzing.records import Record, fuzz_record
from tests.fuzzing.webhooks import Request, as_record, fuzz_request

PROGRESS_EVERY = 100_000

# What the atheris engine instruments: the gate and what it calls, and the row encoding.
_INSTRUMENTED = [
    "matcher.auth",
    "matcher.domain.events",
    "matcher.ingress.requests",
    "matcher.ingress.callbacks",
    "matcher.domain.quarantine",
]
Input = Record | Request | CallbackCall


def _target() -> ModuleType:
    # Imported late so that the atheris engine can import it under instrumentation.
    return importlib.import_module("tests.fuzzing.target")


def fuzz_input(c: Chooser) -> Input:
    kind = c.integer(0, 4)
    if kind <= 1:
        return fuzz_record(c)
    if kind == 4:
        return fuzz_callback(c)
    return as_record(c) if kind == 2 else fuzz_request(c)


def generate(seed: int, index: int) -> Input:
    """Input ``index`` of the campaign with ``seed``: independent of every other input."""
    return fuzz_input(RandomChooser(random.Random(f"{seed}:{index}")))


def check(found: Input) -> None:
    target = _target()
    if isinstance(found, CallbackCall):
        target.check_callback(found)
    elif isinstance(found, Request):
        target.check_request(found)
    else:
        target.check_record(found.key, found.headers, found.value)


def show(found: Input) -> str:
    target = _target()
    if isinstance(found, CallbackCall):
        return str(target.callback_reproducer(found))
    if isinstance(found, Request):
        return str(target.request_reproducer(found))
    return str(target.reproducer(found.key, found.headers, found.value))


def report(index: int | None, found: Input, exc: BaseException) -> None:
    where = "" if index is None else f" (input {index}; --replay {index} regenerates it)"
    print(f"finding{where}:", file=sys.stderr)
    print(show(found), file=sys.stderr)
    traceback.print_exception(exc, file=sys.stderr)


def summary(inputs: int, crashes: int, began: float) -> str:
    seconds = time.monotonic() - began
    return f"fuzz: {inputs} inputs, {crashes} crashes, {seconds:.1f}s, {inputs / seconds:.0f}/s"


def run_random(inputs: int, seed: int, max_findings: int) -> int:
    began = time.monotonic()
    crashes = done = 0
    for index in range(inputs):
        found = generate(seed, index)
        try:
            check(found)
        except Exception as exc:  # every exception, assertion or not, is a finding
            crashes += 1
            report(index, found, exc)
        done = index + 1
        if done % PROGRESS_EVERY == 0:
            print(summary(done, crashes, began), flush=True)
        if crashes >= max_findings:
            break
    print(summary(done, crashes, began), flush=True)
    return 1 if crashes else 0


def replay(seed: int, index: int) -> int:
    found = generate(seed, index)
    print(show(found))
    try:
        check(found)
    except Exception as exc:
        report(index, found, exc)
        return 1
    print("no finding")
    return 0


# libFuzzer starts with inputs of a few bytes and lengthens them slowly; the generator
# needs a few hundred bytes of decisions to build a signed record, so start long. Crash
# files go to the temporary directory, not into the work tree.
_LIBFUZZER_DEFAULTS = [
    "-max_len=8192",
    "-len_control=0",
    f"-artifact_prefix={tempfile.gettempdir()}/matcher-fuzz-",
]


def run_atheris(inputs: int, seed: int, extra: list[str]) -> int:
    try:
        atheris = importlib.import_module("atheris")
    except ImportError:
        print("the atheris engine needs `pip install atheris`", file=sys.stderr)
        return 2
    with atheris.instrument_imports(include=_INSTRUMENTED):
        _target()
    began = time.monotonic()
    done = 0

    def one_input(data: bytes) -> None:
        nonlocal done
        done += 1
        found = fuzz_input(ProviderChooser(atheris.FuzzedDataProvider(data)))
        try:
            check(found)
        except Exception as exc:
            report(None, found, exc)
            print(summary(done, 1, began), flush=True)
            raise  # libFuzzer saves the input as crash-<sha1> and exits
        if done == inputs:  # atheris.Fuzz() exits the process after the last run
            print(summary(done, 0, began), flush=True)

    flags = [f"-runs={inputs}", f"-seed={seed}", *_LIBFUZZER_DEFAULTS, *extra]
    atheris.Setup([sys.argv[0], *flags], one_input)
    atheris.Fuzz()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzzing.campaign", description=__doc__)
    parser.add_argument("--inputs", type=int, default=1_000_000, help="inputs (atheris: -runs)")
    parser.add_argument("--engine", choices=("random", "atheris"), default="random")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--max-findings", type=int, default=1, help="random engine: stop after this many"
    )
    parser.add_argument("--replay", type=int, default=None, help="random engine: one input")
    parser.add_argument("libfuzzer", nargs="*", help="atheris: more libFuzzer flags, after --")
    args = parser.parse_args(argv)
    if args.replay is not None:
        return replay(args.seed, args.replay)
    if args.engine == "atheris":
        return run_atheris(args.inputs, args.seed, args.libfuzzer)
    return run_random(args.inputs, args.seed, args.max_findings)


if __name__ == "__main__":
    sys.exit(main())
