"""The loopback guard's rules and its refusals, without loading anything: the
integration test `test_trino_takes_no_connection_from_another_account` loads it
on the running stack and sends another account's request through it."""

from __future__ import annotations

from warehouse.ops.stack import guard


def test_the_rules_reset_other_accounts_on_loopback_to_one_port():
    text = guard.ruleset(8080, 0)
    rule = 'oifname "lo" tcp dport 8080 meta skuid != 0 counter reject with tcp reset'
    assert rule in text
    assert "hook output" in text and "policy accept" in text
    # One transaction replaces whatever an earlier start left: add, delete, define.
    lines = text.splitlines()
    assert lines[:3] == [
        "add table inet regauge_guard_8080",
        "delete table inet regauge_guard_8080",
        "table inet regauge_guard_8080 {",
    ]


def test_each_port_has_a_table_of_its_own():
    assert guard.table(8080) != guard.table(18080)
    assert "dport 18080" in guard.ruleset(18080, 1000) and "skuid != 1000" in guard.ruleset(
        18080, 1000
    )


def test_an_account_other_than_root_is_told_why_the_port_stays_open(monkeypatch):
    monkeypatch.setattr(guard.os, "geteuid", lambda: 1000)
    why = guard.close(8080)
    assert why is not None and "root" in why
    assert not guard.holds(8080)


def test_without_nft_it_says_what_to_install(monkeypatch):
    monkeypatch.setattr(guard.os, "geteuid", lambda: 0)
    monkeypatch.setattr(guard, "_nft", lambda: None)
    why = guard.close(8080)
    assert why is not None and "nftables" in why and "make setup" in why


def test_lifting_a_guard_never_set_does_nothing(monkeypatch):
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(guard, "holds", lambda _port: False)
    monkeypatch.setattr(guard, "_run", lambda *argv, **_kw: calls.append(argv))
    guard.lift(8080)
    assert calls == []
