"""What drafters share: acceptance estimates (``acceptance``), a draft model's backend, cost and
vocabulary bridge (``draft_model``, ``cross``), a draft built token by token (``draft_tokens``),
best-first trees (``grow``), the n-gram memory of earlier outputs (``memory``) and the self
drafter's head and timings (``self_head``, ``self_timing``). The drafters themselves are in
:mod:`specdec.drafters`, one file each."""
