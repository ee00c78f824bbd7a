"""``mq migrate``'s argument checks that need no broker: options that exclude each other, and
``--to-config-file`` read before anything connects (``mq.client.kafka.config.read_properties``,
whose own tests are the Kafka backend's)."""

from __future__ import annotations

from mq.cli.main import main


def test_group_and_no_groups_exclude_each_other(capsys):
    assert main(["migrate", "--to", "127.0.0.1:1", "--group", "g", "--no-groups"]) == 2
    assert capsys.readouterr().err == ("mq: error: --group and --no-groups exclude each "
                                       "other (see 'mq migrate --help')\n")


def test_a_bad_properties_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "client.properties"
    path.write_text("security.protocol=SSL\njust words\n")
    assert main(["migrate", "--to", "127.0.0.1:1", "--to-config-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mq: error: ") and err.count("\n") == 1
    assert "client.properties:2: not a key=value line" in err


def test_a_missing_properties_file_is_one_line(tmp_path, capsys):
    assert main(["migrate", "--to", "127.0.0.1:1", "--to-config-file",
                 str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mq: error: ") and err.count("\n") == 1 and "none" in err
