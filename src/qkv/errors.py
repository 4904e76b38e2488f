"""The ground floor: the errors that mean "bad input", which the command line turns into
one line on stderr and exit code 2.

:class:`UserError` is the base; each domain error subclasses it and keeps the built-in
type it has always been (``ValueError``, ``RuntimeError`` or ``OSError``), so code that
catches those still does. A message names what is wrong and where (file, key, line).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CheckpointError",
    "ConfigError",
    "ConfigFieldError",
    "CorpusError",
    "DeviceError",
    "DownloadError",
    "ImageError",
    "LaunchError",
    "ModelFileError",
    "OutputFolderError",
    "SearchError",
    "UserError",
]


class UserError(Exception):
    """Bad input from the user (config, corpus, checkpoint, arguments): exit code 2."""


class ConfigError(UserError, ValueError):
    """A config that cannot be used; the message names the key."""


class ConfigFieldError(UserError, ValueError):
    """An impossible value of one field of a model config: ``field``, ``value`` and ``why``
    it is refused (the command line names the field by its YAML key)."""

    def __init__(self, config: str, field: str, value: Any, why: str):
        super().__init__(f"{config}.{field} = {value!r}: {why}")
        self.field, self.value, self.why = field, value, why


class CorpusError(UserError, ValueError):
    """A corpus that cannot be used as it is; the message is one line naming file and line."""


class CheckpointError(UserError, ValueError):
    """A file that is not a readable qkv checkpoint (the message names the file)."""


class ModelFileError(UserError, ValueError):
    """A pretrained model file (a GGUF file, ...) that cannot be read, or of an architecture
    qkv does not run; the message names the file and what is wrong."""


class ImageError(UserError, ValueError):
    """An image file that cannot be used as a model's input (not a PNG, undecodable, a size
    or shape the model cannot take, one flat grey); the message names the file."""


class SearchError(UserError, ValueError):
    """Search settings that cannot be used (beam, n-best, batch size), or a search larger
    than the free memory; the message names the settings to change."""


class DownloadError(UserError, RuntimeError):
    """A download failed (network, server or checksum); the message is one line."""


class DeviceError(UserError, ValueError):
    """The asked-for device is not on this machine."""


class LaunchError(UserError, ValueError):
    """The environment promises a data-parallel run that torchrun did not start."""


class OutputFolderError(UserError, OSError):
    """An output folder cannot be written (raised before the work that would fill it)."""
