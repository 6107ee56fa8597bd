"""The bounded caches' one class: least recently used dropped first, and one-off keys never kept where asked."""

from __future__ import annotations

from dpsql.recent import Recent


def test_the_least_recently_used_entry_is_dropped_first():
    cache: Recent[str, int] = Recent(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3 and len(cache) == 2


def test_with_second_sighting_a_key_is_kept_only_when_it_comes_again():
    cache: Recent[str, int] = Recent(4, second_sighting=True)
    cache.put("hot", 1)
    assert cache.get("hot") is None  # seen once: remembered by its hash only
    cache.put("hot", 1)
    assert cache.get("hot") == 1


def test_a_burst_of_one_off_keys_neither_evicts_the_used_ones_nor_stays():
    cache: Recent[str, int] = Recent(4, second_sighting=True)
    for _ in range(2):
        cache.put("hot", 1)
    for n in range(16_000):  # one analyst's 16 connections of 1,000 distinct named statements
        cache.put(f"SELECT {n}", n)
    assert cache.get("hot") == 1 and len(cache) == 1
