"""Configuration: keyword arguments over HOPLITE_* variables over defaults."""

import pytest

from torch_hoplite.config import Config, parse_size


def test_parse_size():
    assert parse_size("65536") == 65536
    assert parse_size("64KiB") == 64 << 10
    assert parse_size("1MB") == 1 << 20
    assert parse_size("2g") == 2 << 30
    assert parse_size(5) == 5
    with pytest.raises(ValueError, match="cannot parse"):
        parse_size("lots")
    with pytest.raises(ValueError, match="negative"):
        parse_size(-1)


def test_environment_then_keywords(monkeypatch):
    monkeypatch.setenv("HOPLITE_CHUNK_BYTES", "512KiB")
    monkeypatch.setenv("HOPLITE_TIMEOUT", "12.5")
    monkeypatch.setenv("HOPLITE_STORE_CAPACITY", "1GiB")
    cfg = Config.resolve({"timeout": 3})
    assert cfg.chunk_bytes == 512 << 10
    assert cfg.timeout == 3
    assert cfg.capacity_bytes == 1 << 30
    assert cfg.pool_cache_bytes == 1 << 30  # follows the capacity unless set
    assert cfg.rejoin is False
    monkeypatch.setenv("HOPLITE_REJOIN", "yes")
    assert Config.resolve({}).rejoin is True
    assert Config.resolve({"rejoin": False}).rejoin is False


def test_bad_configuration_is_rejected(monkeypatch):
    with pytest.raises(TypeError, match="chunk_size"):
        Config.resolve({"chunk_size": 5})
    with pytest.raises(ValueError, match="64 MiB"):
        Config.resolve({"chunk_bytes": "1GiB"})
    monkeypatch.setenv("HOPLITE_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="HOPLITE_TIMEOUT"):
        Config.resolve({})
    monkeypatch.delenv("HOPLITE_TIMEOUT")
    monkeypatch.setenv("HOPLITE_REJOIN", "maybe")
    with pytest.raises(ValueError, match="HOPLITE_REJOIN"):
        Config.resolve({})
