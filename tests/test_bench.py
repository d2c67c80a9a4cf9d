"""``specdec bench`` end to end on a tiny transformers model: results.json's contract, plots, errors."""

from __future__ import annotations

import json

import pytest

from conftest import FakeCosts

from specdec.cli import main
from specdec.errors import SpecdecError

STATS = {"questions", "new_tokens", "tokens_per_s", "speedup", "mean_accepted_length", "acceptance_rate",
         "identical"}


@pytest.fixture()
def questions(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [
        {"question_id": 1, "category": "copy", "turns": ["the quick brown fox jumps over the lazy dog the quick"]},
        {"question_id": 2, "category": "copy", "turns": ["hello world, hello there; hello world, hello"]},
        {"question_id": 3, "category": "copy", "turns": ["not used: --limit 2 keeps the first two"]},
        {"question_id": 4, "category": "free", "turns": ["speculative decoding drafts and verifies"]},
        {"question_id": 5, "category": "free", "turns": ["0123456789 + - * / = ( ) ."], "reference": ["x"]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_tiny_bench_writes_results_and_plots(capsys, tmp_path, tiny_model_dir, questions):
    out = tmp_path / "out"
    code = main(["bench", "--model", str(tiny_model_dir), "--questions", str(questions), "--limit", "2",
                 "--max-new-tokens", "12", "--methods", "plain,ngram,ngram:k=2:policy=fixed,hf-plain,hf-lookup",
                 "--out", str(out), "--cost-curve"])
    err = capsys.readouterr().err
    assert code == 0, err
    results = json.loads((out / "results.json").read_text())
    assert results["model"] == str(tiny_model_dir) and results["backend"] == "transformers"
    # the prompts as asked and as loaded (the results index reads them from here)
    assert results["questions"] == str(questions) and results["limit"] == 2
    assert results["question_ids"] == [1, 2, 4, 5]
    assert list(results["methods"]) == ["plain", "ngram", "ngram:k=2:policy=fixed", "hf-plain", "hf-lookup"]
    for name, r in results["methods"].items():
        assert set(r) >= {"overall", "categories"}
        assert set(r["categories"]) == {"copy", "free"}
        for stats in [r["overall"], *r["categories"].values()]:
            assert STATS <= set(stats)
        assert r["overall"]["questions"] == 4
        assert r["overall"]["identical"] is True, (name, r["overall"].get("first_difference"))
        assert r["overall"]["speedup"] > 0
    assert results["methods"]["plain"]["overall"]["speedup"] == 1.0
    assert results["methods"]["plain"]["overall"]["mean_accepted_length"] == 1.0
    for name in ("ngram", "ngram:k=2:policy=fixed", "hf-lookup"):  # how the questions' speed-ups scatter
        for stats in [results["methods"][name]["overall"], *results["methods"][name]["categories"].values()]:
            low, high = stats["speedup_spread"]
            assert 0 < low <= high and isinstance(stats["within_noise"], bool)
    assert "speedup_spread" not in results["methods"]["plain"]["overall"]  # no spread against itself
    # the peers' target forwards are counted too (a forward hook), so their accepted length shows
    assert results["methods"]["hf-plain"]["overall"]["mean_accepted_length"] == 1.0
    assert results["methods"]["hf-lookup"]["overall"]["mean_accepted_length"] >= 1.0
    assert results["methods"]["hf-lookup"]["overall"]["acceptance_rate"] is None
    # The same tiny fp32 model through transformers' own generate gives our plain tokens.
    lines = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    ours = {r["question_id"]: r["token_ids"] for r in lines if r["method"] == "plain"}
    theirs = {r["question_id"]: r["token_ids"] for r in lines if r["method"] == "hf-plain"}
    assert ours == theirs
    assert {"seconds", "bounds"} <= set(results["cost_curve"])
    for png in ("speedup_by_category.png", "tokens_per_s.png", "cost_curve.png"):
        assert (out / png).stat().st_size > 1000


def test_baseline_is_added_when_missing(capsys, tmp_path, tiny_model_dir, questions):
    out = tmp_path / "out"
    assert main(["bench", "--model", str(tiny_model_dir), "--questions", str(questions), "--limit", "1",
                 "--max-new-tokens", "4", "--methods", "ngram", "--out", str(out)]) == 0
    assert list(json.loads((out / "results.json").read_text())["methods"]) == ["plain", "ngram"]


@pytest.mark.parametrize("argv, message", [
    (["--methods", "warp-drive"], "unknown method"),
    (["--methods", "ngram:k=0"], "method 'ngram:k=0': num_draft must be >= 1, got 0"),
    (["--methods", "ngram:speed=11"], "method 'ngram:speed=11': unknown option 'speed'"),
    (["--methods", "ngram:temperature=0.5"], "unknown option 'temperature'"),  # a bench flag, for every method
    (["--methods", "ngram:policy=greedy"], "method 'ngram:policy=greedy': unknown policy 'greedy'"),
    (["--methods", "plain:tree"], "plain decoding drafts nothing to branch"),
    (["--methods", "ngram:tiny"], "ngram takes no model"),
    (["--methods", "model"], "write model:ALIAS"),
    (["--methods", "hf-lookup:k=0"], "k must be a whole number >= 1"),
    (["--methods", "llamacpp-plain"], "runs on --backend llamacpp"),
    # (the last --model wins: a GGUF alias llama.cpp can run, refused before anything is fetched)
    (["--methods", "hf-plain", "--model", "smollm2-135m", "--backend", "llamacpp"], "runs on --backend transformers"),
    (["--methods", "plain", "--backend", "llamacpp"], "--backend llamacpp runs a GGUF file"),
    (["--methods", "plain", "--categories", "nope"], "no questions in categories nope"),
    (["--methods", "plain", "--limit", "0"], "--limit"),
    (["--methods", "plain", "--min-seconds", "-1"], "--min-seconds must be >= 0, got -1.0"),
    ([], "give --methods"),
])
def test_bench_errors(capsys, tmp_path, tiny_model_dir, questions, argv, message):
    code = main(["bench", "--model", str(tiny_model_dir), "--questions", str(questions),
                 "--out", str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_missing_questions_file(capsys, tiny_model_dir, tmp_path):
    code = main(["bench", "--model", str(tiny_model_dir), "--questions", str(tmp_path / "none.jsonl"),
                 "--methods", "plain"])
    assert code != 0 and "questions file not found" in capsys.readouterr().err


def test_divergences_name_the_first_difference_and_its_margin_only_when_asked():
    from specdec.backends.toy import ToyLM
    from specdec.bench.methods import Method, RunResult
    from specdec.bench.questions import Question
    from specdec.bench.runner import BenchRun, summarize
    from specdec.stats import GenerationStats

    class Fixed(Method):
        def __init__(self, name, family="ours"):
            self.name, self.family = name, family

        def run(self, prompt_ids, max_new_tokens, seed):
            raise AssertionError("not run here")

    lm = ToyLM(vocab_size=16, seed=3)
    calls = []

    class FakeModel:
        @property
        def loaded(self):  # the loaded side is the fake itself
            return self

        def backend(self):
            calls.append(1)
            return lm.backend()

    plain, spec = Fixed("plain"), Fixed("ngram")
    qs = [Question(1, "a", "x"), Question(2, "b", "y")]
    bench = BenchRun(qs, [[1, 2], [3, 4]], [plain, spec], greedy=True)
    bench.runs = {"plain": [RunResult([5, 6, 7], 1.0), RunResult([8, 9], 1.0)],
                  "ngram": [RunResult([5, 6, 7], 0.5, GenerationStats(new_tokens=3, target_forwards=2, drafted=2,
                                                                      accepted=2, draft_steps=1)),
                            RunResult([8, 1], 0.5, GenerationStats(new_tokens=2, target_forwards=2, drafted=1,
                                                                   draft_steps=1, rejecting_steps=1))]}
    live = summarize(bench, FakeModel(), divergences=False)
    assert calls == [] and "divergences" not in live["ngram"]
    assert live["ngram"]["overall"]["identical"] is False
    assert live["ngram"]["overall"]["first_difference"] == {"question_id": 2, "category": "b", "position": 1}
    assert live["ngram"]["categories"]["a"]["identical"] is True
    final = summarize(bench, FakeModel())
    (div,) = final["ngram"]["divergences"]
    logits = lm.backend().extend([3, 4, 8])[-1].topk(2).values
    assert div["question_id"] == 2 and div["position"] == 1
    assert div["top2_margin"] == pytest.approx(float(logits[0] - logits[1]), abs=1e-4)



def test_the_spread_of_per_question_speedups_marks_noise_in_results_and_table():
    from rich.console import Console

    from specdec.bench.methods import Method, RunResult
    from specdec.bench.questions import Question
    from specdec.bench.runner import BenchRun, summarize
    from specdec.commands.bench import results_table

    class Fixed(Method):
        def __init__(self, name):
            self.name, self.family = name, "ours"

        def run(self, prompt_ids, max_new_tokens, seed):
            raise AssertionError("not run here")

    methods = [Fixed("plain"), Fixed("ngram"), Fixed("recycle")]
    qs = [Question(i, "a", "x") for i in range(4)]
    bench = BenchRun(qs, [[1]] * 4, methods, greedy=False)
    bench.runs = {"plain": [RunResult([1], 1.0)] * 4,
                  "ngram": [RunResult([1], w) for w in (0.5, 0.5, 0.4, 0.5)],  # 2x or more on every question
                  "recycle": [RunResult([1], w) for w in (0.5, 2.0, 0.5, 2.0)]}  # 2x on half, 0.5x on the rest
    summary = summarize(bench, None)
    ngram, recycle = summary["ngram"]["overall"], summary["recycle"]["overall"]
    assert ngram["speedup_spread"] == [2.0, 2.125] and ngram["within_noise"] is False
    assert recycle["speedup_spread"] == [0.5, 2.0] and recycle["within_noise"] is True
    console = Console(width=200, record=True)
    console.print(results_table(summary))
    rows = {line.split()[1]: line for line in console.export_text().splitlines() if line.split()[1:2] == ["a"]}
    cells = rows["a"].split("│")  # category, plain, ngram, recycle
    assert "~" not in cells[2] + cells[3] and "~" in cells[4]


def run_refused(capsys, tiny_model_dir, questions, *argv) -> tuple[int, list[str]]:
    code = main(["bench", "--model", str(tiny_model_dir), "--questions", str(questions), "--methods", "plain",
                 *argv])
    return code, capsys.readouterr().err.strip().splitlines()


def _row(**row) -> bytes:
    return json.dumps({"question_id": 1, "category": "x", **row}, ensure_ascii=False).encode()


@pytest.mark.parametrize("content, message", [
    (_row(turns=["caf\u00e9"]).decode().encode("latin-1"), "is not UTF-8 text"),
    (_row(turns="abc"), "'turns' must be a non-empty list of strings"),
    (_row(turns=["fine", 3]), "'turns' must be a non-empty list of strings"),
    (_row(turns=[]), "'turns' must be a non-empty list of strings"),
    (b"[1, 2, 3]", "not a Spec-Bench question"),
], ids=["latin-1", "turns is a string", "a turn is a number", "no turns", "not an object"])
def test_bad_questions_files_are_refused_before_the_model_loads(capsys, tmp_path, tiny_model_dir, no_loading,
                                                                content, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    code, err = run_refused(capsys, tiny_model_dir, path, "--out", str(tmp_path / "o"))
    assert no_loading == []
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: {path}") and message in err[0], err


@pytest.mark.parametrize("out, message", [
    ("file.txt", "is a file: give a folder"),
    ("file.txt/out", "cannot write to this folder"),  # under a regular file: fails even as root
], ids=["an existing file", "unwritable"])
def test_bad_out_is_refused_before_the_model_loads(capsys, tmp_path, tiny_model_dir, questions, no_loading,
                                                   out, message):
    (tmp_path / "file.txt").write_text("a regular file")
    code, err = run_refused(capsys, tiny_model_dir, questions, "--out", str(tmp_path / out))
    assert no_loading == []
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --out ") and message in err[0], err
    assert (tmp_path / "file.txt").read_text() == "a regular file"


def test_max_new_tokens_beyond_the_context_is_refused_before_the_model_loads(capsys, tmp_path, tiny_model_dir,
                                                                             questions, no_loading):
    code, err = run_refused(capsys, tiny_model_dir, questions, "--out", str(tmp_path / "o"),
                            "--max-new-tokens", "100000")
    assert no_loading == []
    assert code == 2 and len(err) == 1 and "does not fit the context of" in err[0], err


def test_repeats_run_every_method_r_times_and_keep_the_fastest():
    from specdec.bench.methods import Method, RunResult
    from specdec.bench.questions import Question
    from specdec.bench.runner import run_bench

    class Timed(Method):
        def __init__(self, name, walls):
            self.name, self.family, self.walls, self.calls = name, "ours", list(walls), 0

        def run(self, prompt_ids, max_new_tokens, seed):
            self.calls += 1
            return RunResult([1, 2], self.walls.pop(0) if max_new_tokens > 4 else 0.0)

    class FakeModel(FakeCosts):
        has_chat_template = False

        @property
        def loaded(self):  # the loaded side is the fake itself
            return self

        def encode(self, text, chat=False):
            return [1, 2, 3]

    plain, spec = Timed("plain", [3.0, 1.0, 2.0, 5.0, 4.0, 6.0]), Timed("ngram", [2.0, 2.5, 0.5, 1.0, 1.0, 1.0])
    qs = [Question(1, "a", "x"), Question(2, "b", "y")]
    bench = run_bench(FakeModel(), [plain, spec], qs, 8, greedy=True, repeats=3)
    assert plain.calls == spec.calls == 1 + 2 * 3  # one warm-up, then R per question
    assert [r.wall_s for r in bench.runs["plain"]] == [1.0, 4.0]
    assert [r.wall_s for r in bench.runs["ngram"]] == [0.5, 1.0]


def test_min_seconds_adds_rounds_to_short_questions_only():
    """A question whose runs are short gets rounds until every method has spent min_seconds on it
    (at most MAX_ROUNDS); a long one keeps its R rounds; the fastest run still counts."""
    from specdec.bench.methods import Method, RunResult
    from specdec.bench.questions import Question
    from specdec.bench.runner import MAX_ROUNDS, run_bench

    class Timed(Method):
        def __init__(self, name, walls):
            self.name, self.family, self.walls, self.calls = name, "ours", walls, []

        def run(self, prompt_ids, max_new_tokens, seed):
            if max_new_tokens <= 4:
                return RunResult([1], 0.0)  # the warm-up
            wall = self.walls[prompt_ids[0]].pop(0)
            self.calls.append(prompt_ids[0])
            return RunResult([1, 2], wall)

    class FakeModel(FakeCosts):
        has_chat_template = False

        @property
        def loaded(self):
            return self

        def encode(self, text, chat=False):
            return [ord(text[0]) - ord("a")]

    # Question a: runs of 5 s (3 rounds reach min_seconds=4); b: 1 s for plain, 0.5 s for ngram
    # (ngram needs 8 rounds to reach 4 s; the 6th is its fastest); c: never reaches it (capped).
    plain = Timed("plain", {0: [5.0] * 3, 1: [1.0] * 8, 2: [0.1] * MAX_ROUNDS})
    spec = Timed("ngram", {0: [4.0, 5.0, 4.5], 1: [0.5] * 5 + [0.3] + [0.6] * 2, 2: [0.1] * MAX_ROUNDS})
    qs = [Question(1, "x", "a"), Question(2, "x", "b"), Question(3, "x", "c")]
    bench = run_bench(FakeModel(), [plain, spec], qs, 8, greedy=True, repeats=3, min_seconds=4.0)
    for method in (plain, spec):
        assert method.calls == [0] * 3 + [1] * 8 + [2] * MAX_ROUNDS
    assert [r.wall_s for r in bench.runs["ngram"]] == [4.0, 0.3, 0.1]
    assert [r.wall_s for r in bench.runs["plain"]] == [5.0, 1.0, 0.1]


def test_a_crashing_peer_is_dropped_and_reported_while_ours_must_not_crash():
    from specdec.bench.methods import Method, RunResult
    from specdec.bench.questions import Question
    from specdec.bench.runner import run_bench

    class Flaky(Method):
        def __init__(self, name, family, fail_at):
            self.name, self.family, self.fail_at, self.calls = name, family, fail_at, 0

        def run(self, prompt_ids, max_new_tokens, seed):
            self.calls += 1
            if self.calls == self.fail_at:
                raise RuntimeError("size of tensor a (515) must match b (517)")
            return RunResult([1, 2], 1.0)

    class FakeModel(FakeCosts):
        has_chat_template = False

        @property
        def loaded(self):  # the loaded side is the fake itself
            return self

        def encode(self, text, chat=False):
            return [1, 2, 3]

    qs = [Question(1, "a", "x"), Question(2, "b", "y"), Question(3, "c", "z")]
    plain, peer = Flaky("hf-plain", "hf", 0), Flaky("hf-assisted:x", "hf", 3)
    bench = run_bench(FakeModel(), [plain, peer], qs, 8, greedy=True)
    assert [m.name for m in bench.methods] == ["hf-plain"] and len(bench.runs["hf-plain"]) == 3
    assert "hf-assisted:x" not in bench.runs and "515" in bench.failed["hf-assisted:x"]
    with pytest.raises(RuntimeError):
        run_bench(FakeModel(), [Flaky("plain", "ours", 2)], qs, 8, greedy=True)


def test_each_method_drafts_only_from_what_it_learned_itself_on_earlier_questions():
    """No method may profit from another's pass over the same question (a recycled table primed
    with the answer), nor a repeat from the repeat before it: each sees its own earlier questions."""
    from specdec.bench.methods import Method, RunResult
    from specdec.bench.questions import Question
    from specdec.bench.runner import run_bench
    from specdec.context import Learned, LearnedSlot

    recycled = LearnedSlot("recycle-next", dict)

    class FakeModel(FakeCosts):
        has_chat_template = False

        @property
        def loaded(self):  # the loaded side is the fake itself
            return self
        learned = Learned()

        def encode(self, text, chat=False):
            return [ord(text[0])]

    model = FakeModel()

    class Learner(Method):
        def __init__(self, name):
            self.name, self.family, self.saw = name, "ours", []

        def run(self, prompt_ids, max_new_tokens, seed):
            table = model.loaded.learned.get(recycled)  # what a recycling drafter's slot would hold
            self.saw.append(sorted(table))
            table[prompt_ids[0]] = [self.name]
            return RunResult([1], 1.0)

    a, b = Learner("plain"), Learner("recycle")
    qs = [Question(1, "a", "x"), Question(2, "b", "y")]
    run_bench(model, [a, b], qs, 8, greedy=True, repeats=2)
    warm, x = ord("S"), ord("x")
    for method in (a, b):  # warm-up, then two repeats per question, each from the same state
        assert method.saw == [[], [warm], [warm], [warm, x], [warm, x]]


@pytest.fixture()
def span_drafter():
    """A drafter declared as a drafter file would, with an option of its own (``span``)."""
    from specdec import options
    from specdec.drafters.base import Drafter
    from specdec.options import Option, at_least
    from specdec.registry import DRAFTERS, DraftRequest, drafter
    from specdec.types import Draft

    class Repeat(Drafter):
        name = "span-test"

        def __init__(self, span: int) -> None:
            self.span = span

        def propose(self, tokens, k, stop=None) -> Draft:
            return Draft(list(tokens[-self.span:])[:k])

    @drafter("span-test", "test drafter: drafts the last tokens again", options=[
        Option("span", int, 2, "how many of the last tokens to draft again", at_least(1), metavar="N")])
    def build(request: DraftRequest) -> Drafter:
        return Repeat(request.options["span"])

    yield "span-test"
    DRAFTERS.remove("span-test")
    options.unregister("span-test")


def test_a_drafters_own_option_works_in_a_method_spec(span_drafter, tiny):
    from specdec.bench.methods import MethodFactory, method_forms, our_options
    from specdec.options import GenerationOptions

    assert "span-test[:k=K][:policy=P][:tree][:verify=V][:span=N]" in method_forms()
    assert "ngram[:k=K][:policy=P][:tree][:verify=V]" in method_forms()  # only its owner's form shows it
    base = GenerationOptions(temperature=0.5, top_k=7, seed=9)
    chosen, alias = our_options("span-test:span=3:tree:k=2:policy=fixed", base)
    assert alias is None
    assert (chosen.drafter, chosen["span"], chosen.tree) == ("span-test", 3, True)
    assert (chosen.num_draft, chosen.policy) == (2, "fixed")
    assert (chosen.temperature, chosen.top_k, chosen.seed) == (0.5, 7, 9)  # the bench's sampling, kept
    with pytest.raises(SpecdecError, match=r"^method 'span-test:span=0': span must be >= 1, got 0$"):
        our_options("span-test:span=0", base)
    # Run as a bench method: our stats come along, and greedy output is plain decoding's.
    factory = MethodFactory(tiny, "tiny", "transformers", "float32", GenerationOptions())
    ids = tiny.encode("the quick brown fox jumps over the lazy dog the quick brown fox")
    plain = factory.build("plain").run(ids, 12, None)
    spec = factory.build("span-test:span=3").run(ids, 12, None)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.new_tokens == len(spec.token_ids) and spec.target_forwards == spec.stats.target_forwards


def test_a_benchmarks_totals_are_its_runs_steps_counted_once(tiny):
    """GenerationStats.total (what the bench reports per category) equals counting every step of
    every run into one GenerationStats: the numbers come from one place."""
    from specdec.stats import GenerationStats

    # A fixed K verifies every draft: the adaptive policy may decline them all on a busy machine,
    # and a total of nothing checks nothing.
    outs = [tiny.generate(p, max_new_tokens=20, drafter="ngram", tree=tree, num_draft=4, policy="fixed")
            for p, tree in (("hello world, hello there; hello world, hello", False),
                            ("the quick brown fox jumps over the lazy dog the quick", True))]
    total = GenerationStats.total(o.stats for o in outs)
    counted = GenerationStats()
    for o in outs:
        for step in o.trace:
            counted.add_step(step)
    timings = ("prompt_tokens", "prefill_s", "wall_s", "draft_s", "verify_s")
    assert {k: v for k, v in vars(total).items() if k not in timings} == \
        {k: v for k, v in vars(counted).items() if k not in timings}
    assert total.new_tokens == sum(len(o.token_ids) for o in outs)
    report = total.bench_dict()
    assert report["mean_accepted_length"] == round(total.new_tokens / total.target_forwards, 3)
    assert report["alpha"] == round(total.accepted / (total.accepted + total.rejecting_steps), 4)


def test_generation_rate_after_the_prompt_and_its_ratio_to_the_baseline():
    """gen_tokens_per_s sums each run's tokens and seconds after the prompt (RunResult.gen_s), next to
    the wall-time tokens_per_s; gen_speedup is its ratio to the family's plain method's."""
    from specdec.bench.methods import Method, RunResult
    from specdec.bench.questions import Question
    from specdec.bench.runner import BenchRun, summarize

    class Named(Method):
        def __init__(self, name, family):
            self.name, self.family = name, family

        def run(self, prompt_ids, max_new_tokens, seed):
            raise AssertionError("not run")

    plain, server, spec, hf = (Named("plain", "ours"), Named("llama-server-plain", "llama-server"),
                               Named("llama-server-ngram-mod", "llama-server"), Named("hf-plain", "hf"))
    qs = [Question(1, "a", "x"), Question(2, "a", "y")]
    bench = BenchRun(qs, [[1], [2]], [plain, server, spec, hf], greedy=True, runs={
        # ours: every new token over wall - prefill
        "plain": [RunResult([1] * 10, 2.0, gen_s=1.0), RunResult([1] * 10, 2.0, gen_s=1.5)],
        # llama.cpp: the tokens after the first over its predicted_ms
        "llama-server-plain": [RunResult([1] * 10, 2.0, gen_s=0.9, gen_tokens=9),
                               RunResult([1] * 10, 2.0, gen_s=0.9, gen_tokens=9)],
        "llama-server-ngram-mod": [RunResult([1] * 10, 1.5, gen_s=0.45, gen_tokens=9, peer_forwards=6,
                                             peer_drafted=8, peer_accepted=4),
                                   RunResult([1] * 10, 1.5, gen_s=0.45, gen_tokens=9, peer_forwards=10)],
        "hf-plain": [RunResult([1] * 10, 2.0), RunResult([1] * 10, 2.0)],  # no generation time known
    })
    got = {name: r["overall"] for name, r in summarize(bench, None, divergences=False).items()}
    assert got["plain"]["gen_tokens_per_s"] == 8.0 and got["plain"]["gen_speedup"] == 1.0
    assert got["llama-server-plain"]["gen_tokens_per_s"] == 10.0
    assert got["llama-server-plain"]["tokens_per_s"] == 5.0
    assert got["llama-server-ngram-mod"]["gen_tokens_per_s"] == 20.0
    assert got["llama-server-ngram-mod"]["gen_speedup"] == 2.0
    assert got["llama-server-ngram-mod"]["speedup"] == 1.333
    # its own counters: 20 tokens in 16 forwards, 4 of 8 drafted tokens accepted
    assert got["llama-server-ngram-mod"]["mean_accepted_length"] == 1.25
    assert got["llama-server-ngram-mod"]["acceptance_rate"] == 0.5
    assert got["hf-plain"]["gen_tokens_per_s"] is None and got["hf-plain"]["gen_speedup"] is None


def test_our_generation_time_is_our_wall_time_after_the_targets_prefill(tiny):
    from specdec.bench.methods import MethodFactory
    from specdec.options import GenerationOptions

    factory = MethodFactory(tiny, "tiny", "transformers", "float32", GenerationOptions())
    result = factory.build("ngram").run(tiny.encode("hello world, hello there; hello world, hello"), 12, None)
    assert result.gen_s == result.stats.wall_s - result.stats.prefill_s and 0 < result.gen_s < result.wall_s
    assert result.gen_tokens == len(result.token_ids)


def test_every_round_of_a_question_starts_from_the_same_learned_state_and_cost_curve():
    """A policy that refines the cost curve as it times forwards, and a table it learns into: the
    rounds of one question all begin where the first round began (they differ by noise, not by
    decisions), and the first round's state goes on to the next question, per method."""
    from specdec.bench.methods import Method, RunResult
    from specdec.bench.questions import Question
    from specdec.bench.runner import run_bench
    from specdec.context import Learned, LearnedSlot

    seen = LearnedSlot("rounds-seen", list)

    class Learning(Method):
        def __init__(self, name):
            self.name, self.family, self.started = name, "ours", []

        def run(self, prompt_ids, max_new_tokens, seed):
            table = model.loaded.learned.get(seen)
            curve = model.loaded.cost_model()
            self.started.append((prompt_ids[0], len(table), round(curve.unit, 6)))
            table.append(prompt_ids[0])
            curve.observe(1, curve.unit * 2)  # a slow forward: the unit moves
            return RunResult([1, 2], 1.0)

    class FakeModel(FakeCosts):
        has_chat_template = False
        learned = Learned()

        @property
        def loaded(self):
            return self

        def encode(self, text, chat=False):
            return [ord(text[0])]

    model = FakeModel()
    plain, ngram = Learning("plain"), Learning("ngram")
    run_bench(model, [plain, ngram], [Question(1, "a", "a"), Question(2, "b", "b")], 8, greedy=True, repeats=3)
    for method in (plain, ngram):
        warmup, *rounds = method.started
        first, second = rounds[:3], rounds[3:]
        assert len(set(first)) == 1 and len(set(second)) == 1  # every round from the same state
        assert first[0][1] == 1 and second[0][1] == 2  # the first round's learning carried on
        assert second[0][2] > first[0][2]  # and so did its curve


def test_the_median_round_is_reported_beside_the_fastest():
    from specdec.bench.methods import Method, RunResult
    from specdec.bench.questions import Question
    from specdec.bench.runner import run_bench, summarize

    class Timed(Method):
        def __init__(self, name, walls):
            self.name, self.family, self.walls = name, "ours", list(walls)

        def run(self, prompt_ids, max_new_tokens, seed):
            return RunResult([1, 2, 3, 4], self.walls.pop(0) if max_new_tokens > 4 else 0.0)

    class FakeModel(FakeCosts):
        has_chat_template = False

        @property
        def loaded(self):
            return self

        def encode(self, text, chat=False):
            return [1]

    plain, ngram = Timed("plain", [1.0, 3.0, 2.0]), Timed("ngram", [0.5, 4.0, 1.0])
    bench = run_bench(FakeModel(), [plain, ngram], [Question(1, "a", "x")], 8, greedy=True, repeats=3)
    summary = summarize(bench, FakeModel(), divergences=False)
    best, median = summary["ngram"]["overall"], summary["ngram"]["overall"]["median"]
    assert best["tokens_per_s"] == 8.0 and best["speedup"] == 2.0  # 4 tokens in 0.5 s, plain's 1.0 s
    assert median["tokens_per_s"] == 4.0 and median["speedup"] == 2.0  # the middle rounds: 1.0 s and 2.0 s
    single = run_bench(FakeModel(), [Timed("plain", [1.0]), Timed("ngram", [0.5])], [Question(1, "a", "x")], 8,
                       greedy=True)
    assert "median" not in summarize(single, FakeModel(), divergences=False)["ngram"]["overall"]


def test_results_go_into_bench_results_only_from_committed_code(capsys, tmp_path, tiny_model_dir, questions,
                                                                no_loading, monkeypatch):
    """A results file in bench-results/ records its commit: written from a checkout with uncommitted
    code, that commit would not reproduce it. Refused before anything loads; elsewhere allowed."""
    from specdec.commands import bench

    root = tmp_path / "checkout"
    (root / "bench-results").mkdir(parents=True)
    monkeypatch.setattr(bench, "_checkout", lambda: root)
    monkeypatch.setattr(bench, "_uncommitted", lambda where: ["src/specdec/engine.py"])
    code, err = run_refused(capsys, tiny_model_dir, questions, "--out", str(root / "bench-results" / "run"))
    assert no_loading == []
    assert code == 2 and len(err) == 1 and "uncommitted changes (src/specdec/engine.py)" in err[0], err
    bench._refuse_unpublishable(tmp_path / "elsewhere")  # outside bench-results/: allowed
    monkeypatch.setattr(bench, "_uncommitted", lambda where: [])
    bench._refuse_unpublishable(root / "bench-results" / "run")  # committed: allowed


def test_a_bench_that_fails_while_writing_its_results_leaves_the_last_ones_whole(tmp_path, monkeypatch):
    """results.json is replaced whole or not at all: a write that breaks midway (a full disk, a
    Ctrl-C) leaves the previous results readable and no temporary behind."""
    import json
    import os

    from specdec import files

    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"methods": {"plain": 1}}))

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        files.write_atomic(out / "results.json", json.dumps({"methods": {"plain": 2}}))
    assert json.loads((out / "results.json").read_text()) == {"methods": {"plain": 1}}
    assert [p.name for p in out.iterdir()] == ["results.json"]
    from specdec.commands import bench

    assert bench.write_atomic is files.write_atomic  # what the bench writes its results with


def test_bench_reads_chat_request_bodies_and_checks_each_answer_against_its_schema(tmp_path, tiny_model_dir):
    """One file of OpenAI chat request bodies drives the methods: each question's messages through
    the chat template, its own max_tokens, its response_format's schema constraining every method
    that can take one; outputs.jsonl keeps each answer's text and whether it is valid."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"],
              "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}
    rows = [{"id": "a", "max_tokens": 12, "messages": [{"role": "user", "content": "the quick brown fox"}],
             "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}},
            {"id": "b", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}]
    questions = tmp_path / "requests.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert main(["bench", "--model", str(tiny_model_dir), "--questions", str(questions), "--methods", "plain,ngram",
                 "--max-new-tokens", "6", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert all(m["overall"]["schema_valid"] == 1.0 and m["overall"]["identical"] for m in results["methods"].values())
    lines = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    answers = {(line["question_id"], line["method"]): line for line in lines}
    assert answers[("a", "plain")]["valid"] and json.loads(answers[("a", "plain")]["text"])["n"] in range(10)
    assert "valid" not in answers[("b", "plain")] and len(answers[("b", "ngram")]["token_ids"]) <= 6


def test_the_llama_server_peer_sends_the_schema_and_other_peers_cannot_take_one():
    from specdec.bench.peers.llama_server import LlamaServerMethod
    from specdec.bench.runner import run_question
    from specdec.bench.questions import Question
    from specdec.errors import SpecdecError
    from specdec.options import GenerationOptions

    sent = []

    class Server:
        def complete(self, body):
            sent.append(body)
            return {"tokens": [5], "timings": {"prompt_ms": 1.0, "prompt_n": 2, "predicted_ms": 1.0, "predicted_n": 1,
                                               "predicted_per_second": 1.0}, "tokens_cached": 0}

    schema = {"type": "object"}
    question = Question("q", "json", "hi", schema=schema, max_tokens=7)
    method = LlamaServerMethod("llama-server-plain", Server(), GenerationOptions().validate())
    run_question(method, None, question, [1, 2], 64, None)
    assert sent[0]["json_schema"] == schema and sent[0]["n_predict"] == 7

    class Peer(LlamaServerMethod):
        takes_schema = False

    with pytest.raises(SpecdecError, match="cannot constrain an answer to a JSON Schema"):
        run_question(Peer("hf-plain", Server(), GenerationOptions().validate()), None, question, [1, 2], 64, None)


def test_a_results_file_is_dirty_only_when_the_code_changed(tmp_path, monkeypatch):
    """provenance()'s commit carries +dirty when the checkout's code (src/, scripts/, patches, the
    build files) has uncommitted changes, not when results, pages or notes do: make results' later
    workloads run after its earlier ones rewrote their tracked results folders."""
    import subprocess

    from specdec.commands import bench

    root = tmp_path / "checkout"
    (root / "src").mkdir(parents=True)
    (root / "bench-results" / "run").mkdir(parents=True)
    (root / "src" / "code.py").write_text("x = 1\n")
    (root / "bench-results" / "run" / "results.json").write_text("{}\n")
    (root / "CHANGELOG.md").write_text("# c\n")

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git("rev-parse", "--short=12", "HEAD").strip()
    monkeypatch.setattr(bench, "_checkout", lambda: root)
    (root / "bench-results" / "run" / "results.json").write_text('{"new": 1}\n')
    (root / "CHANGELOG.md").write_text("# c\n\nmore\n")
    assert bench.provenance()["commit"] == head
    (root / "src" / "code.py").write_text("x = 2\n")
    assert bench.provenance()["commit"] == head + "+dirty"
