"""The exception tree: every error mq raises on purpose is an ``MQError`` defined in
``mq/errors.py``, and each Kafka error code has one class."""

from __future__ import annotations

import importlib
import inspect
import pickle
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


def test_every_broker_error_class_is_in_the_table_and_exported():
    defined = [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
               if issubclass(cls, errors.BrokerError) and cls is not errors.BrokerError]
    assert len(defined) == len(errors.ERRORS_BY_CODE)       # no two classes share a code
    assert set(defined) == set(errors.ERRORS_BY_CODE.values())
    assert {cls.__name__ for cls in defined} <= set(errors.__all__)
    assert all(isinstance(cls.retriable, bool) and cls.__doc__ for cls in defined)


def test_error_for_code_gives_the_class_of_a_known_code():
    err = errors.error_for_code(3, "no topic 't'")
    assert type(err) is errors.UnknownTopicOrPartitionError
    assert (err.code, err.message, err.retriable) == (3, "no topic 't'", False)
    assert errors.error_for_code(56).retriable


def test_an_unknown_code_is_kept_on_the_exception():
    err = errors.error_for_code(9999, "from a newer broker")
    assert isinstance(err, errors.UnknownServerError)
    assert (err.code, str(err)) == (9999, "from a newer broker")
    assert errors.error_for_code(9999).message == "error code 9999"
    assert errors.error_for_code(-1).code == errors.UnknownServerError.code == -1


def test_broker_errors_pickle_with_their_code():
    for err in (errors.error_for_code(9999, "x"), errors.InvalidRequestError("bad"),
                errors.UnknownServerError()):
        copy = pickle.loads(pickle.dumps(err))
        assert (type(copy), copy.code, copy.message) == (type(err), err.code, err.message)
