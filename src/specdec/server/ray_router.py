"""Routing ``specdec serve --ray``'s requests by prompt prefix.

The ingress reads a request's body, takes its routing text out of it (:func:`routing_text`: a
completion's prompt, a chat's messages) and hands the model replicas a :class:`Routed` request
through a deployment handle. The handle routes with :class:`PrefixRouter`, Ray Serve's
``PrefixCacheAffinityRouter``: a request whose prompt shares a prefix with earlier ones goes to the
replica that served them while the queue lengths differ by at most ``imbalanced_threshold``,
otherwise to the less loaded of two replicas.
"""

import json
import time
from dataclasses import dataclass
from typing import Any

PREFIX_CHARS = 2000  # the routing key: the prompt's first characters


@dataclass
class Routed:
    """An HTTP request as the ingress hands it to a model replica. ``prompt`` is the routing key
    (Ray's prefix router reads an argument's ``prompt``); None for requests without one."""

    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    prompt: str | None = None


def routing_text(path: str, body: bytes) -> str | None:
    """The text requests are routed by: a completion's prompt, a chat's messages' text."""
    if not path.endswith("completions"):
        return None
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    text: Any = None
    if path.endswith("chat/completions"):
        messages = data.get("messages")
        if isinstance(messages, list):
            parts = []
            for m in messages:
                content = m.get("content") if isinstance(m, dict) else None
                if isinstance(content, list):
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict)
                                      and isinstance(p.get("text"), str))
                if isinstance(content, str):
                    parts.append(f"{m.get('role')}:{content}\n")
            text = "".join(parts)
    else:
        text = data.get("prompt")
        if isinstance(text, list):
            text = json.dumps(text)
    return text[:PREFIX_CHARS] if isinstance(text, str) and text else None


try:  # ray.serve.llm.request_router re-exports it, but that module needs pyarrow (ray[llm]); Ray is pinned
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import \
        PrefixCacheAffinityRouter as _PrefixBase
except ImportError:  # without Ray this module still imports (``specdec serve --ray`` says what is missing)
    _PrefixBase = object


class PrefixRouter(_PrefixBase):
    """Ray's prefix-affinity router on :class:`Routed` requests: requests without a prompt
    (health, models, metrics, bad bodies) go by load alone."""

    def _extract_text_from_request(self, pending_request):
        for arg in pending_request.args:  # by shape: the ingress's Routed may be a by-value copy of the class
            if hasattr(arg, "prompt") and hasattr(arg, "body"):
                return arg.prompt or None
        return None

    async def _choose_replica_for_request(self, pending_request, *, is_retry: bool = False):
        # Ray calls on_request_routed (which records the prompt against the replica) only with
        # strict max_ongoing_requests, off by default: record every routed prompt here instead.
        # Awaited, never ray.get: this runs on the event loop that routes every request of the
        # ingress's process, and a blocking wait on the tree actor would stall all of them.
        replica = await super()._choose_replica_for_request(pending_request, is_retry=is_retry)
        text = self._extract_text_from_request(pending_request)
        if text:
            await self._tree_actor.insert.remote(text, replica.replica_id.to_full_id_str(), time.time())
        return replica

    def on_request_routed(self, pending_request, replica_id, result) -> None:
        pass  # recorded above
