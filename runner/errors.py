"""The one exception type the CLI turns into a one-line message and exit code 2."""

# A message longer than this is cut in the middle: whatever a message quotes (runner.bounded.clip
# keeps each quoted value to ~200 characters), the line printed stays readable.
MESSAGE_LIMIT = 1000


def _bounded(message: str) -> str:
    if len(message) <= MESSAGE_LIMIT:
        return message
    left_out = len(message) - 800
    return f"{message[:600]} … [{left_out:,} characters left out] … {message[-200:]}"


class UserError(Exception):
    """Bad input from the user: a config value, a file, an override. Never a bug in is-study.
    The CLI prints it as one line and exits with `exit_code`."""

    exit_code = 2

    def __init__(self, message: object = "", *args: object):
        super().__init__(_bounded(message) if isinstance(message, str) else message, *args)


class StudyFailed(UserError):
    """A study stopped on purpose (e.g. `train.on_nonfinite=raise`): the input was fine, the
    experiment found what it was looking for. Exit code 1, like a failed check."""

    exit_code = 1
