"""Shared fixtures: toy models, tiny transformers models and drafters with known behaviour."""

from __future__ import annotations

import contextlib
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch

# The GPU server's Triton kernels run in every test run: where no GPU is, by Triton's interpreter
# (tests/test_paged_triton.py), which Triton chooses when a kernel is defined, so before any test
# module imports them (importing torch does not import Triton).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The tooling tests share with the maintainer's scripts (the load test, the docs' generators) lives
# in scripts/, outside the package users install; the tests' own helpers (the headless browser, the
# suite's timing log, the models fetched during setup, the naive attention) are here in tests/.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from specdec.backends.toy import ToyLM
from specdec.engine import DecodeConfig, decode
from specdec.loaded import LoadedModel
from specdec.drafters.base import Drafter
from specdec.types import Draft


# ggml reads its tiled-matmul switch once per process: the suite runs llama.cpp's exact kernels
# whichever test loads a GGUF first (specdec sets it itself when the first load is exact).
os.environ.setdefault("GGML_CPU_TILED_MM", "0")
# A model's cost curve is measured once per machine; the suite measures it in one round instead
# of five (a fresh clone measures every model it loads: minutes of the suite's budget). What the
# tests check (exactness, the policy's logic on given curves) does not depend on its precision,
# and the rounds' own logic is tested on toy backends. Such a curve is cached apart from a full one.
os.environ.setdefault("SPECDEC_CALIBRATION_REPEATS", "1")


def _pin_xdist_worker() -> None:
    """Under pytest-xdist (``make test`` runs ``pytest -n <cores>``) each worker runs on its own share
    of the CPUs this run may use, and its forwards take that many threads: specdec's llama.cpp
    backend defaults to the CPUs its process may use (:func:`specdec.cpu.usable_cpus`), and torch is
    told here (its thread pool was sized when it was imported). Without it every worker's llama.cpp
    forward would spin a thread per core of the machine, two workers' threads taking turns on each
    core. What a test asserts does not depend on it: exact kernels give every row the same bits on any
    number of threads, and every comparison is made within one process. Subprocesses inherit the
    worker's CPUs."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker.startswith("gw") or not count or not hasattr(os, "sched_setaffinity"):
        return
    index, count = int(worker[2:]), int(count)
    cpus = sorted(os.sched_getaffinity(0))
    if count >= len(cpus):
        mine = {cpus[index % len(cpus)]}
    else:  # an even share each, the first workers taking the remainder
        mine = set(cpus[index * len(cpus) // count:(index + 1) * len(cpus) // count])
    # Every thread the worker already has (execnet's), and through inheritance every later one.
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["0"]:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), mine)
    torch.set_num_threads(len(mine))


_pin_xdist_worker()


# Under `make test`'s --dist loadscope each module runs whole on one worker, so that its fixtures
# (models loaded, plain decoding's references) are made once; modules that share session-wide real
# models too costly to load twice go together.
SHARED_SCOPES = {"tests/test_real_models.py": "transformers' real models",
                 "tests/test_real_pairs.py": "transformers' real models"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadscope, with :data:`SHARED_SCOPES` and the order of ``pytest_collection_modifyitems``
    below kept (pytest-xdist would otherwise start with the modules of the most tests, which are
    quick)."""
    if config.option.dist != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModelScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return SHARED_SCOPES.get(nodeid.split("::")[0]) or super()._split_scope(nodeid)

    config.option.loadscopereorder = False
    return ModelScopes(config, log)


def pytest_collection_modifyitems(session, config, items):
    """Under pytest-xdist, the modules that load real models (the ``real`` and ``gpu`` tests, most of
    the suite's time) run first, the most such tests first, each module's tests together and in their
    order: the quick tests at the end even out the workers' finish (pytest-xdist hands the modules out
    in this order, a worker taking the next as it finishes one), where a model module of minutes left
    for last would keep one worker busy while the other idles. Every worker collects the same order.
    A run in one process keeps the files' order.

    The transformers real models (:data:`SHARED_SCOPES`) come after every module that runs llama.cpp:
    torch's bf16 matmuls (test_real_models' bf16 drafter) use AMX tiles on CPUs that have them and
    release them after, while ggml configures its tiles once per thread (``ggml_tile_config_init``'s
    thread-local flag), so a llama.cpp forward on AMX weights after them on the same thread raises
    SIGILL in the stock library (make setup's loads the configuration for every tiled matmul:
    tests/test_llamacpp_selftest.py); the order keeps a stock build's run whole. Alphabetical order
    has no llama.cpp module after test_real_models; a worker taking modules in another order must
    not have one either."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def real(module_items) -> int:
        return sum(1 for i in module_items if i.get_closest_marker("real") or i.get_closest_marker("gpu"))

    def rank(module_items) -> tuple[int, int]:
        shared = module_items[0].nodeid.split("::")[0] in SHARED_SCOPES
        return (1 if shared else 0) if real(module_items) else 2, -real(module_items)

    ordered = sorted(modules.values(), key=rank)  # stable: ties keep their order
    items[:] = [item for module_items in ordered for item in module_items]

def spec_bench_prompts(categories: Sequence[str] = ("summarization", "writing")) -> dict[str, str]:
    """The first prompt of each category of the Spec-Bench set shipped with specdec, cut to 1500
    characters to keep prefills short."""
    from specdec.bench.questions import load_questions

    return {q.category: q.prompt[:1500] for q in load_questions("spec-bench", list(categories), limit=1)}


class ScriptDrafter(Drafter):
    """Proposes from a known continuation: ``right=True`` is always right, ``False`` always wrong.

    ``reference`` is the full plain-decoding sequence (prompt + output), so the drafter knows the
    correct next tokens at every context length.
    """

    def __init__(self, reference: Sequence[int], vocab_size: int, right: bool = True) -> None:
        self.reference = list(reference)
        self.vocab_size = vocab_size
        self.right = right
        self.name = "oracle" if right else "anti-oracle"

    def propose(self, tokens: Sequence[int], k: int, stop=None) -> Draft:
        assert list(tokens) == self.reference[:len(tokens)], "context diverged from plain decoding"
        nxt = self.reference[len(tokens):len(tokens) + k]
        if not self.right:
            nxt = [(t + 1) % self.vocab_size for t in nxt]
        return Draft(nxt)


@pytest.fixture(autouse=True)
def _toy_models_on_one_torch_thread(request):
    """Toy and tiny models run their torch ops on one thread; real models (marked ``real`` or
    ``gpu``) keep the machine's threads (a parallel run's worker: its own CPUs'). A tiny op split over threads costs far more than it computes:
    on a 2-vCPU virtual machine waking the second thread takes milliseconds, so a softmax over 3 rows
    of 4 took 8 ms with two threads against 3 us with one, and the statistical tests of sampling,
    thousands of tiny decodes each, ran minutes instead of seconds. What a test asserts does not
    depend on it: every row of those ops is computed by one thread either way. Subprocesses the test
    starts (the CLI, the GPU check at toy size) inherit one thread through OMP_NUM_THREADS."""
    if request.node.get_closest_marker("real") or request.node.get_closest_marker("gpu"):
        yield
        return
    before, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        torch.set_num_threads(before)
        if env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under ``make test-peers`` (SPECDEC_REQUIRE_PEERS=1) a test that needs a peer fails where it
    would be skipped for want of its build: results that compare with the peers are published only
    after their tests ran, not after they were quietly skipped."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("SPECDEC_REQUIRE_PEERS") == "1" and report.skipped and item.get_closest_marker("peers"):
        report.outcome = "failed"
        report.longrepr = f"SPECDEC_REQUIRE_PEERS=1 and a peer this test needs is missing: {report.longrepr}"


# --- the suite's own timing log ------------------------------------------------------------------
# Every run writes each test's setup, call and teardown seconds to .build/test-times.json, with the
# session's wall time and, under `make test`, when make started (so setup counts): `python
# tests/suite_time.py report` says where the time went, and `make test` fails through `check` when
# a full run broke the 15-minute budget.
_TIMES: dict[str, dict[str, float]] = {}
_OUTCOMES: dict[str, str] = {}
_SESSION: dict[str, object] = {"deselected": 0}


def pytest_sessionstart(session):
    _SESSION["started"] = time.time()


def pytest_deselected(items):
    _SESSION["deselected"] = int(_SESSION["deselected"]) + len(items)


def pytest_runtest_logreport(report):
    times = _TIMES.setdefault(report.nodeid, {"setup": 0.0, "call": 0.0, "teardown": 0.0})
    # pytest-xdist reports the test a crashed worker was running with the phase "???"
    times[report.when if report.when in times else "call"] += report.duration
    if report.when == "call" or report.outcome != "passed":
        _OUTCOMES[report.nodeid] = "skipped" if report.skipped else report.outcome


# Under pytest-xdist the workers collect and run the tests and the controller writes the log: its
# reports are the workers' (pytest_runtest_logreport above), and each worker says, as it finishes,
# how many tests it collected and deselected (every worker collects the whole suite).
_WORKERS: dict[str, dict[str, int]] = {}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    counts = getattr(node, "workeroutput", {}).get("specdec_collection")
    if counts:
        _WORKERS[node.gateway.id] = counts


def _full_run(session) -> bool:
    """The whole suite ran: the configured test paths, no -k or -m, nothing deselected, every
    collected test reported (no -x stop, no interruption, no worker lost)."""
    config = session.config
    from_testpaths = getattr(config, "args_source", None) == pytest.Config.ArgsSource.TESTPATHS
    if _WORKERS:  # a parallel run: what every worker collected and deselected
        collected = {w["collected"] for w in _WORKERS.values()}
        deselected = max(w["deselected"] for w in _WORKERS.values())
        same = len(collected) == 1 and len(_WORKERS) == _parallel_workers(config)
        collected_n = collected.pop() if same else -1
    else:
        deselected, collected_n = _SESSION["deselected"], session.testscollected
    return (from_testpaths and not config.option.keyword and not config.option.markexpr
            and not deselected and collected_n == len(_TIMES) and not session.shouldstop)


def _parallel_workers(config) -> int:
    """The workers of a pytest-xdist run (``-n``), 1 for a run in one process."""
    parallel = getattr(config.option, "dist", "no") != "no" and getattr(config.option, "tx", None)
    return len(config.option.tx) if parallel else 1


def pytest_sessionfinish(session, exitstatus):
    import json
    import subprocess

    from specdec.cpu import machine_tag

    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller writes the log
        session.config.workeroutput["specdec_collection"] = {"collected": session.testscollected,
                                                             "deselected": int(_SESSION["deselected"])}
        return
    root = Path(__file__).resolve().parent.parent
    finished = time.time()
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    make_start = os.environ.get("SPECDEC_MAKE_START")
    outcomes = {k: sum(1 for v in _OUTCOMES.values() if v == k) for k in ("passed", "failed", "skipped")}
    log = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(finished)), "commit": commit,
           "machine": machine_tag(), "full_run": _full_run(session), "workers": _parallel_workers(session.config),
           "exitstatus": int(exitstatus), "make_start": float(make_start) if make_start else None,
           "started": _SESSION.get("started", finished), "finished": finished,
           "wall_s": finished - float(_SESSION.get("started", finished)), "outcomes": outcomes,
           "failed": sorted(n for n, v in _OUTCOMES.items() if v == "failed"), "tests": _TIMES}
    path = Path(os.environ.get("SPECDEC_TEST_LOG", root / ".build" / "test-times.json"))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(log, indent=0), encoding="utf-8")
    except OSError as error:  # a read-only checkout still runs its tests
        print(f"warning: no timing log written to {path}: {error}", file=sys.stderr)


class FakeCosts:
    """What the bench asks of a loaded model's cost curve, for fake models: one curve, swappable."""

    _costs = None

    def cost_model(self):
        from specdec.costs import CostModel

        if self._costs is None:
            self._costs = CostModel({1: 0.01, 2: 0.012, 4: 0.015})
        return self._costs

    def use_costs(self, costs):
        before, self._costs = self._costs, costs
        return before

    learned = None  # what drafters learned (a fake model has none until a bench swaps some in)
    # The real swap: it asks only for ``learned`` and ``use_costs``.
    learning_as = LoadedModel.learning_as


def twin_rollback_walk(make_backend: Callable, vocab: int, seed: int, steps: int = 20, low: int = 0) -> int:
    """Rollback checked exactly, on any backend and CPU.

    Two backends receive the same kept tokens in the same chunk shapes, but every draft they roll
    back holds *different* tokens. If rollback really forgets a draft, each later extend gives
    bit-for-bit identical logits on both; a cache that kept any trace of a rolled-back token
    differs. (Comparing with one full-sequence forward would instead measure how the backend's
    kernels round for other batch shapes, which varies with the CPU.) Returns the extends compared.
    """
    rng = random.Random(seed)
    a, b = make_backend(), make_backend()
    compared = 0
    for _ in range(steps):
        chunk = [rng.randrange(low, vocab) for _ in range(rng.randint(1, 6))]
        got_a, got_b = a.extend(chunk), b.extend(chunk)
        assert torch.equal(got_a, got_b), f"extend {compared}: max diff {(got_a - got_b).abs().max()}"
        compared += 1
        if rng.random() < 0.6:  # a draft that verification rejects: different in each, then undone
            size = rng.randint(1, 6)
            draft = [rng.randrange(low, vocab) for _ in range(size)]
            a.extend(draft)
            b.extend([low + (t - low + 1) % (vocab - low) for t in draft])
            keep = rng.randint(max(0, a.length - size - 3), a.length - size)  # sometimes drops kept tokens too
            a.truncate(keep)
            b.truncate(keep)
            assert a.length == b.length == keep
    return compared


def chi_square_pvalue(counts: dict, dist: dict) -> float:
    """Chi-square p-value of sampled outcome ``counts`` against exact probabilities ``dist``.

    Outcomes expected fewer than 5 times are pooled into one cell, so the chi-square
    approximation holds; expectations are rescaled to the observed total (float rounding).
    """
    from scipy.stats import chisquare

    samples = sum(counts.values())
    observed, expected = [], []
    rare_obs = rare_exp = 0.0
    for seq, prob in dist.items():
        if prob * samples < 5:
            rare_obs += counts.get(seq, 0)
            rare_exp += prob * samples
        else:
            observed.append(counts.get(seq, 0))
            expected.append(prob * samples)
    if rare_exp > 0:
        observed.append(rare_obs)
        expected.append(rare_exp)
    scale = sum(observed) / sum(expected)
    return float(chisquare(observed, [e * scale for e in expected]).pvalue)


def sequence_distribution(lm: ToyLM, prompt: list[int], length: int, params) -> dict[tuple[int, ...], float]:
    """The exact probability of every continuation of ``length`` tokens that ``lm`` samples after
    ``prompt`` (``params``: a :class:`~specdec.sampling.SamplingParams`), for chi-square tests."""
    import itertools

    from specdec.sampling import logits_to_probs

    dist = {}
    for seq in itertools.product(range(lm.vocab_size), repeat=length):
        ctx, prob = list(prompt), 1.0
        for tok in seq:
            prob *= float(logits_to_probs(lm.logits(ctx), params)[tok])
            ctx.append(tok)
        dist[seq] = prob
    return dist


def plain_tokens(lm: ToyLM, prompt: list[int], config: DecodeConfig) -> list[int]:
    return decode(lm.backend(), prompt, config).token_ids


@pytest.fixture(scope="session")
def tiny_llama():
    """A 2-layer random-weight Llama in float64: batched and incremental forwards agree to ~1e-15."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(cfg).to(torch.float64).eval()


@pytest.fixture(scope="session")
def tiny_gemma3():
    """A 2-layer random Gemma 3 with a 6-token sliding window, so rollbacks cross the window."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=6,
                           layer_types=["sliding_attention", "full_attention"],
                           max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return Gemma3ForCausalLM(cfg).to(torch.float64).eval()


def _tiny_tokenizer(corpus: list[str], vocab_size: int):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=vocab_size, min_frequency=1,
                            special_tokens=["<pad>", "<s>", "</s>"], show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<s>assistant:{% endif %}")
    return tok


CORPUS = ["the quick brown fox jumps over the lazy dog " * 3, "speculative decoding drafts and verifies",
          "hello world, hello there; general kenobi", "0123456789 + - * / = ( ) ."]


def _save_tiny_model(path: Path, corpus: list[str], seed: int) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _tiny_tokenizer(corpus, 300)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A transformers folder (random tiny Llama + byte-level BPE tokenizer with a chat template)."""
    return _save_tiny_model(tmp_path_factory.mktemp("tiny-a"), CORPUS, seed=1)


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory) -> Path:
    """Another tiny model with the same tokenizer as ``tiny_model_dir`` (different weights)."""
    return _save_tiny_model(tmp_path_factory.mktemp("tiny-draft"), CORPUS, seed=2)


@pytest.fixture(scope="session")
def tiny_other_vocab_dir(tmp_path_factory) -> Path:
    """A tiny model whose tokenizer differs from ``tiny_model_dir``'s."""
    return _save_tiny_model(tmp_path_factory.mktemp("tiny-b"), ["completely different text " * 5,
                                                                 "zebra yak xylophone"], seed=3)


@pytest.fixture(scope="session")
def shared_model():
    """Real models loaded once for the whole run, for the tests that only generate with them:
    ``shared_model(name, backend)``. What a test leaves behind (learned acceptance tables, the
    recycled table, cached prompts) changes how fast a later generation is, never its tokens; a test
    that counts cached prompt tokens forgets the prompts first (``model.loaded.forget_prompts()``),
    and one that changes a load's options or the environment before loading loads its own."""
    import specdec

    loaded: dict[tuple[str, str], object] = {}

    def get(name: str, backend: str = "llamacpp"):
        if (name, backend) not in loaded:
            loaded[name, backend] = specdec.load(name, backend=backend)
        return loaded[name, backend]

    return get


@pytest.fixture(scope="session")
def plain_decoding():
    """Plain decoding's answer, ``plain_decoding(model, prompt, **options)``, computed once a session
    for each model, prompt and options: the reference several tests (and parametrizations) compare
    speculation with, on real models where one generation takes seconds. Plain decoding's tokens
    depend only on those (what earlier generations left behind changes their speed, never their
    tokens: ``shared_model``); the result is shared, not to be changed."""
    answers: dict = {}

    def get(model, prompt, **options):
        key = (id(model), prompt if isinstance(prompt, str) else tuple(prompt), tuple(sorted(options.items())))
        if key not in answers:
            answers[key] = (model, model.generate(prompt, drafter="none", **options))  # model: keeps its id taken
        return answers[key][1]

    return get


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    """The tiny transformers model, loaded once per test module (its learned tables carry over)."""
    import specdec

    return specdec.load(str(tiny_model_dir))


@pytest.fixture()
def no_loading(monkeypatch) -> list:
    """Fails a CLI run that loads model weights (what it checks must be refused before that);
    the list records the attempts."""
    calls: list = []

    def load(*args, **kwargs):
        calls.append(args)
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("specdec.api.load", load)
    return calls


@contextlib.contextmanager
def serving(app, timeout: float = 60) -> Iterator[str]:
    """Run an ASGI ``app`` with uvicorn on a free loopback port in a thread; yields its base URL and
    stops it afterwards."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + timeout
    while not server.started:
        assert time.time() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
