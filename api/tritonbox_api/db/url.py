"""Which database the settings name: the one place both the running api (`session`) and the
migration command (`migrate`) read it from."""

from __future__ import annotations

from sqlalchemy import URL, make_url

from tritonbox_api.settings import ApiSettings


def settings_url(settings: ApiSettings) -> URL:
    """DATABASE_URL when set (with POSTGRES_PASSWORD when it names no password), else the
    SQLite file DATABASE_PATH."""
    if settings.database_url is None:
        return make_url(f"sqlite:///{settings.database_path}")
    url = make_url(settings.database_url.get_secret_value())
    if url.password is None and settings.postgres_password is not None:
        url = url.set(password=settings.postgres_password.get_secret_value())
    return url
