"""The exception tree: every error mq raises on purpose is an ``MQError`` defined in
``mq/errors.py``, and each Kafka error code has one class."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import mq
from mq import errors

# Defined elsewhere for now: the storage engine's checkpoint parser keeps its own class (to be
# moved to mq.errors), and the CLI's UsageError is argparse-level control flow, never raised
# out of ``mq``'s main().
ELSEWHERE = {"mq.cli.main.UsageError"}


def _exception_classes():
    for info in pkgutil.walk_packages(mq.__path__, "mq."):
        if info.name.endswith("__main__") or info.name.startswith("mq.log._"):
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == info.name:
                yield cls


def test_every_error_is_an_mq_error_from_mq_errors():
    found = {f"{cls.__module__}.{cls.__qualname__}" for cls in _exception_classes()}
    assert found, "no exception classes found"
    assert {name for name in found if not name.startswith("mq.errors.")} <= ELSEWHERE
    for cls in _exception_classes():
        if f"{cls.__module__}.{cls.__qualname__}" not in ELSEWHERE:
            assert issubclass(cls, errors.MQError), cls


def test_config_error_is_an_mq_error_and_a_value_error():
    assert issubclass(errors.ConfigError, errors.MQError)
    assert issubclass(errors.ConfigError, ValueError)


def test_one_class_per_error_code():
    codes = [cls.code for cls in errors.ERRORS_BY_CODE.values()]
    assert len(codes) == len(set(codes))
    assert all(errors.ERRORS_BY_CODE[cls.code] is cls for cls in errors.ERRORS_BY_CODE.values())
