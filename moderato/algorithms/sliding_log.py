"""The sliding log: every admission in a sorted set, with running totals
(lua/sliding_log.lua, csrc/store_sliding_log.c)."""

from __future__ import annotations

from .base import Algorithm

# A decision costs Redis about twice a counter's (a sorted set read and written): eight
# one-policy checks a batched call keep it near 100 µs, denials on one full log included
# (searched once a run); a denial on a log of its own each (its wait a search of ~log2 n
# reads) costs 5-8 admissions: no bound on checks reaches those (BENCHMARKS.md, "A batched
# call's bound with denials"). A repeat of the check before weighs a quarter, as other
# algorithms' do: a run reads the log once and adds its entries in one ZADD, so a check
# and 28 repeats on one key cost Redis about what eight checks on eight keys do, admitted
# or denied (BENCHMARKS.md, "Issue 30's targets, measured against the build it started
# from").
ALGORITHM = Algorithm(name="sliding_log", key_tag="sl", state_suffixes=(":log",), batch_parts=8)
