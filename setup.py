"""Builds the optional C extensions; all project metadata lives in pyproject.toml.

``optional=True``: without a C compiler the build of ``mq.log._crecords`` is skipped with a
warning and mq falls back to its pure-Python references (``mq/log/native.py``); without
``mq.protocol._futex`` (or off Linux) consumers sleep on their POSIX semaphore.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("mq.log._crecords", ["mq/log/_crecords.c", "mq/log/_cbatches.c",
                                      "mq/log/_cappend.c", "mq/log/_csend.c"],
                  depends=["mq/log/_crecords.h"], optional=True),
        Extension("mq.protocol._futex", ["mq/protocol/_futex.c"], optional=True),
    ],
)
