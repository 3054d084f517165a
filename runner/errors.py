"""The one exception type the CLI turns into a one-line message and exit code 2."""


class UserError(Exception):
    """Bad input from the user: a config value, a file, an override. Never a bug in is-study."""
