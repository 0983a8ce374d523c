"""User-facing errors: the CLI prints their message on one line, without a traceback."""


class TiecliError(Exception):
    """Something the user can fix (a bad path, a corrupt file, a refused name). Exit code 1."""

    exit_code = 1


class ConfigError(TiecliError):
    """A bad override, key or group choice. Exit code 2, like any other usage error."""

    exit_code = 2


class Interrupted(TiecliError):
    """The run stopped on request (Ctrl-C, SIGTERM, a cluster's time limit), having saved what it had.
    Exit code 130, as a shell gives a process that Ctrl-C ended; the CLI prints it as what happened, not as an error."""

    exit_code = 130


class AlreadyComplete(TiecliError):
    """`tiecli train --resume` of a completed run that the overrides do not extend: nothing to do.
    Exit code 0; the CLI prints the line on stdout as what happened, not as an error."""

    exit_code = 0
