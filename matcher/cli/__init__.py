"""The ``matcher`` command line: the daemon, the ingress, migrations, and inspection, one
module per verb group (``matcher.cli.main`` assembles them).

Every expected failure is one line on stderr, ``matcher: ...``, and one of the exit codes of
``matcher.cli.output`` (docs/reference/exit-codes.md); every option can also come from the
environment, ``MATCHER_<COMMAND>_<OPTION>`` (``matcher waits list --job-id`` is
``MATCHER_WAITS_LIST_JOB_ID``); ``--help`` shows each one.
"""

from collections.abc import Sequence


def main(args: Sequence[str] | None = None) -> None:
    """The ``matcher`` command (the console script's entry point)."""
    from matcher.cli.main import main as run  # the verbs, when the command runs

    run(args)
