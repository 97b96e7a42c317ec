"""moderato/scripts.py: the scripts as Redis gets them (includes spliced, comments stripped)."""

from __future__ import annotations

import hashlib

import pytest
from cluster import call
from redis_servers import RedisServer

from moderato.scripts import SCRIPT_NAMES, load_script, without_comments

# Every place a "--" or a bracket may stand without starting a comment, and
# comments in every place they may stand.
TRICKY = b"""--[==[ a header
with ]] inside ]==]
local a = 'it--is' -- a line comment with 'quotes" in it
local b = "x--[[y]]z"--[[ a block comment ]]local c = 1
local d = [[first line -- of a long string

   after an empty line]] -- ends here
local e = [=[ ]] -- not the end ]=]
local t = { [1] = 'k[' .. 'x' }
local f = 'escaped \\' -- quote' ..
  "and \\"--\\" too"
local g = 3 --[=[ spans
lines ]=] + 4

return { a, b, c, d, e, t[1], f, g }
"""


def test_comments_go_and_code_strings_and_long_strings_stay() -> None:
    assert without_comments(TRICKY) == (
        b"local a = 'it--is'\n"
        b'local b = "x--[[y]]z" local c = 1\n'
        b"local d = [[first line -- of a long string\n"
        b"\n"
        b"   after an empty line]]\n"
        b"local e = [=[ ]] -- not the end ]=]\n"
        b"local t = { [1] = 'k[' .. 'x' }\n"
        b"local f = 'escaped \\' -- quote' ..\n"
        b'  "and \\"--\\" too"\n'
        b"local g = 3   + 4\n"  # the comment, one space: it may part two tokens
        b"return { a, b, c, d, e, t[1], f, g }\n"
    )


def test_redis_runs_the_stripped_text_as_it_ran_the_original(redis_server: RedisServer) -> None:
    expected = [
        b"it--is",
        b"x--[[y]]z",
        1,
        b"first line -- of a long string\n\n   after an empty line",
        b" ]] -- not the end ",
        b"k[x",
        b'escaped \' -- quoteand "--" too',
        7,
    ]
    for source in (TRICKY, without_comments(TRICKY)):
        assert call(redis_server.port, "EVAL", source, 0) == expected


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_script_is_sent_without_comments_and_hashed_as_sent(name: str) -> None:
    script = load_script(name)
    assert script.sha == hashlib.sha1(script.source).hexdigest()
    assert without_comments(script.source) == script.source  # nothing left to strip
    assert b"\n\n" not in script.source and b" \n" not in script.source
