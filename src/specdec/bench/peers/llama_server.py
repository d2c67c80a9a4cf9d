"""llama.cpp's own server as a benchmark peer: ``llama-server`` built stock (``make llama-peers``) from
the llama.cpp source that llama-cpp-python 0.3.36 ships, run the way its users run it.

Method strings: ``llama-server-plain``; ``llama-server-draft[:ALIAS][:n=N]`` (a draft model, by
default the target's own default draft model, with ``--spec-type draft-simple`` and its default
draft settings; ``n`` is ``--spec-draft-n-max``, default 3);
and llama.cpp's n-gram speculation, one method per ``--spec-type``: ``llama-server-ngram-simple``,
``llama-server-ngram-map-k``, ``llama-server-ngram-map-k4v`` (``n``: the draft m-gram length
``--spec-ngram-*-size-m``, default 48), ``llama-server-ngram-mod`` (``n``: ``--spec-ngram-mod-n-max``,
default 64) and ``llama-server-ngram-cache`` (no ``n``: llama.cpp fixes its drafts at 8 tokens).

Each distinct setting starts one server (loopback, a free port, ``-c 4096``, one thread per CPU,
one slot, no host-memory prompt cache) that keeps its models loaded for the whole bench. Every
question is one ``POST /completion`` with the prompt as token ids, ``cache_prompt: false`` (a cold
prompt, as ours), the bench's sampling and ``return_tokens``; the server's own ``timings`` give
its generation time after the prompt (``predicted_ms``: from the first generated token to the
last, ``predicted_per_second`` = (``predicted_n`` - 1) / that time) beside the request's wall time.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from specdec.bench.base import Method, PeerContext, RunResult, peer, positive
from specdec.cpu import usable_cpus
from specdec.errors import SpecdecError
from specdec.models import ALIASES, default_draft_model, resolve
from specdec.options import GenerationOptions

PREFIX = "llama-server-"
BIN_ENV = "SPECDEC_LLAMA_CPP_BIN"
BIN_DIR = Path(".peers") / "llama.cpp" / "build" / "bin"
# --spec-type -> the flag ``n`` sets (None: the type takes no n)
NGRAM_TYPES: dict[str, str | None] = {
    "ngram-simple": "--spec-ngram-simple-size-m",
    "ngram-map-k": "--spec-ngram-map-k-size-m",
    "ngram-map-k4v": "--spec-ngram-map-k4v-size-m",
    "ngram-mod": "--spec-ngram-mod-n-max",
    "ngram-cache": None,
}
NGRAM_MOD_N_MIN = 48  # llama.cpp's default --spec-ngram-mod-n-min
FORMS = ("llama-server-plain", "llama-server-draft[:ALIAS][:n=N]",
         *(PREFIX + t + ("" if flag is None else "[:n=N]") for t, flag in NGRAM_TYPES.items()))
HEADS = ("llama-server-plain", "llama-server-draft", *(PREFIX + t for t in NGRAM_TYPES))
START_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 3600.0
# The server is on loopback: a proxy from the environment must not be asked for it.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def binary(name: str = "llama-server") -> Path:
    """A llama.cpp binary of ``make llama-peers``: in $SPECDEC_LLAMA_CPP_BIN, else the build folder
    under the current folder or the checkout; a clear error when it was not built."""
    chosen = os.environ.get(BIN_ENV)
    checkout = Path(__file__).resolve().parents[4]
    folders = [Path(chosen)] if chosen else [Path.cwd() / BIN_DIR, checkout / BIN_DIR]
    for folder in folders:
        path = folder / name
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise SpecdecError(f"the llama-server-* methods need llama.cpp's {name}: build them with "
                       f"`make llama-peers` (or point {BIN_ENV} at a folder that holds them)")


@dataclass(frozen=True)
class ServerSettings:
    """What one method string asks of the server: its speculation type (None: plain), the draft
    model (an alias or a .gguf path) and ``n`` (None: llama.cpp's default)."""

    spec_type: str | None = None
    draft: str | None = None
    n: int | None = None

    def args(self, draft_gguf: Path | None = None) -> list[str]:
        """The server flags for this setting (``draft_gguf``: the draft model's file)."""
        if self.spec_type is None:
            return []
        out = ["--spec-type", self.spec_type]
        if self.spec_type == "draft-simple":
            out += ["--model-draft", str(draft_gguf)]
            if self.n is not None:
                out += ["--spec-draft-n-max", str(self.n)]
        elif self.n is not None:
            out += [NGRAM_TYPES[self.spec_type], str(self.n)]
            if self.spec_type == "ngram-mod" and self.n < NGRAM_MOD_N_MIN:
                # Its minimum would otherwise exceed the maximum asked for.
                out += ["--spec-ngram-mod-n-min", str(self.n)]
        return out


def parse(spec: str, args: list[str], pairs: dict[str, str], target: str | None = None) -> ServerSettings:
    """The settings of a ``llama-server-*`` method string for the model ``target`` (its default
    draft model stands in for a missing ALIAS; None: not known yet). Mistakes read
    ``method 'SPEC': ...``, checked before any model is loaded."""
    head = spec.split(":", 1)[0]
    kind = head[len(PREFIX):]
    if head not in HEADS:
        raise SpecdecError(f"method {spec!r}: unknown llama-server speculation {kind!r}: use "
                           + ", ".join(FORMS))
    unknown = set(pairs) - {"n"}
    if unknown:
        raise SpecdecError(f"method {spec!r}: unknown option(s) {', '.join(sorted(unknown))}")
    n = None if "n" not in pairs else positive(spec, pairs["n"], "n")
    if kind == "plain":
        if args or n is not None:
            raise SpecdecError(f"method {spec!r}: write llama-server-plain (it takes no options)")
        return ServerSettings()
    if kind == "draft":
        if len(args) > 1:
            raise SpecdecError(f"method {spec!r}: write llama-server-draft[:ALIAS][:n=N] "
                               "(ALIAS: the draft model)")
        draft = args[0] if args else None if target is None else default_draft_model(target)
        if draft is None and target is not None:
            raise SpecdecError(f"method {spec!r}: write llama-server-draft:ALIAS[:n=N] ({target} names no "
                               "default draft model)")
        if draft is not None and draft not in ALIASES and not Path(draft).expanduser().is_file():
            raise SpecdecError(f"method {spec!r}: unknown draft model {draft!r}: use one of "
                               f"{', '.join(ALIASES)} or a path to a .gguf file")
        return ServerSettings("draft-simple", draft, n)
    if args:
        raise SpecdecError(f"method {spec!r}: {kind} takes no model")
    if n is not None and NGRAM_TYPES[kind] is None:
        raise SpecdecError(f"method {spec!r}: {kind} takes no n (llama.cpp fixes its draft length)")
    return ServerSettings(kind, None, n)


def request_body(prompt_ids: list[int], max_new_tokens: int, options: GenerationOptions,
                 seed: int | None) -> dict:
    """One ``/completion`` request with our sampling: temperature, then top-k (0: none), then top-p,
    in that order, and none of llama.cpp's other samplers (its min-p 0.05, DRY, XTC, typical-p and
    repetition penalties are off); temperature 0 is greedy (llama.cpp keeps only the argmax)."""
    body: dict = {
        "prompt": list(prompt_ids), "n_predict": max_new_tokens, "stream": False, "cache_prompt": False,
        "return_tokens": True, "temperature": options.temperature, "top_k": options.top_k,
        "top_p": options.top_p, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0,
        "samplers": ["temperature", "top_k", "top_p"],
    }
    if not options.greedy and seed is not None:
        body["seed"] = seed
    return body


@dataclass(frozen=True)
class ServerAnswer:
    """What one ``/completion`` answer says: the generated ids and llama.cpp's own timings.

    ``gen_s`` is ``predicted_ms`` (from the first generated token to the last; the first token's
    logits come with the prompt) and ``gen_tokens`` the ``predicted_n - 1`` tokens made in it, so
    ``gen_tokens / gen_s`` is llama.cpp's ``predicted_per_second``. ``drafted`` / ``accepted`` are
    its draft counters (None when it drafted nothing)."""

    token_ids: list[int]
    prompt_s: float
    prompt_tokens: int
    cached_tokens: int
    gen_s: float
    gen_tokens: int
    tokens_per_s: float
    drafted: int | None = None
    accepted: int | None = None

    @property
    def target_forwards(self) -> int:
        """The target's forwards, the prompt's included (it yields the first token): every
        forward after it yields its accepted draft tokens plus one."""
        return len(self.token_ids) - (self.accepted or 0)


def parse_answer(answer: dict) -> ServerAnswer:
    """Read a ``/completion`` answer; a RuntimeError names what is missing (a peer's failure)."""
    tokens = answer.get("tokens")
    timings = answer.get("timings")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise RuntimeError(f"llama-server answered without the generated token ids: {str(answer)[:200]}")
    if not isinstance(timings, dict) or "predicted_ms" not in timings or "predicted_n" not in timings:
        raise RuntimeError(f"llama-server answered without its timings: {str(answer)[:200]}")
    n = int(timings["predicted_n"])
    return ServerAnswer(
        token_ids=tokens, prompt_s=float(timings.get("prompt_ms", 0.0)) / 1000,
        prompt_tokens=int(timings.get("prompt_n", 0)), cached_tokens=int(timings.get("cache_n", 0)),
        gen_s=float(timings["predicted_ms"]) / 1000, gen_tokens=max(0, n - 1),
        tokens_per_s=float(timings.get("predicted_per_second", 0.0)),
        drafted=timings.get("draft_n"), accepted=timings.get("draft_n_accepted"))


class LlamaServer:
    """One ``llama-server`` process on a free loopback port, models loaded once; ``complete`` is one
    request. It starts on the first request (or :meth:`start`), so a server that cannot start
    fails that request, which the bench reports as the method's failure; stopped by :meth:`close`
    (also at interpreter exit); usable as a context manager."""

    def __init__(self, model_gguf: Path, extra_args: list[str] | None = None, threads: int | None = None,
                 ctx: int = 4096) -> None:
        self.cmd = [str(binary("llama-server")), "--model", str(model_gguf), "--host", "127.0.0.1",
                    "-c", str(ctx), "-t", str(threads or usable_cpus()), "--parallel", "1",
                    # Every request is cold (cache_prompt false), so saving each finished slot to
                    # the host-memory prompt cache would only cost time between questions.
                    "--cache-ram", "0", *(extra_args or [])]
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self._log = None
        self._failed: SpecdecError | None = None

    def start(self) -> LlamaServer:
        """Launch the server and wait until ``/health`` says its models are loaded (once; a failed
        start raises the same error again)."""
        if self._failed is not None:
            raise self._failed
        if self.proc is not None:
            return self
        self.port = _free_port()
        self._log = tempfile.NamedTemporaryFile(prefix="specdec-llama-server-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([*self.cmd, "--port", str(self.port)], stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        atexit.register(self.close)
        try:
            self._wait_ready()
        except SpecdecError as exc:
            self._failed = exc
            self.close()
            raise
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SpecdecError(f"llama-server did not start (exit code {self.proc.returncode}): "
                                   f"{self.log_tail()} (command: {' '.join(self.cmd)})")
            try:
                with _HTTP.open(self.url + "/health", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or 503 while the model loads
            time.sleep(0.1)
        raise SpecdecError(f"llama-server was not ready after {START_TIMEOUT_S:.0f} s: {self.log_tail()}")

    def complete(self, body: dict) -> dict:
        """POST ``/completion``; a RuntimeError when the server has gone or refuses the request."""
        self.start()
        request = urllib.request.Request(self.url + "/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with _HTTP.open(request, timeout=REQUEST_TIMEOUT_S) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            raise RuntimeError(f"llama-server refused the request ({exc.code}): {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server ended (exit code {self.proc.returncode}): "
                                   f"{self.log_tail()}") from None
            raise RuntimeError(f"llama-server did not answer: {exc}") from None

    def log_tail(self, lines: int = 5) -> str:
        """The last lines the server logged (why it failed, usually)."""
        if self._log is None:
            return "(no log)"
        try:
            text = Path(self._log.name).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"

    def close(self) -> None:
        """Stop the server (idempotent) and remove its log."""
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log = getattr(self, "_log", None)
        if log is not None:
            log.close()
            Path(log.name).unlink(missing_ok=True)
            self._log = None
        atexit.unregister(self.close)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def server_for(model: str, settings: ServerSettings) -> LlamaServer:
    """A (not yet started) server for ``settings`` on ``model``'s GGUF."""
    target = resolve(model, need_hf=False).gguf
    draft = None if settings.draft is None else resolve(settings.draft, need_hf=False).gguf
    if target is None or (settings.draft is not None and draft is None):
        both = model + (f" and {settings.draft}" if settings.draft else "")
        raise SpecdecError(f"llama-server runs GGUF files: {both} must be aliases or .gguf files")
    return LlamaServer(target, settings.args(draft))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LlamaServerMethod(Method):
    """A ``llama-server-*`` method: one request per question to its (shared, already loaded) server."""

    name: str
    server: LlamaServer
    options: GenerationOptions  # the sampling is read from it
    family: str = "llama-server"

    takes_schema = True

    def run(self, prompt_ids, max_new_tokens, seed, schema=None):
        body = request_body(prompt_ids, max_new_tokens, self.options, seed)
        if schema is not None:  # llama-server turns a JSON Schema into its grammar
            body["json_schema"] = schema
        t0 = time.perf_counter()
        answer = parse_answer(self.server.complete(body))
        wall = time.perf_counter() - t0
        return RunResult(answer.token_ids, wall, peer_forwards=answer.target_forwards, gen_s=answer.gen_s,
                         gen_tokens=answer.gen_tokens, peer_drafted=answer.drafted,
                         peer_accepted=answer.accepted)


def _build(context: PeerContext, spec: str, settings: ServerSettings) -> Method:
    server = context.once(("llama-server", settings), lambda: server_for(context.model_name, settings))
    return LlamaServerMethod(spec, server, context.options)


def _available() -> None:
    binary()


for _order, (_head, _form) in enumerate(zip(HEADS, FORMS)):
    peer(_head, _form, "llama-server", parse=parse, available=_available, baseline=_head == PREFIX + "plain",
         order=40 + _order)(_build)
