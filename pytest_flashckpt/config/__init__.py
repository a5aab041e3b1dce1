"""Typed configuration: model cards, scenarios and suite files, validated with errors that name the fix."""

from pytest_flashckpt.config.errors import ConfigError

__all__ = ["ConfigError"]
