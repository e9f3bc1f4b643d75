"""Command line entry: `python run.py` serves the API, `python run.py chat` talks to it (see --help)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from app.errors import ConfigError


SERVE_OPTIONS = ("config", "host", "port")
CHAT_OPTIONS = ("thread", "url", "token")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line: `serve` (the default) with --host/--port/--config, or `chat` with --thread/--url/--token."""
    parser = argparse.ArgumentParser(prog="run.py", description="au: a self-hosted personal assistant.")
    parser.add_argument(
        "command", nargs="?", default="serve", choices=["serve", "chat"],
        help="serve the API (default), or chat with a running server in this terminal",
    )
    parser.add_argument("--config", help="config file (default: $AU_CONFIG or config.yaml)")
    parser.add_argument("--host", help="listen address (overrides server.host / AU_HOST)")
    parser.add_argument("--port", type=int, help="listen port (overrides server.port / AU_PORT)")
    chat = parser.add_argument_group("chat options")
    chat.add_argument("--thread", help="thread id to use (default: the last one used with this server, else a new one)")
    chat.add_argument("--url", help="server address (default: $AU_URL or http://127.0.0.1:5000)")
    chat.add_argument("--token", help="API token (default: $AU_TOKEN, else the first of AU_API_TOKENS)")
    args = parser.parse_args(argv)
    # An option of the other command would be silently ignored; say so instead.
    foreign = CHAT_OPTIONS if args.command == "serve" else SERVE_OPTIONS
    for name in foreign:
        if getattr(args, name) is not None:
            parser.error(f"--{name} is not an option of `{args.command}`")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Load and validate the settings, then run the chosen command."""
    args = parse_args(argv)
    if args.command == "chat":
        from app.client import main as chat

        return chat(args.url, args.token, args.thread)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Their INFO lines log every request URL in full (query strings with keys included), past the trace's masking.
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Command-line flags win over the environment, which wins over config.yaml.
    environ = dict(os.environ)
    if args.host:
        environ["AU_HOST"] = args.host
    if args.port is not None:
        environ["AU_PORT"] = str(args.port)
    from app.config import load_settings
    from app.server import serve

    try:
        settings = load_settings(args.config, environ=environ)
    except ConfigError as exc:
        print(f"au: {exc}", file=sys.stderr)
        return 2
    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())
