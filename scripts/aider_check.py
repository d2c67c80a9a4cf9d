"""aider, unchanged, through `specdec serve` and through stock llama-server plain: the same
whole-file edit (rename one parameter of a 48-line module), timed end to end, the edited file
compared with the expected one.

    python -m venv /tmp/aider && /tmp/aider/bin/pip install aider-chat   # once: aider pins its own deps
    .venv/bin/python scripts/aider_check.py --aider /tmp/aider/bin/aider --out bench-results/readme-editing/aider.json

Every call gets a fresh server (no prompt cache, no index of earlier answers): the first call a
user makes. The servers run one at a time, never beside each other, and take turns call by call
(specdec, llama-server, specdec, ...), so a machine that drifts slows both alike. aider sends no
`max_tokens`; both servers run with their defaults but for the port and, for llama-server, the
context and threads `scripts/loadtest_servers.sh` gives it. The record: each call's seconds, whether
the edit landed (the file equals the expected one), and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from loadtest import NotReady, wait_ready  # noqa: E402

from specdec.bench.peers.llama_server import binary  # noqa: E402
from specdec.commands.bench import provenance  # noqa: E402
from specdec.cpu import machine_tag, usable_cpus  # noqa: E402
from specdec.errors import SpecdecError  # noqa: E402
from specdec.models import resolve  # noqa: E402

# The function of examples/edit_function.txt in a module of its own: 48 lines.
MODULE = '''"""Text wrapping for plain-text reports."""

from __future__ import annotations

__all__ = ["wrap", "wrap_text"]


def wrap(s: str, w: int = 72, indent: str = "", keep_blank: bool = True) -> list[str]:
    """Wrap the paragraphs of a text to lines of at most ``w`` characters.

    Paragraphs are separated by blank lines; a word longer than a line is put on a line of its
    own. Every line but the blank ones starts with ``indent``.
    """
    if w <= len(indent):
        raise ValueError(f"width {w} leaves no room after an indent of {len(indent)} characters")
    out: list[str] = []
    for p in s.split("\\n\\n"):
        t = p.split()
        if not t:
            if keep_blank and out and out[-1] != "":
                out.append("")
            continue
        cur: list[str] = []
        ln = len(indent)
        for i in t:
            extra = len(i) + (1 if cur else 0)
            if cur and ln + extra > w:
                out.append(indent + " ".join(cur))
                cur = [i]
                ln = len(indent) + len(i)
            else:
                cur.append(i)
                ln += extra
        if cur:
            out.append(indent + " ".join(cur))
        if keep_blank:
            out.append("")
    while out and out[-1] == "":
        out.pop()
    return out


def wrap_text(s: str, **options) -> str:
    """The wrapped lines of ``s`` joined into one text.

    Takes the options of :func:`wrap`.
    """
    return "\\n".join(wrap(s, **options))
'''
EXPECTED = re.sub(r"\bw\b", "width", MODULE)  # `w` is the only one-letter name `w` in the module
MESSAGE = ("Rename the parameter `w` of `wrap` to `width`, everywhere it is used, and change nothing else.")
FILE = "textwrap_report.py"


SERVERS = ("specdec", "llama-server-plain", "llama-server-ngram-simple", "llama-server-ngram-mod")


def _server(label: str, port: int, model: str, gguf: str, llama_server: Path) -> list[str]:
    if label == "specdec":
        return [str(ROOT / ".venv/bin/specdec"), "serve", "--model", model, "--port", str(port)]
    spec = label.removeprefix("llama-server-")
    return [str(llama_server), "--model", gguf, "--host", "127.0.0.1", "--port", str(port),
            "-c", "8192", "-t", str(usable_cpus()), *(["--spec-type", spec] if spec != "plain" else [])]


def _phases(label: str, log: Path, ticks: Path, since: float) -> dict:
    """Where the server's time went: its prompt and its answer's decoding, in seconds. specdec's
    from its ticks (SPECDEC_TICK_TRACE; a prompt chunk is a tick of several rows and no offer),
    llama-server's from its own timings in its log (all but the first task: the readiness probe's)."""
    if label == "specdec":
        prompt = decode = 0.0
        for line in ticks.read_text(encoding="utf-8").splitlines():
            tick = json.loads(line)
            if tick["t"] < since:
                continue
            if tick["offered"] == [None] and tick["rows"][0] > 1:
                prompt += tick["seconds"]
            else:
                decode += tick["seconds"]
        return {"prompt_s": round(prompt, 2), "decode_s": round(decode, 2)}
    timing = re.compile(r"task (\d+) \|\s+(prompt eval|eval) time =\s+([\d.]+) ms /\s+(\d+) tokens")
    found = [m.groups() for m in map(timing.search, log.read_text(encoding="utf-8").splitlines()) if m]
    first = found[0][0] if found else None
    prompt = sum(float(ms) for task, kind, ms, _ in found if task != first and kind == "prompt eval") / 1000
    decode = sum(float(ms) for task, kind, ms, _ in found if task != first and kind == "eval") / 1000
    tokens = sum(int(n) for task, kind, _, n in found if task != first and kind == "eval")
    return {"prompt_s": round(prompt, 2), "decode_s": round(decode, 2), "tokens": tokens}


def _call(aider: str, url: str, model: str, work: Path) -> tuple[float, bool, str]:
    """One aider call on a fresh copy of the module: seconds, whether the edit landed, aider's output."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / FILE).write_text(MODULE, encoding="utf-8")
    env = {**os.environ, "OPENAI_API_BASE": f"{url}/v1", "OPENAI_API_KEY": "none",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HOME": str(work)}
    cmd = [aider, "--model", f"openai/{model}", "--edit-format", "whole", "--no-git", "--yes-always",
           "--no-check-update", "--no-show-release-notes", "--no-show-model-warnings", "--no-analytics", "--no-pretty", "--no-stream",
           "--no-auto-lint", "--map-tokens", "0", "--message", MESSAGE, FILE]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - t0
    landed = (work / FILE).read_text(encoding="utf-8") == EXPECTED
    return seconds, landed, (done.stdout + done.stderr)[-4000:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aider", default=shutil.which("aider") or "aider", help="the aider executable")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rounds", type=int, default=2, help="calls per server, taking turns")
    ap.add_argument("--servers", default="specdec,llama-server-plain",
                    help=f"comma-separated, of {', '.join(SERVERS)} (llama.cpp's own n-gram speculation "
                         "with its default settings); specdec and llama-server-plain are always run")
    ap.add_argument("--llama-bin", type=Path, help="the folder of llama-server (default: the bench's, "
                                                   "$SPECDEC_LLAMA_CPP_BIN or `make llama-peers`'s build)")
    ap.add_argument("--out", type=Path, help="where the record goes (JSON); else stdout only")
    args = ap.parse_args()
    if not Path(args.aider).exists() and shutil.which(args.aider) is None:
        sys.exit(f"no aider at {args.aider}: install it in a venv of its own (see this script's docstring)")
    if args.llama_bin is not None:
        llama_server = args.llama_bin / "llama-server"
        if not llama_server.exists():
            sys.exit(f"no llama-server in {args.llama_bin}: run `make llama-peers`")
    else:
        try:
            llama_server = binary("llama-server")
        except SpecdecError as exc:
            sys.exit(str(exc))
    labels = list(dict.fromkeys(["specdec", "llama-server-plain", *args.servers.split(",")]))
    if unknown := [label for label in labels if label not in SERVERS]:
        sys.exit(f"unknown servers {', '.join(unknown)}: choose from {', '.join(SERVERS)}")
    gguf = str(resolve(args.model, need_hf=False).gguf)
    calls: dict[str, list[dict]] = {label: [] for label in labels}
    root = Path(tempfile.mkdtemp(prefix="aider-check-"))
    for r in range(args.rounds):
        for port, label in enumerate(labels, start=8120):
            log = open(root / f"{label}-{r}.log", "w")
            ticks = root / f"{label}-{r}.ticks.jsonl"
            server = subprocess.Popen(_server(label, port, args.model, gguf, llama_server), stdout=log,
                                      stderr=subprocess.STDOUT, cwd=ROOT,
                                      env={**os.environ, "SPECDEC_TICK_TRACE": str(ticks)})
            try:
                url = f"http://127.0.0.1:{port}"
                wait_ready(url, timeout=600)
                since = time.monotonic()  # the server's ticks are stamped on the same clock
                seconds, landed, output = _call(args.aider, url, args.model, root / f"work-{label}-{r}")
            except NotReady as exc:
                sys.exit(f"{label} never answered: {exc} (log: {log.name})")
            finally:
                server.terminate()
                server.wait(timeout=60)
                log.close()
            call = {"seconds": round(seconds, 2), "landed": landed, **_phases(label, Path(log.name), ticks, since)}
            # What neither server's forwards account for: aider itself (start, prompt building, the
            # edit's parsing) and HTTP.
            call["outside_s"] = round(seconds - call["prompt_s"] - call["decode_s"], 2)
            calls[label].append(call)
            print(f"{label} call {r + 1}: {seconds:.1f} s, {'landed' if landed else 'did NOT land'}", flush=True)
            if not landed:
                print(output, file=sys.stderr)
    medians = {k: statistics.median(c["seconds"] for c in v) for k, v in calls.items()}
    phases = {k: {p: round(statistics.median(c[p] for c in v), 2) for p in ("prompt_s", "decode_s", "outside_s")}
              for k, v in calls.items()}
    aider_version = subprocess.run([args.aider, "--version"], capture_output=True, text=True).stdout.strip()
    record = {**provenance(), "command": "scripts/aider_check.py " + shlex.join(sys.argv[1:]), "cpu": machine_tag(),
              "model": args.model, "aider": aider_version, "message": MESSAGE, "file_lines": MODULE.count("\n"),
              "calls": calls, "median_s": medians, "median_phases": phases,
              "all_landed": all(c["landed"] for v in calls.values() for c in v),
              "time_ratio": {label: round(medians[label] / medians["llama-server-plain"], 3) for label in labels}}
    print(json.dumps(record, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
