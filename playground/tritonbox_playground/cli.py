"""`tritonbox-playground serve`: run the playground, after checking `.env` for unknown keys."""

from __future__ import annotations

from typing import Any

from tritonbox_common.service_cli import serve_settings
from tritonbox_playground.settings import PlaygroundSettings


def launch_options(settings: PlaygroundSettings, host: str) -> dict[str, Any]:
    """Gradio's launch() arguments: address, login, and nothing that reaches the internet."""
    auth = None
    if settings.playground_username and settings.playground_password:
        auth = (settings.playground_username, settings.playground_password.get_secret_value())
    return {
        "server_name": host,
        "server_port": settings.playground_port,
        "auth": auth,
        "auth_message": "TritonBox playground: sign in with the login you were given.",
        # Sync handlers (none today) would share this pool with every queued run.
        "max_threads": max(40, settings.playground_concurrency),
        "ssr_mode": False,  # server-side rendering needs Node; the page renders in the browser
        "share": False,
        "show_error": True,
        "footer_links": ["api"],
        "quiet": False,
    }


def main(argv: list[str] | None = None) -> int:
    serve = serve_settings("tritonbox-playground", __doc__, PlaygroundSettings, argv)
    if serve is None:
        return 1
    settings = serve.settings
    # Imported late: gradio takes seconds to import, and a bad .env should fail at once.
    from tritonbox_playground.app import create_app

    create_app(settings).launch(**launch_options(settings, serve.host))
    return 0
