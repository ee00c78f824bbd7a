"""Where a broker and its clients meet by default: the data dir and the socket path
(``docs/api.md``, "Finding the broker").

Both sides resolve them the same way, so a client started with no options finds a broker
started with none: ``$MQ_SOCKET``, else ``<data-dir>/mq.sock``, where the data dir is
``$MQ_DATA_DIR``, else ``$XDG_STATE_HOME/mq``, else ``~/.local/state/mq``.

A Unix socket path is at most ``MAX_SOCKET_PATH_BYTES`` bytes: Linux's ``sun_path`` holds 108
bytes with the terminating NUL. Both sides check it first (``check_socket_path``), so a long
path is a message that says so, not ``AF_UNIX path too long`` from deep in a bind or connect.
"""

from __future__ import annotations

import argparse
import os
from typing import Final

__all__ = ["MAX_SOCKET_PATH_BYTES", "check_socket_path", "default_data_dir",
           "default_socket_path", "path_argument"]

MAX_SOCKET_PATH_BYTES: Final = 107


def default_data_dir() -> str:
    """``$MQ_DATA_DIR``, else ``$XDG_STATE_HOME/mq``, else ``~/.local/state/mq``."""
    if os.environ.get("MQ_DATA_DIR"):
        return os.environ["MQ_DATA_DIR"]
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"),
                                                             ".local", "state")
    return os.path.join(state, "mq")


def default_socket_path(data_dir: str | None = None) -> str:
    """``$MQ_SOCKET``, else ``<data-dir>/mq.sock``."""
    if os.environ.get("MQ_SOCKET"):
        return os.environ["MQ_SOCKET"]
    return os.path.join(data_dir or default_data_dir(), "mq.sock")


def path_argument(text: str) -> str:
    """argparse ``type=`` for ``--data-dir`` and ``--socket``: an empty path is an error,
    never "here" nor "the default" (``mq broker --data-dir ""`` once adopted the current
    directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names nothing: give a path, or leave "
                                         "the option out for the default")
    return text


def check_socket_path(path: str) -> str:
    """``path`` if a Unix socket can have it. Raises ``ValueError`` naming the path and its
    length when it has more than ``MAX_SOCKET_PATH_BYTES`` bytes."""
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH_BYTES:
        raise ValueError(f"socket path {path} is {size} bytes, more than the "
                         f"{MAX_SOCKET_PATH_BYTES} a Unix socket path can have")
    return path
