"""``mq migrate``'s argument checks that need no broker: the properties file of
``--to-config-file`` and options that exclude each other."""

from __future__ import annotations

import pytest

from mq.cli.main import main
from mq.cli.migrate import read_properties


def test_read_properties_takes_javas_key_value_lines(tmp_path):
    path = tmp_path / "client.properties"
    path.write_text("# SASL\n! also a comment\n\nsecurity.protocol=SASL_SSL\n"
                    "sasl.mechanism : SCRAM-SHA-512\nsasl.password=a=b:c\n")
    assert read_properties(str(path)) == {"security.protocol": "SASL_SSL",
                                          "sasl.mechanism": "SCRAM-SHA-512",
                                          "sasl.password": "a=b:c"}


def test_read_properties_names_a_bad_line(tmp_path):
    path = tmp_path / "client.properties"
    path.write_text("security.protocol=SSL\njust words\n")
    with pytest.raises(ValueError, match=r"client.properties:2: expected key=value"):
        read_properties(str(path))


def test_group_and_no_groups_exclude_each_other(capsys):
    assert main(["migrate", "--to", "127.0.0.1:1", "--group", "g", "--no-groups"]) == 2
    assert capsys.readouterr().err == ("mq: error: --group and --no-groups exclude each "
                                       "other (see 'mq migrate --help')\n")


def test_a_missing_properties_file_is_one_line(tmp_path, capsys):
    assert main(["migrate", "--to", "127.0.0.1:1", "--to-config-file",
                 str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mq: error: ") and err.count("\n") == 1 and "none" in err
