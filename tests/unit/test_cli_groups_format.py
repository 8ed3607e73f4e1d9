"""``shmq consumer-groups`` without a broker: the tables against Kafka's text, written out in full
from the ``printf`` formats of ConsumerGroupCommand (Kafka 3.x/4.x, see the module docstring),
and the command-line checks of ConsumerGroupCommandOptions.checkArgs."""

from __future__ import annotations

import calendar

import pytest

from shmq.cli import CommandError, main
from shmq.cli.consumer_groups import (
    GroupStateRow,
    MemberRow,
    PartitionRow,
    assignment_text,
    format_delete_offsets,
    format_export,
    format_group_list,
    format_members,
    format_offsets,
    format_reset,
    format_state,
    parse_datetime,
    parse_duration_ms,
    parse_topic_partitions,
)

# --- --describe --offsets ----------------------------------------------------------------------


def test_offsets_table_is_kafkas_printf_layout() -> None:
    rows = [
        PartitionRow("g1", "events", 0, 90, 100, "consumer-1-abc", "/127.0.0.1", "consumer-1"),
        PartitionRow("g1", "events", 1, None, 7, "-", "-", "-"),
    ]
    assert format_offsets(rows) == (
        "\n"
        "GROUP           TOPIC           PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG        "
        "     CONSUMER-ID     HOST            CLIENT-ID\n"
        "g1              events          0          90              100             10         "
        "     consumer-1-abc  /127.0.0.1      consumer-1\n"
        "g1              events          1          -               7               -          "
        "     -               -               -\n")


def test_offsets_table_widens_to_the_longest_value() -> None:
    member = "rdkafka-0f6c4a52-3d0c-4e5e-9c1b-5a0d5b2c8e11"
    rows = [PartitionRow("a-rather-long-group", "t", 2, 5, 5, member, "/127.0.0.1", "rdkafka")]
    header, row = format_offsets(rows).splitlines()[1:]
    assert header.index("TOPIC") == len("a-rather-long-group") + 1
    assert row == ("a-rather-long-group t               2          5               5          "
                   "     0               " + member + " /127.0.0.1      rdkafka")


def test_offsets_table_verbose_has_the_leader_epoch() -> None:
    rows = [PartitionRow("g", "t", 0, 3, 4, "m", "/h", "c", leader_epoch=0)]
    assert format_offsets(rows, verbose=True).splitlines()[1:] == [
        "GROUP           TOPIC           PARTITION  LEADER-EPOCH    CURRENT-OFFSET  "
        "LOG-END-OFFSET  LAG             CONSUMER-ID     HOST            CLIENT-ID",
        "g               t               0          0               3               "
        "4               1               m               /h              c",
    ]


def test_lag_needs_both_offsets() -> None:
    assert PartitionRow("g", "t", 0, 3, 10, None, None, None).lag == 7
    assert PartitionRow("g", "t", 0, None, 10, None, None, None).lag is None
    assert PartitionRow("g", "t", 0, -1, 10, None, None, None).lag is None
    assert PartitionRow("g", "t", 0, 3, None, None, None, None).lag is None


# --- --describe --members / --state ------------------------------------------------------------


def test_members_table_ends_each_line_with_the_blank_after_partitions() -> None:
    rows = [MemberRow("g", "c-1", "/127.0.0.1", "c", "", (("t", 0), ("t", 1))),
            MemberRow("g", "c-2", "/127.0.0.1", "c", "", ())]
    assert format_members(rows) == (
        "\n"
        "GROUP           CONSUMER-ID     HOST            CLIENT-ID       #PARTITIONS    " " \n"
        "g               c-1             /127.0.0.1      c               2              " " \n"
        "g               c-2             /127.0.0.1      c               0              " " \n")


def test_members_verbose_and_static_members() -> None:
    rows = [MemberRow("g", "c-1", "/127.0.0.1", "c", "inst-1", (("b", 1), ("a", 0), ("b", 0))),
            MemberRow("g", "c-2", "/127.0.0.1", "c", "", ())]
    # Kafka 4.3: the KIP-848 columns, "-" for a classic member's epochs and target
    assert format_members(rows, verbose=True) == (
        "\n"
        "GROUP           CONSUMER-ID     GROUP-INSTANCE-ID HOST            CLIENT-ID       "
        "#PARTITIONS     CURRENT-EPOCH   CURRENT-ASSIGNMENT   TARGET-EPOCH    TARGET-ASSIGNMENT   \n"
        "g               c-1             inst-1            /127.0.0.1      c               "
        "3               -               a:0;b:0,1            -               -                   \n"
        "g               c-2                               /127.0.0.1      c               "
        "0               -               -                    -               -                   \n")
    assert format_members([]) == (  # printed even for a group without members
        "\nGROUP           CONSUMER-ID     HOST            CLIENT-ID       #PARTITIONS     \n")
    assert assignment_text([]) == "-"


def test_state_table() -> None:
    row = GroupStateRow("g1", "127.0.0.1:9092  (0)", "range", "Stable", 2)
    assert format_state(row) == (
        "\n"
        "GROUP           COORDINATOR (ID)          ASSIGNMENT-STRATEGY  STATE                "
        "#MEMBERS\n"
        "g1              127.0.0.1:9092  (0)       range                Stable               2\n")
    empty = GroupStateRow("g1", "127.0.0.1:9092  (0)", "", "Empty", 0)
    assert format_state(empty).splitlines()[2].split() == [
        "g1", "127.0.0.1:9092", "(0)", "-", "Empty", "0"]


# --- --list, --reset-offsets, --delete-offsets -------------------------------------------------


def test_group_list_with_state_and_type() -> None:
    listings = [("g1", "Classic", "Stable"), ("g2", "Classic", "Empty")]
    assert format_group_list(listings, with_type=False, with_state=True) == (
        "GROUP                     STATE               \n"
        "g1                        Stable              \n"
        "g2                        Empty               \n")
    assert format_group_list(listings, with_type=True, with_state=True).splitlines()[0] == (
        "GROUP                     TYPE                 STATE               ")
    assert format_group_list([], with_type=False, with_state=True) == (
        "GROUP                     STATE               \n")


def test_reset_table_and_export() -> None:
    plan = {"g": {("t", 1): 5, ("t", 0): 3}}
    assert format_reset(plan) == (  # Kafka 4.3's OffsetsUtils.printOffsetsToReset
        "\n"
        "GROUP           TOPIC           PARTITION  NEW-OFFSET\n"
        "g               t               0          3\n"
        "g               t               1          5\n")
    assert format_reset({}) == "\n"
    assert format_reset({"g": {}}) == "\nGROUP           TOPIC           PARTITION  NEW-OFFSET\n"
    assert format_export(plan, single_group=True) == "t,0,3\nt,1,5\n\n"
    assert format_export(plan, single_group=False) == "g,t,0,3\ng,t,1,5\n\n"


def test_delete_offsets_table() -> None:
    results = {("t", 0): None, ("t", 10): None, ("t", 2): "The group is not empty.",
               ("gone", -1): "This server does not host this topic-partition."}
    assert format_delete_offsets(results) == (
        "\n"
        "TOPIC           PARTITION  STATUS         \n"
        "gone            -          Error: This server does not host this topic-partition.\n"
        "t               0          Successful     \n"
        "t               10         Successful     \n"  # Kafka sorts by topic + partition text
        "t               2          Error: The group is not empty.\n")


# --- values ------------------------------------------------------------------------------------


def test_datetime_like_kafka_utils_get_date_time() -> None:
    utc = calendar.timegm((2024, 1, 2, 3, 4, 5)) * 1000
    assert parse_datetime("2024-01-02T03:04:05.678") == utc + 678
    assert parse_datetime("2024-01-02T03:04:05.678Z") == utc + 678
    assert parse_datetime("2024-01-02T05:04:05.000+02:00") == utc
    assert parse_datetime("2024-01-02T05:04:05.000+0200") == utc
    assert parse_datetime("2024-01-02T01:04:05.000-02") == utc
    for bad in ("2024-01-02", "2024-01-02T", "2024-01-02T03:04:05", "yesterday",
                "2024-02-30T00:00:00.000"):
        with pytest.raises(CommandError):
            parse_datetime(bad)


def test_duration_like_java_time_duration() -> None:
    assert parse_duration_ms("PT1H30M") == 5_400_000
    assert parse_duration_ms("P1DT2S") == 86_402_000
    assert parse_duration_ms("PT0.5S") == 500
    assert parse_duration_ms("pt10m") == 600_000
    assert parse_duration_ms("-PT1M") == -60_000
    for bad in ("1h", "P", "PT", "P1H", "PT1.5H"):
        with pytest.raises(CommandError):
            parse_duration_ms(bad)


def test_topic_partitions_arg() -> None:
    assert parse_topic_partitions("events:0,2") == [("events", 0), ("events", 2)]
    for bad in ("events:", "a:b:c", "events:x", "events:1,,2"):
        with pytest.raises(Exception, match="Invalid"):
            parse_topic_partitions(bad)


# --- the command line --------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "message"), [
    ([], "Command must include exactly one action: --list, --describe, --delete, "
         "--reset-offsets, --delete-offsets"),
    (["--list", "--describe"], "Command must include exactly one action"),
    (["--describe"], "Option [describe] takes one of these options: [group], [all-groups]"),
    (["--describe", "--group", "g", "--all-groups"],
     'Option "[group]" can\'t be used with option "[all-groups]"'),
    (["--describe", "--group", "g", "--members", "--offsets"],
     "Option [describe] takes at most one of these options: [members], [offsets], [state]"),
    (["--describe", "--group", "g", "--state", "stable"],
     "Option [describe] does not take a value for [state]"),
    (["--describe", "--group", "g", "--topic", "t"],
     'Option "[topic]" can\'t be used with option "[describe]"'),
    (["--list", "--group", "g"], 'Option "[group]" can\'t be used with option "[list]"'),
    (["--list", "--members"],
     "Option(s) [members] are unavailable given other options on the command line"),
    (["--list", "--state", "sleepy"],
     "Invalid state list 'sleepy'. Valid states are: PreparingRebalance, CompletingRebalance, "
     "Stable, Dead, Empty, Assigning, Reconciling"),
    (["--list", "--type", "share"],
     "Invalid types list 'share'. Valid types are: Classic, Consumer"),
    (["--delete"], "Option [delete] takes one of these options: [group], [all-groups]"),
    (["--delete", "--group", "g", "--topic", "t"],
     "The consumer does not support topic-specific offset deletion from a consumer group."),
    (["--delete-offsets", "--group", "g"],
     "Option [delete-offsets] takes the following options: [group], [topic]"),
    (["--reset-offsets", "--group", "g", "--to-earliest"],
     "One of the reset scopes should be defined: --all-topics, --topic."),
    (["--reset-offsets", "--to-earliest", "--all-topics"],
     "Option [reset-offsets] takes one of these options: [group], [all-groups]"),
    (["--reset-offsets", "--group", "g", "--all-topics"],
     "Option [reset-offsets] requires one of the following scenarios: [to-offset], "
     "[shift-by], [to-datetime], [by-duration], [to-earliest], [to-latest], [to-current], "
     "[from-file]"),
    (["--reset-offsets", "--group", "g", "--all-topics", "--to-earliest", "--to-offset", "3"],
     'Option "[to-offset]" can\'t be used with option "[to-earliest]"'),
    (["--reset-offsets", "--group", "g", "--all-topics", "--to-earliest", "--dry-run",
      "--execute"], "Option [reset-offsets] only accepts one of [execute] and [dry-run]"),
    (["--reset-offsets", "--group", "g", "--all-topics", "--to-offset", "ten"],
     "Cannot parse argument 'ten' of option to-offset"),
    (["--reset-offsets", "--group", "g", "--all-topics", "--shift-by", "1.5"],
     "Cannot parse argument '1.5' of option shift-by"),
    (["--reset-offsets", "--group", "g", "--topic", "t:x", "--to-latest"],
     "Invalid partition 'x' specified in topic arg 't:x'"),
    (["--describe", "--group", "g", "--to-earliest"],
     'Option "[to-earliest]" can\'t be used with option "[describe]"'),
    (["--describe", "--group", "g", "--timeout", "soon"],
     "Cannot parse argument 'soon' of option timeout"),
])
def test_bad_command_lines_are_one_line_and_exit_2(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    # No broker is contacted: the checks come first, so no --bootstrap-server is needed.
    assert main(["consumer-groups", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and message in err, err
    assert err.startswith("shmq consumer-groups: error: ")


def test_bad_datetime_and_duration_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["consumer-groups", "--reset-offsets", "--group", "g", "--all-topics",
            "--bootstrap-server", "127.0.0.1:1"]
    assert main([*base, "--to-datetime", "2024-01-01"]) == 1
    assert capsys.readouterr().err == (
        "Error: Executing consumer group command failed due to Error parsing timestamp. It does "
        "not contain a 'T' according to ISO8601 format\n")
    assert main([*base, "--by-duration", "1h"]) == 1
    assert capsys.readouterr().err == (
        "Error: Executing consumer group command failed due to Text cannot be parsed to a "
        "Duration\n")
