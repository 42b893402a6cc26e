"""Configuration: defaults, environment, and clear errors naming the variable."""

from __future__ import annotations

import pytest

from metrics_lake.core.config import load_settings
from metrics_lake.core.storage import LocalStore, S3Store, open_store
from metrics_lake.lake_schemas.errors import ConfigError


def test_defaults_are_the_embedded_lake(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    settings = load_settings()
    assert (settings.root, settings.partitions, settings.watermark_seconds) == ("./lakehouse", 4, 120)
    assert not settings.is_s3


def test_environment_overrides_lake_toml(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lake.toml").write_text('partitions = 8\ntopic = "from_toml"\n')
    monkeypatch.setenv("LAKE_PARTITIONS", "2")
    settings = load_settings()
    assert (settings.partitions, settings.topic) == (2, "from_toml")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LAKE_PARTITIONS", "zero"),
        ("LAKE_PARTITIONS", "0"),
        ("LAKE_ROOT", "hdfs://x/y"),
        ("LAKE_CHECKPOINT_DIR", "s3://bucket/ck"),
        ("LAKE_TOPIC", "Bad Topic"),
    ],
)
def test_invalid_setting_fails_at_start_naming_the_variable(monkeypatch, tmp_path, variable, value):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=variable):
        load_settings()


def test_secrets_never_appear_in_errors_or_repr(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAKE_S3_SECRET_KEY", "very-secret-value")
    settings = load_settings()
    assert "very-secret-value" not in repr(settings)
    monkeypatch.setenv("LAKE_PARTITIONS", "-1")
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert "very-secret-value" not in str(error.value)


def test_root_selects_the_backend(tmp_path):
    s3 = open_store(load_settings(root="s3://bucket/lake/", s3_endpoint="http://127.0.0.1:1"))
    assert isinstance(s3, S3Store) and (s3.bucket, s3.prefix, s3.root) == ("bucket", "lake", "s3://bucket/lake")
    assert isinstance(open_store(load_settings(root=str(tmp_path))), LocalStore)
