"""``specdec vocab``: how well a draft model's vocabulary bridges to a target's."""

from __future__ import annotations

import argparse
import json

from specdec.errors import SpecdecError

NAME = "vocab"
ORDER = 30

SAMPLES = [
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding lets a small model draft tokens that a large model verifies in one pass.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Café, naïve, déjà vu — and 東京 or Zürich: 42% of 1,234 users agreed!",
    "Translate to German: 'Where is the train station?' -> Wo ist der Bahnhof?",
]


def add_parser(sub) -> None:
    from specdec.models import DEFAULT_MODEL

    cmd = sub.add_parser(NAME, help="compare a draft model's vocabulary with a target's",
                         description="Vocabulary sizes, the tokens both share (same text), and how often text "
                                     "re-tokenized through the draft tokenizer comes back as the target's tokens.")
    cmd.add_argument("--model", default=DEFAULT_MODEL, help=f"the target (default: {DEFAULT_MODEL})")
    cmd.add_argument("--draft-model", required=True, help="the drafter's model")
    cmd.add_argument("--questions", help="Spec-Bench jsonl whose prompts serve as sample text")
    cmd.add_argument("--limit", type=int, default=50, help="sample prompts to use from --questions (default 50)")
    cmd.add_argument("--mass", action="store_true",
                     help="also load the target and measure the share of its probability (temperature 1) that "
                          "falls on shared tokens over the sample text: it bounds acceptance with --verify rejection")
    cmd.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from specdec.commands.common import check_positive, quiet_libraries
    from specdec.models import resolve

    check_positive(args.limit, "--limit")
    # Only the tokenizers are compared: a GGUF's are read from it, no weights are converted.
    target, draft = resolve(args.model, need_hf=False), resolve(args.draft_model, need_hf=False)
    texts = SAMPLES + (_questions(args.questions, args.limit) if args.questions else [])
    quiet_libraries()
    report = vocab_report(target, draft, texts)
    if args.mass:
        report["target_mass_shared"] = shared_mass(args.model, draft, texts)
    if args.json:
        print(json.dumps(report))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{draft.name} drafting for {target.name}")
    table.add_column("")
    table.add_column("value", justify="right")
    for key, label in (("target_vocab", "target vocabulary"), ("draft_vocab", "draft vocabulary"),
                       ("intersection", "tokens with the same text in both"),
                       ("draft_share", "share of the draft vocabulary"),
                       ("same_vocabulary", "same vocabulary"),
                       ("round_trip", f"round trips exactly ({report['samples']} texts)"),
                       ("target_tokens_per_draft_token", "target tokens per draft token"),
                       ("target_mass_shared", "target probability on shared tokens")):
        if key in report:
            table.add_row(label, str(report[key]))
    Console().print(table)
    return 0


def vocab_report(target, draft, texts: list[str]) -> dict:
    """The numbers ``specdec vocab`` prints, from the two models' tokenizers alone."""
    from specdec.models import load_tokenizer
    from specdec.text import TextCodec
    from specdec.vocab import VocabBridge

    codecs = []
    for model in (target, draft):
        try:
            tok = load_tokenizer(model.tokenizer_dir)
        except (OSError, ValueError) as exc:
            raise SpecdecError(f"cannot load the tokenizer of {model.name}: {exc}") from exc
        codecs.append(TextCodec(tok, model.name))
    sizes = [_logit_width(m.tokenizer_dir, c.tokenizer) for m, c in zip((target, draft), codecs)]
    bridge = VocabBridge(codecs[0], codecs[1], sizes[0], sizes[1])
    trips = [bridge.round_trip(t) for t in texts]
    target_tokens = sum(len(codecs[0].tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    draft_tokens = sum(len(codecs[1].tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    return {"target": target.name, "draft": draft.name, "target_vocab": len(codecs[0].tokenizer),
            "draft_vocab": len(codecs[1].tokenizer), "intersection": bridge.size,
            "draft_share": round(bridge.size / len(codecs[1].tokenizer), 4),
            "same_vocabulary": codecs[0].same_vocabulary(codecs[1]),
            "samples": len(texts), "round_trip": round(sum(trips) / len(trips), 4),
            "target_tokens_per_draft_token": round(target_tokens / draft_tokens, 4) if draft_tokens else None}


def shared_mass(target: str, draft, texts: list[str]) -> float:
    """Mean share of the target's next-token probability on tokens the draft vocabulary shares."""
    import torch

    from specdec.api import load
    from specdec.vocab import VocabBridge

    from specdec.models import load_tokenizer
    from specdec.text import TextCodec

    model = load(target)
    other = TextCodec(load_tokenizer(draft.tokenizer_dir), draft.name)
    bridge = VocabBridge(model.loaded.codec, other, model.loaded.logit_width,
                         _logit_width(draft.tokenizer_dir, other.tokenizer))
    masses = []
    with model.loaded.pool.lease() as backend:
        for text in texts:
            backend.reset()
            logits = backend.extend(model.encode(text))
            masses.append(bridge.target_mass(torch.softmax(logits.float(), -1)))
    return round(float(torch.cat(masses).mean()), 4)


def _logit_width(folder, tokenizer) -> int:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        config = config.get("text_config", config) if "vocab_size" not in config else config
        return max(int(config["vocab_size"]), len(tokenizer))
    except (OSError, ValueError, KeyError, TypeError):
        return len(tokenizer)


def _questions(path: str, limit: int) -> list[str]:
    from specdec.bench.questions import load_questions

    return [q.prompt for q in load_questions(path)[:limit]]
