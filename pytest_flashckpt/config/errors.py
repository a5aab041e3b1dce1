"""The one error type for bad configuration: it names the file, the key path and what would be valid."""


class ConfigError(ValueError):
    """A model card, suite file, option or scenario that cannot be used as written."""

    def __init__(self, where: str, problem: str, fix: str = "") -> None:
        self.where = where
        self.problem = problem
        self.fix = fix
        message = f"{where}: {problem}" if where else problem
        if fix:
            message += f" ({fix})"
        super().__init__(message)


class InputError(Exception):
    """A command-line input (a results file, a checkpoint path, a value) could not be used; the message names it.
    The ``flashckpt`` command prints it and exits with status 2, as argparse does for its own errors."""
