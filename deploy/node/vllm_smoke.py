#!/usr/bin/python3
"""Does vLLM answer? Run on the GPU node (stdlib only: the system's Python 3).

``ready --url URL``: wait, bounded, until the server answers ``/health`` and ``/v1/models`` (the
embedding units' ``ExecStartPre``, so they profile GPU memory only after ``vllm@generate`` has).
``smoke --unit NAME=URL:KIND ...``: for each unit, wait until it is ready (a progress line every
15 s; the unit's failure ends the wait at once), then one real request with its answer's shape
checked: ``embed`` one embedding, ``score`` one score request (two passages), ``generate`` one
chat completion and one more naming each loaded adapter (``/v1/models`` cards with a ``parent``).
Any failure prints the unit's last journal lines and exits 1: the deploy stops there (deploy/vllm.py).
``lora --url URL --adapter DIR``: load, use and unload an adapter (scripts/gpu-check).
``--env`` reads the API key from vLLM's environment file (``VLLM_API_KEY``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

PROGRESS_EVERY = 15.0


class SmokeFailure(Exception):
    """A unit that did not answer, or answered in the wrong shape: what, and where."""


class Client:
    def __init__(self, url: str, key: str | None) -> None:
        self.url, self.key = url.rstrip("/"), key

    def call(self, path: str, body: dict[str, Any] | None = None, timeout: float = 120.0) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method="GET" if body is None else "POST")
        request.add_header("Content-Type", "application/json")
        if self.key:
            request.add_header("Authorization", f"Bearer {self.key}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")[:300]
            raise SmokeFailure(f"{self.url}{path}: HTTP {error.code}: {text}") from None
        except (urllib.error.URLError, OSError) as error:
            raise SmokeFailure(f"{self.url}{path}: {getattr(error, 'reason', error)}") from None
        try:
            return json.loads(raw) if raw.strip() else None
        except ValueError:  # the LoRA routes answer plain text
            return raw.decode(errors="replace")


def models(client: Client) -> list[dict[str, Any]]:
    listing = client.call("/v1/models", timeout=10)
    cards = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(cards, list) or not all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in cards):
        raise SmokeFailure(f"{client.url}/v1/models: not a model list: {str(listing)[:200]}")
    return cards


def wait_ready(
    client: Client,
    timeout: float,
    failed: Callable[[], bool] = lambda: False,
    say: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> list[dict[str, Any]]:
    """``/health`` and ``/v1/models`` answering, within ``timeout`` seconds; the model cards."""
    start = last = clock()
    while True:
        try:
            client.call("/health", timeout=10)
            return models(client)
        except SmokeFailure as error:
            now = clock()
            if failed():
                raise SmokeFailure(f"{client.url}: the unit failed while starting ({error})") from None
            if now - start >= timeout:
                raise SmokeFailure(f"{client.url}: not ready after {timeout:.0f} s ({error})") from None
            if now - last >= PROGRESS_EVERY:
                say(f"{client.url}: not ready yet, {now - start:.0f} s ({error})")
                last = now
        pause(2.0)


def embedding(client: Client, model: str) -> str:
    answer = client.call("/v1/embeddings", {"model": model, "input": ["query: does vLLM answer?"]})
    data = answer.get("data") if isinstance(answer, dict) else None
    vector = data[0].get("embedding") if isinstance(data, list) and data and isinstance(data[0], dict) else None
    if not isinstance(vector, list) or not vector or not all(isinstance(x, int | float) for x in vector):
        raise SmokeFailure(f"{client.url}/v1/embeddings ({model}): no embedding in {str(answer)[:200]}")
    return f"embedding of {len(vector)} dimensions"


def chat(client: Client, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 8, "temperature": 0}
    answer = client.call("/v1/chat/completions", body)
    choices = answer.get("choices") if isinstance(answer, dict) else None
    message = choices[0].get("message") if isinstance(choices, list) and choices else None
    content = message.get("content") if isinstance(message, dict) else None
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(content, str) or not isinstance(usage, dict) or answer.get("model") != model:
        raise SmokeFailure(f"{client.url}/v1/chat/completions ({model}): not a chat completion: {str(answer)[:200]}")
    return f"chat completion from {model} ({usage.get('completion_tokens')} tokens)"


def score(client: Client, model: str) -> str:
    """vLLM's score API (a cross-encoder, ``vllm@rerank``): one score per passage, the relevant one higher."""
    passages = ["vLLM answers score requests on this port.", "Pears ripen after they are picked."]
    answer = client.call("/score", {"model": model, "text_1": "does vLLM answer score requests?", "text_2": passages})
    data = answer.get("data") if isinstance(answer, dict) else None
    scores = [d.get("score") for d in data if isinstance(d, dict)] if isinstance(data, list) else []
    if len(scores) != len(passages) or not all(isinstance(v, (int, float)) for v in scores):
        raise SmokeFailure(f"{client.url}/score ({model}): not a score response: {str(answer)[:200]}")
    return f"scores from {model}: {', '.join(f'{v:.3f}' for v in scores)}"


def smoke_unit(client: Client, kind: str, cards: list[dict[str, Any]]) -> list[str]:
    """The requests of one ready unit; one line per request answered in vLLM's shape."""
    base = [c["id"] for c in cards if c.get("parent") is None]
    if not base:
        raise SmokeFailure(f"{client.url}/v1/models: no base model in {[c['id'] for c in cards]}")
    if kind == "embed":
        return [embedding(client, base[0])]
    if kind == "score":
        return [score(client, base[0])]
    adapters = [c["id"] for c in cards if c.get("parent") is not None]
    return [chat(client, name) for name in [base[0], *adapters]]


def lora_round_trip(client: Client, adapter: str, name: str = "gpu-check") -> list[str]:
    """Load ``adapter`` under ``name`` at run time, one chat naming it, unload it (scripts/gpu-check)."""
    lines = []
    client.call("/v1/load_lora_adapter", {"lora_name": name, "lora_path": adapter})
    lines.append(f"loaded {adapter} as {name}")
    try:
        lines.append(chat(client, name))
    finally:
        client.call("/v1/unload_lora_adapter", {"lora_name": name})
    lines.append(f"unloaded {name}")
    return lines


def journal(unit: str) -> str:
    tail = subprocess.run(["journalctl", "-u", unit, "-n", "30", "--no-pager"], capture_output=True, text=True)
    return tail.stdout or tail.stderr


def unit_failed(unit: str) -> bool:
    return subprocess.run(["systemctl", "is-failed", "--quiet", unit], check=False).returncode == 0


def read_key(env_file: str | None) -> str | None:
    if env_file is None:
        return os.environ.get("VLLM_API_KEY")
    with open(env_file, encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("VLLM_API_KEY="):
                return line.split("=", 1)[1].strip()
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm-smoke")
    parser.add_argument("command", choices=("ready", "smoke", "lora"))
    parser.add_argument("--adapter", help="lora: an adapter directory to load, use and unload at --url")
    parser.add_argument("--url", help="ready: the server to wait for")
    parser.add_argument("--unit", action="append", default=[], help="smoke: NAME=URL:KIND (KIND generate|embed|score)")
    parser.add_argument("--env", help="vLLM's environment file (the API key)")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    try:
        key = read_key(args.env)
    except OSError as error:
        print(f"vllm-smoke: {args.env}: {error.strerror}", file=sys.stderr)
        return 2
    if args.command in ("ready", "lora"):
        if not args.url or (args.command == "lora" and not args.adapter):
            parser.error(f"{args.command} needs --url" + (" and --adapter" if args.command == "lora" else ""))
        client = Client(args.url, key)
        try:
            wait_ready(client, args.timeout, say=lambda line: print(line, file=sys.stderr))
            for line in lora_round_trip(client, args.adapter) if args.command == "lora" else []:
                print(f"lora: ok: {line}")
        except SmokeFailure as error:
            print(f"vllm-smoke: {args.command}: FAILED: {error}", file=sys.stderr)
            return 1
        return 0
    for spec in args.unit:
        name, _, rest = spec.partition("=")
        url, _, kind = rest.rpartition(":")
        if not name or not url or kind not in ("generate", "embed", "score"):
            parser.error(f"--unit {spec!r}: NAME=URL:KIND, KIND generate, embed or score")
        client = Client(url, key)
        try:
            cards = wait_ready(client, args.timeout, failed=lambda name=name: unit_failed(name))
            for line in smoke_unit(client, kind, cards):
                print(f"{name}: ok: {line}")
        except SmokeFailure as error:
            print(f"{name}: FAILED: {error}\n--- journalctl -u {name} -n 30 ---\n{journal(name)}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
