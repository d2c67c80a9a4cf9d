"""What drafters share: the interface itself (``drafter``), acceptance estimates (``acceptance``),
the suffix index of the context and of earlier outputs that every drafter looking text up drafts
from (``suffix_index``), a draft model's backend, cost and vocabulary bridge (``draft_model``,
``cross``), a draft built token by token (``draft_tokens``), best-first trees (``grow``) and the
self drafter's head and timings (``self_head``, ``self_timing``). The drafters themselves are in
:mod:`specdec.drafters`, one file each; nothing here imports them."""
