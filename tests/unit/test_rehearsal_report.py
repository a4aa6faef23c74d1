"""The rehearsal's verdicts (bench/rehearsal.py): a fault's outage as the probe saw it, and the
rate limit across hosts, which fails the run only when shared limits are expected."""

from __future__ import annotations

from collections import Counter

from bench.rehearsal import Hammer, Probe, print_limits


def test_an_outage_runs_from_the_fault_to_the_first_success_after_the_last_failure() -> None:
    probe = Probe([(9.0, False), (10.0, True), (10.25, False), (10.5, True), (10.75, False), (11.0, True),
                   (11.5, True), (20.0, False)])  # fmt: skip

    assert probe.outage(10.0, 15.0) == (2, 1.0)  # the failure at 9 and at 20 are outside the window
    assert probe.outage(11.0, 15.0) == (0, 0.0)
    assert probe.outage(19.0, 21.0) == (1, 2.0)  # never back inside the window: its end


def test_the_limit_across_hosts_fails_the_run_only_when_shared_limits_are_expected() -> None:
    hammered = Hammer(admitted=Counter(host0=20, host1=20, host2=20), limited=Counter(host0=30), span=40)

    assert print_limits(hammered, 20, expect_shared=False) == []
    (failure,) = print_limits(hammered, 20, expect_shared=True)
    assert "60 creations admitted in one window, limit 20" in failure
    assert print_limits(Hammer(admitted=Counter(host0=12, host2=8)), 20, expect_shared=True) == []
