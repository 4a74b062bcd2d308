"""The image's entrypoint: `serve` (default), `warmup`, `info`, `predict --input JSON`, `healthcheck`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import urllib.request

from .model import Model, Settings, StartupError
from .tensors import RequestError, decode_predict, encode_predict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpux-runtime", description="Serve the model baked into this image.")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("serve", help="serve over HTTP (default)")
    sub.add_parser("warmup", help="run the model on generated inputs, filling the provider caches")
    sub.add_parser("info", help="print what /info would answer")
    predict = sub.add_parser("predict", help="one inference; prints the outputs as JSON")
    predict.add_argument("--input", "-i", required=True, help="JSON object, @file, or - for stdin")
    sub.add_parser("healthcheck", help="exit 0 when the local server is ready (Docker HEALTHCHECK)")
    sub.add_parser("linkcheck", help="check that a provider's shared libraries resolve", add_help=False)
    args, rest = parser.parse_known_args(argv)
    command = args.command or "serve"
    if command == "linkcheck":
        from .linkcheck import main as linkcheck

        return linkcheck(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")

    if command == "healthcheck":
        return _healthcheck()
    try:
        settings = Settings.load()
        logging.basicConfig(
            level=getattr(logging, settings.log_level.upper(), logging.INFO),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
        model = Model.load(settings)
        if command == "serve":
            from .server import serve

            return serve(model, settings.spec.get("pack_version", ""))
        if command == "warmup":
            state = model.warmup()
            print(json.dumps({"warmup": state, "execution_providers": model.active}))
            return 0 if state["state"] == "done" else 1
        if command == "info":
            model.warmup_state = {"state": "not run (info command)"}
            print(json.dumps(model.info(), indent=2))
            return 0
        body = _read_input(args.input)
        outputs = model.run(decode_predict(body, model.inputs))
        print(json.dumps(encode_predict(outputs)))
        return 0
    except StartupError as e:
        print(f"gpux: {e}", file=sys.stderr)
        return 1
    except RequestError as e:
        print(f"gpux: {e}", file=sys.stderr)
        return 2


def _read_input(raw: str):
    try:
        if raw == "-":
            raw = sys.stdin.read()
        elif raw.startswith("@"):
            with open(raw[1:], encoding="utf-8") as f:
                raw = f.read()
        return json.loads(raw)
    except OSError as e:
        raise RequestError(f"--input: {e}") from None
    except ValueError as e:
        raise RequestError(f"--input: malformed JSON: {e}") from None


def _healthcheck() -> int:
    port = os.environ.get("GPUX_PORT")
    if not port:
        try:
            port = str(Settings.load().port)
        except StartupError:
            port = "8080"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=4) as r:
            return 0 if r.status == 200 else 1
    except Exception:
        return 1


if __name__ == "__main__":
    sys.exit(main())
