"""The one exception type the CLI turns into a one-line message and exit code 2."""


class UserError(Exception):
    """Bad input from the user: a config value, a file, an override. Never a bug in is-study.
    The CLI prints it as one line and exits with `exit_code`."""

    exit_code = 2


class StudyFailed(UserError):
    """A study stopped on purpose (e.g. `train.on_nonfinite=raise`): the input was fine, the
    experiment found what it was looking for. Exit code 1, like a failed check."""

    exit_code = 1
