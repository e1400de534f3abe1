"""The one formatter of sizes and percentages (oom_lsp.units) that every face prints with."""

from __future__ import annotations

from oom_lsp.units import format_bytes, format_percent, share, signed_bytes

KIB, MIB, GIB = 2**10, 2**20, 2**30


def test_sizes_in_binary_units_two_decimals_as_pytorch_prints_them():
    assert format_bytes(1536 * MIB) == "1.50 GiB"
    assert format_bytes(20 * MIB) == "20.00 MiB"
    assert format_bytes(512) == "512 bytes"
    assert format_bytes(-512) == "-512 bytes"
    assert format_bytes(KIB) == "1.00 KiB"
    assert format_bytes(None) == "?"


def test_short_sizes_have_one_decimal_and_none_when_it_is_zero():
    assert format_bytes(24 * GIB, short=True) == "24 GiB"
    assert format_bytes(int(14.2 * GIB), short=True) == "14.2 GiB"
    assert format_bytes(int(9.5 * MIB), short=True) == "9.5 MiB"
    assert format_bytes(300, short=True) == "300 bytes"


def test_the_same_size_reads_the_same_in_both_lengths():
    # What the issue saw: one figure printed "1.5 GiB", "1.50 GiB" and "1.5 GiB" by three formatters.
    size = 1536 * MIB
    assert format_bytes(size).startswith("1.5")
    assert format_bytes(size, short=True) == "1.5 GiB"


def test_percentages_and_changes_carry_their_sign():
    assert format_percent(38.04) == "38.0 %"
    assert format_percent(-38.04, signed=True) == "−38.0 %"
    assert format_percent(2.5, signed=True) == "+2.5 %"
    assert format_percent(0.01, signed=True) == "0 %"
    assert signed_bytes(-1536 * MIB) == "−1.50 GiB"
    assert signed_bytes(20 * MIB) == "+20.00 MiB"
    assert signed_bytes(0) == "0 bytes"
    assert share(1, 4) == 25.0 and share(1, 0) == 0.0
