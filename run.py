"""Command line entry: `python run.py` serves the API (see --help)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from app.errors import ConfigError


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line: `serve` (the default) with --host/--port/--config."""
    parser = argparse.ArgumentParser(prog="run.py", description="au: a self-hosted personal assistant.")
    parser.add_argument("command", nargs="?", default="serve", choices=["serve"], help="what to do (default: serve)")
    parser.add_argument("--config", help="config file (default: $AU_CONFIG or config.yaml)")
    parser.add_argument("--host", help="listen address (overrides server.host / AU_HOST)")
    parser.add_argument("--port", type=int, help="listen port (overrides server.port / AU_PORT)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Load and validate the settings, then run the chosen command."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Command-line flags win over the environment, which wins over config.yaml.
    environ = dict(os.environ)
    if args.host:
        environ["AU_HOST"] = args.host
    if args.port:
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
