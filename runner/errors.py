"""The one exception type the CLI turns into a one-line message and exit code 2."""

import re

# Whatever a message quotes stays short (runner.bounded.clip keeps each quoted value to ~200
# characters where a message is built); as a last line of defence, a UserError cuts any run of
# characters without a space longer than TOKEN_LIMIT in the middle (an override value echoed by
# Hydra, a path: both ends stay readable), and a message longer than MESSAGE_LIMIT likewise.
TOKEN_LIMIT = 200
MESSAGE_LIMIT = 1000
_LONG_TOKEN = re.compile(rf"\S{{{TOKEN_LIMIT + 1},}}")


def _middle_cut(text: str, head: int, tail: int) -> str:
    return f"{text[:head]}…[{len(text) - head - tail:,} characters]…{text[-tail:]}"


def _bounded(message: str) -> str:
    message = _LONG_TOKEN.sub(lambda m: _middle_cut(m.group(), 120, 60), message)
    if len(message) > MESSAGE_LIMIT:
        message = _middle_cut(message, 600, 200)
    return message


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
