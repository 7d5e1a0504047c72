"""k8s.settings: the operator's configuration from its environment."""

from __future__ import annotations

from datagen_operator.k8s.settings import Settings


def test_settings_from_env() -> None:
    settings = Settings.from_env(
        {"DATAGEN_WORKER_IMAGE": "w:2", "DATAGEN_TEST_SERVER_URLS": "http://127.0.0.1:5/, http://127.0.0.1:6"}
    )
    assert settings.worker_image == "w:2"
    assert settings.test_server_urls == ("http://127.0.0.1:5", "http://127.0.0.1:6")
    assert Settings.from_env({}).test_server_urls == ()
