"""The one error type for bad configuration: it names the file, the scenario, the key path and what would be valid:
``suites/x.yaml: scenario 'foo': model.card: unknown model card 'gpt5-huge' (valid names: ...)``."""

from __future__ import annotations


class ConfigError(ValueError):
    """A model card, suite file, option or scenario that cannot be used as written."""

    def __init__(self, where: str, problem: str, fix: str = "", *, scenario: str | None = None, key: str | None = None) -> None:
        self.where = where  # the file (relative to the current folder when below it), or the option
        self.problem = problem
        self.fix = fix
        self.scenario = scenario  # the scenario's name, when the problem is in one
        self.key = key  # the key path inside the scenario or file (``model.card``, ``activation.k``)
        parts = [where] if where else []
        if scenario is not None:
            parts.append(f"scenario {scenario!r}")
        if key:
            parts.append(key)
        message = ": ".join([*parts, problem])
        if fix:
            message += f" ({fix})"
        super().__init__(message)

    def within(self, where: str, scenario: str | None = None, key: str | None = None) -> "ConfigError":
        """The same problem, placed: in file ``where``, scenario ``scenario``, under key ``key`` (a problem that
        already names its own file, such as a model card's, keeps that file in its text)."""
        problem = f"{self.where}: {self.problem}" if self.where and self.where != where else self.problem
        inner = ".".join(k for k in (key, self.key) if k) or None
        return ConfigError(where, problem, self.fix, scenario=scenario if scenario is not None else self.scenario, key=inner)


class InputError(Exception):
    """A command-line input (a results file, a checkpoint path, a value) could not be used; the message names it.
    The ``flashckpt`` command prints it and exits with status 2, as argparse does for its own errors."""
