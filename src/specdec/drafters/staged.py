"""Drafting the drafter (staged speculative decoding, Spector & Re 2023): a model drafter whose own
token-by-token drafting is itself sped up by speculation with the n-gram index.

Between two of its tokens the draft model would run one forward each. Instead, the n-gram index
guesses how the draft model will go on, and one draft-model forward over [last token, guesses...]
checks them all: the draft model draws its token at each position from its own logits there (with
the same per-position randomness as :class:`~specdec.drafters.model.ModelDrafter`), and every
guess equal to that draw saves a forward. The draft is therefore token for token the one the
model drafter would have proposed; only the number of draft-model forwards changes, and the
target's verification downstream is untouched, so decoding stays lossless.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdec.backends.base import Backend
from specdec.drafters.base import StopDrafting
from specdec.drafters.base import Drafter
from specdec.drafting.draft_model import bridged, draft_backend, draft_costs
from specdec.drafting.draft_tokens import decile
from specdec.drafting.suffix_index import SuffixIndex
from specdec.drafters.model import ModelDrafter
from specdec.registry import DraftRequest, drafter
from specdec.sampling import Sampler
from specdec.types import Draft

MAX_GUESS = 8  # n-gram guesses checked per draft-model forward


class StagedDrafter(ModelDrafter):
    """A :class:`ModelDrafter` that lets an n-gram index draft for it (chains only).

    ``Draft.extra`` reports the inner speculation: guesses checked and guesses the draft model
    agreed with; ``Draft.forwards`` counts draft-model forwards, as for the model drafter.
    """

    name = "staged"

    def __init__(self, *args, max_guess: int = MAX_GUESS, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tree = False
        self.max_guess = max_guess
        self.index = SuffixIndex()  # guesses the draft model's next tokens

    def begin(self, prompt: Sequence[int], sampler: Sampler, target: Backend | None = None) -> None:
        super().begin(prompt, sampler, target)
        self.index = SuffixIndex()

    def propose(self, tokens: Sequence[int], k: int, stop: StopDrafting | None = None) -> Draft:
        k = self._budget(tokens, k)
        if k <= 0:
            return Draft([])
        tokens = list(tokens)
        with self.backend.busy():
            return self._propose_staged(tokens, k, stop)

    def _propose_staged(self, tokens: list[int], k: int, stop: StopDrafting | None) -> Draft:
        rows = [self._sync(tokens)]  # rows[j]: the draft model's logits after the j-th token fed
        guess: list[int] = []
        out = self._new_draft()
        forwards, guessed, agreed, done = 1, 0, 0, False
        while True:
            # Draw along the rows of the last forward while the guesses match the draws.
            for j, row in enumerate(rows):
                q = self._q(row)
                tok = self.sampler.draft_token(q, len(tokens) + len(out.tokens))
                out.add(tok, q, (decile(q[tok]),), self.table)
                done = len(out.tokens) == k or (stop is not None and stop(out.confidence))
                if done or j == len(guess) or guess[j] != tok:
                    break
                agreed += 1
            # The cache holds the guesses up to the first miss: keep the context and the draft but
            # its last token, which the next forward feeds.
            self.backend.truncate(len(tokens) + len(out.tokens) - 1)
            self.cached = tokens + out.tokens[:-1]
            if done:
                break
            guess = self.index.guess(tokens, out.tokens, min(k - len(out.tokens) - 1, self.max_guess))
            guessed += len(guess)
            rows = list(self.backend.extend([out.tokens[-1], *guess]))
            self.cached += [out.tokens[-1], *guess]
            forwards += 1
        return self.notes.keep(out.draft(forwards, extra={"guessed": guessed, "guess_agreed": agreed}), out.features)


@drafter("staged", "a draft model (--draft-model) whose own drafting is sped up by the n-gram index: the same "
                   "draft in fewer draft-model forwards", needs_draft_model=True, order=25)
def _build_staged(request: DraftRequest) -> Drafter:
    backend, table, release = draft_backend(request)
    return bridged(request, StagedDrafter(backend, table, release=release, costs=draft_costs(request)))
