"""The sans-IO protocol module: framing, commands, keys and replies, with no socket."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerq.server import protocol as p


def parse_all(*chunks: bytes, **kwargs: int) -> list[p.Command]:
    parser = p.Parser(**kwargs)
    out: list[p.Command] = []
    for chunk in chunks:
        parser.feed(chunk)
        while (command := parser.next_command()) is not None:
            out.append(command)
    return out


# ---------------------------------------------------------------------- commands


def test_set_with_its_data_block() -> None:
    assert parse_all(b"set jobs 7 0 5\r\nhello\r\n") == [p.Set(b"jobs", 7, 0, b"hello")]


def test_set_noreply_and_lf_only_line_endings() -> None:
    assert parse_all(b"set q 0 -1 2 noreply\nhi\r\n") == [p.Set(b"q", 0, -1, b"hi", True)]


def test_data_block_may_contain_crlf_and_be_empty() -> None:
    assert parse_all(b"set q 0 0 4\r\n\r\n\r\n\r\nset q 0 0 0\r\n\r\n") == [
        p.Set(b"q", 0, 0, b"\r\n\r\n"),
        p.Set(b"q", 0, 0, b""),
    ]


def test_get_forms() -> None:
    assert parse_all(b"get a b/open c+r/t=5\r\ngets q\r\nGET q\r\n") == [
        p.Get((b"a", b"b/open", b"c+r/t=5")),
        p.Get((b"q",), with_cas=True),
        p.Get((b"q",)),
    ]


@pytest.mark.parametrize(
    ("line", "command"),
    [
        (b"delete q", p.Delete(b"q")),
        (b"delete q noreply", p.Delete(b"q", True)),
        (b"delete q 0", p.Delete(b"q")),
        (b"delete q 0 noreply", p.Delete(b"q", True)),
        (b"flush q", p.Flush(b"q")),
        (b"flush q noreply", p.Flush(b"q", True)),
        (b"flush_all", p.FlushAll()),
        (b"flush_all 0", p.FlushAll(0)),
        (b"flush_all 10 noreply", p.FlushAll(10, True)),
        (b"flush_all noreply", p.FlushAll(0, True)),
        (b"version", p.Version()),
        (b"stats", p.Stats()),
        (b"stats items", p.Stats((b"items",))),
        (b"quit", p.Quit()),
        (b"shutdown", p.Shutdown()),
        (b"verbosity 1 noreply", p.Verbosity(True)),
        (b"confirm q 2", p.Confirm(b"q", 2)),
        (b"flush_expired q", p.FlushExpired(b"q")),
        (b"flush_all_expired", p.FlushAllExpired()),
        (b"dump_stats", p.DumpStats()),
        (b"dump_stats a b", p.DumpStats((b"a", b"b"))),
        (b"monitor q 5", p.Monitor(b"q", 5)),
        (b"monitor q 5 10", p.Monitor(b"q", 5, 10)),
    ],
)
def test_simple_commands(line: bytes, command: p.Command) -> None:
    assert parse_all(line + b"\r\n") == [command]


@pytest.mark.parametrize(
    ("data", "reply", "noreply"),
    [
        (b"\r\n", p.ERROR, False),
        (b"bogus\r\n", p.ERROR, False),
        (b"incr q 1 noreply\r\n", p.ERROR, True),
        (b"get\r\n", p.ERROR, False),
        (b"set q 0 0\r\n", p.client_error("bad command line format"), False),
        (b"set q 0 0 x\r\n", p.client_error("bad command line format"), False),
        (b"set q 0 0 -1\r\n", p.client_error("bad command line format"), False),
        (b"set q x 0 1\r\nz\r\n", p.client_error("bad command line format"), False),
        (b"set q 4294967296 0 1\r\nz\r\n", p.client_error("bad command line format"), False),
        (b"set q 0 soon 1\r\nz\r\n", p.client_error("bad command line format"), False),
        (b"set q 0 0 1 junk\r\nz\r\n", p.client_error("bad command line format"), False),
        (b"add q 0 0 1\r\nz\r\n", p.ERROR, False),
        (b"cas q 0 0 1 9 noreply\r\nz\r\n", p.ERROR, True),
        (b"ms q 2 T0\r\nzz\r\n", p.ERROR, False),
        (b"flush_all soon\r\n", p.client_error("bad command line format"), False),
    ],
)
def test_bad_lines_are_rejected_and_parsing_goes_on(
    data: bytes, reply: bytes, noreply: bool
) -> None:
    commands = parse_all(data + b"version\r\n")
    assert commands == [p.Reject(reply, noreply), p.Version()]


def test_usage_errors_carry_a_reason() -> None:
    for line in (b"delete", b"delete a b", b"flush", b"confirm q", b"confirm q x", b"monitor q"):
        (command,) = parse_all(line + b"\r\n")
        assert isinstance(command, p.Reject)
        assert command.reply.startswith(b"CLIENT_ERROR ")


def test_too_large_is_refused_before_the_data_arrives() -> None:
    parser = p.Parser(max_item_size=10)
    parser.feed(b"set q 0 0 11\r\n")
    assert parser.next_command() == p.Reject(p.TOO_LARGE)
    parser.feed(b"0123456789")
    assert parser.buffered == 0  # skipped as it streams in, never held
    parser.feed(b"a\r\nversion\r\n")
    assert parser.next_command() == p.Version()


def test_too_large_with_noreply_stays_silent() -> None:
    assert parse_all(b"set q 0 0 11 noreply\r\n01234567890\r\n", max_item_size=10) == [
        p.Reject(p.TOO_LARGE, True)
    ]


def test_exactly_the_limit_is_accepted() -> None:
    assert parse_all(b"set q 0 0 10\r\n0123456789\r\n", max_item_size=10) == [
        p.Set(b"q", 0, 0, b"0123456789")
    ]


def test_data_block_without_crlf_loses_the_framing() -> None:
    parser = p.Parser()
    parser.feed(b"set q 0 0 2\r\nabcdversion\r\n")
    assert parser.next_command() == p.Hangup(p.client_error("bad data chunk"))
    assert parser.is_broken
    parser.feed(b"version\r\n")
    assert parser.next_command() is None


def test_skipped_block_without_crlf_loses_the_framing() -> None:
    commands = parse_all(b"set q 0 0 3\r\nabcXYversion\r\n", max_item_size=2)
    assert commands == [p.Reject(p.TOO_LARGE), p.Hangup(p.client_error("bad data chunk"))]


def test_over_long_line_is_answered_and_skipped_without_buffering() -> None:
    parser = p.Parser(max_line_bytes=16)
    parser.feed(b"get " + b"x" * 40)
    assert parser.next_command() == p.Reject(p.client_error("line too long"))
    parser.feed(b"y" * 1000)
    assert parser.next_command() is None
    assert parser.buffered == 0
    parser.feed(b"z\r\nversion\r\n")
    assert parser.next_command() == p.Version()


def test_long_complete_line_is_rejected_too() -> None:
    assert parse_all(b"get " + b"x" * 40 + b"\r\nversion\r\n", max_line_bytes=16) == [
        p.Reject(p.client_error("line too long")),
        p.Version(),
    ]


def test_idle_and_buffered() -> None:
    parser = p.Parser()
    assert parser.is_idle
    parser.feed(b"set q 0 0 5\r\nhe")
    assert parser.next_command() is None
    assert not parser.is_idle
    parser.feed(b"llo\r\n")
    assert parser.next_command() == p.Set(b"q", 0, 0, b"hello")
    assert parser.is_idle


# ---------------------------------------------------------------------- hypothesis

queue_names = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:.-",
    min_size=1,
    max_size=20,
).filter(lambda s: s not in (".", ".."))
keys = st.builds(
    lambda name, opts: (name + "".join("/" + o for o in opts)).encode("ascii"),
    queue_names,
    st.lists(st.sampled_from(["open", "close", "abort", "peek", "t=100", "t=0"]), max_size=3),
)


@st.composite
def command_streams(draw: st.DrawFn) -> bytes:
    """A valid stream of requests, as a client would send it."""
    parts = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["set", "get", "other"]))
        key = draw(keys)
        eol = draw(st.sampled_from([b"\r\n", b"\n"]))
        if kind == "set":
            data = draw(st.binary(max_size=64))
            flags = draw(st.integers(0, p.MAX_FLAGS))
            exptime = draw(st.integers(-5, 2_000_000_000))
            noreply = b" noreply" if draw(st.booleans()) else b""
            parts.append(
                b"set %b %d %d %d%b%b%b\r\n" % (key, flags, exptime, len(data), noreply, eol, data)
            )
        elif kind == "get":
            more = draw(st.lists(keys, max_size=3))
            parts.append(b"get " + b" ".join([key, *more]) + eol)
        else:
            parts.append(
                draw(
                    st.sampled_from(
                        [b"version", b"stats", b"flush_all 0", b"delete " + key, b"quit"]
                    )
                )
                + eol
            )
    return b"".join(parts)


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    chunks, last = [], 0
    for point in points:
        chunks.append(data[last:point])
        last = point
    chunks.append(data[last:])
    return chunks


@settings(max_examples=300, deadline=None)
@given(command_streams(), st.lists(st.integers(0, 4000), max_size=20))
def test_any_split_of_a_stream_parses_identically(stream: bytes, cuts: list[int]) -> None:
    whole = parse_all(stream)
    assert whole, "a valid stream yields commands"
    assert not any(isinstance(c, (p.Reject, p.Hangup)) for c in whole)
    assert parse_all(*split_at(stream, cuts)) == whole
    assert parse_all(*[stream[i : i + 1] for i in range(len(stream))]) == whole


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=10), st.integers(1, 300))
def test_garbage_never_raises(chunks: list[bytes], max_item_size: int) -> None:
    parser = p.Parser(max_item_size=max_item_size, max_line_bytes=100)
    for chunk in chunks:
        parser.feed(chunk)
        for _ in range(10_000):
            command = parser.next_command()
            if command is None:
                break
            if isinstance(command, p.Reject):
                assert command.reply.endswith(b"\r\n")
                assert command.reply.split(b" ")[0].rstrip(b"\r\n") in (
                    b"ERROR",
                    b"CLIENT_ERROR",
                    b"SERVER_ERROR",
                )
        # Bounded: one line, one data block, and what was not parsed yet.
        assert parser.buffered <= sum(len(c) for c in chunks)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=40),
            st.sampled_from([b"set q 0 0 3\r\n", b"get q\r\n", b"\r\n", b"\n", b"noreply"]),
        ),
        max_size=20,
    )
)
def test_garbage_mixed_with_commands_never_raises(pieces: list[bytes]) -> None:
    parser = p.Parser(max_item_size=64, max_line_bytes=64)
    parser.feed(b"".join(pieces))
    while parser.next_command() is not None:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60))
def test_key_parsing_never_raises_anything_but_keyproblem(key: bytes) -> None:
    for parse in (p.parse_get_key, p.parse_set_key, p.parse_queue_key):
        try:
            parse(key)
        except p.KeyProblem:
            pass


# ---------------------------------------------------------------------- keys


def test_get_key_options() -> None:
    key = p.parse_get_key(b"jobs+audit/t=250/open")
    assert (key.queue, key.reader, key.timeout_ms, key.open) == ("jobs", "audit", 250, True)
    assert key.bare_key == b"jobs+audit"
    assert key.takes
    closing = p.parse_get_key(b"jobs/close")
    assert closing.close and not closing.takes
    both = p.parse_get_key(b"jobs/close/open")
    assert both.close and both.open and both.takes
    assert not p.parse_get_key(b"jobs/peek").takes
    assert p.parse_get_key(b"jobs/peek/close").close  # allowed, as Darner


@pytest.mark.parametrize(
    "key",
    [
        b"",
        b".",
        b"..",
        b"../etc",
        b"a/../b",
        b"/q",
        b"q//open",
        b"q/bogus",
        b"q/t=",
        b"q/t=-1",
        b"q/t=abc",
        b"q/peek/open",
        b"q/abort/open",
        b"q/abort/close",
        b"q/abort/peek",
        b"sp ace",
        b"q\\x",
        b"caf\xc3\xa9",
        b"q+",
        b"q+.hidden",
        b"q+a+b",
        b"a" * 201,
    ],
)
def test_bad_get_keys(key: bytes) -> None:
    with pytest.raises(p.KeyProblem):
        p.parse_get_key(key)


def test_queue_names() -> None:
    for good in ("jobs", "a.b", ".hidden", "x:y", "A-Z_0", "...", "a" * 200):
        assert p.is_valid_queue_name(good), good
    for bad in ("", ".", "..", "a/b", "a\\b", "a b", "ä", "a~b", "a+b", "a" * 201):
        assert not p.is_valid_queue_name(bad), bad


def test_set_keys() -> None:
    assert p.parse_set_key(b"jobs") == p.SetKey("jobs")
    assert p.parse_set_key(b"jobs/sync") == p.SetKey("jobs", sync=True)
    for bad in (b"jobs+r", b"jobs/open", b"..", b"a/b/c"):
        with pytest.raises(p.KeyProblem):
            p.parse_set_key(bad)


# ---------------------------------------------------------------------- replies


def test_value_block_and_lines() -> None:
    assert b"".join(p.value_block(b"q/open", 7, b"hi")) == b"VALUE q/open 7 2\r\nhi\r\n"
    assert b"".join(p.value_block(b"q", 0, b"", cas=42)) == b"VALUE q 0 0 42\r\n\r\n"
    assert p.stat_line("queue_q_items", 3) == b"STAT queue_q_items 3\r\n"
    assert p.version_line("1.2.3.dev4+g00") == b"VERSION 1.2.3\r\n"
    assert p.version_line("weird") == b"VERSION 0.0.0\r\n"
    assert p.client_error("bad\r\nthing\x00") == b"CLIENT_ERROR bad thing?\r\n"
    assert p.server_error("disk full") == b"SERVER_ERROR disk full\r\n"


def test_exptime_rules() -> None:
    now = 1_700_000_000.0
    assert p.exptime_to_ttl(0, now) is None
    assert p.exptime_to_ttl(60, now) == 60.0
    assert p.exptime_to_ttl(999_999, now) == 999_999.0
    assert p.exptime_to_ttl(1_700_000_100, now) == 100.0
    ttl = p.exptime_to_ttl(1_000_000, now)
    assert ttl is not None and ttl <= 0  # absolute, long past
    negative = p.exptime_to_ttl(-1, now)
    assert negative is not None and negative <= 0
