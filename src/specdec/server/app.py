"""The OpenAI-compatible server: :class:`Server` (a loaded model, and optional draft model, behind
the API, set up by a :class:`~specdec.server.settings.ServeConfig`) and :func:`serve_forever`.

The app is put together from :mod:`.routes` (the HTTP routes), :mod:`.schemas` (request bodies),
:mod:`.openai` (answers, chunks, usage), :mod:`.scheduler` (slots, and one target forward at a
time) and :mod:`.errors` (OpenAI-style errors, the body limit). A request runs with the server's
default :class:`~specdec.options.GenerationOptions` (the ``specdec serve`` flags), OpenAI's
sampling fields over them, then specdec's own body fields.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import replace

import anyio
from fastapi import FastAPI, Request

from specdec import option_forms
from specdec.api import Model, Output
from specdec.constraints import Spec, spec_of
from specdec.loaded import LoadedModel
from specdec.engine import DecodeRun
from specdec.errors import SpecdecError
from specdec.options import GenerationOptions
from specdec.registry import DRAFTERS, POLICIES
from specdec.server.errors import ApiError, BodyLimit, install_error_handlers
from specdec.server.metrics import ServerMetrics
from specdec.server.openai import FINISH, Answer, sse
from specdec.server.routes import Asked, router
from specdec.server.scheduler import Scheduler
from specdec.server.schemas import ChatRequest, Common, specdec_fields
from specdec.server.tools import OPEN, call_constraint, markers, supports_tools, template_messages
from specdec.server.settings import ServeConfig
from specdec.text import StopStrings, TextDeltas


# The longest answer to a request without max_tokens where the backend's context has no bound
# (a toy backend; real ones hold a bounded KV cache and run until it is full).
UNBOUNDED_ANSWER = 4096


class Server:
    """A loaded model (and optional draft model) behind the OpenAI API."""

    def __init__(self, model: Model, draft_model: Model | LoadedModel | None = None,
                 config: ServeConfig | None = None) -> None:
        self.model = model
        self.draft_model = draft_model.loaded if isinstance(draft_model, Model) else draft_model
        self.config = config or ServeConfig()
        self.config.defaults.validate()
        self.metrics = ServerMetrics()
        self.scheduler: Scheduler | None = None
        self.started = time.time()
        self._context: int | None = None  # tokens a sequence holds (context_tokens)
        self._context_lock = threading.Lock()
        loaded, draft = model.loaded, self.draft_model
        if self.config.batch is None:
            self.config = replace(self.config, batch=loaded.can_batch)
        if self.config.index_tokens and loaded.memory is None:
            # The index of earlier outputs (per API key unless shared): what a server's drafts learn
            # from its earlier answers, bounded.
            loaded.enable_memory(capacity=self.config.index_tokens)
        kv_memory, draft_memory = self.config.kv_memory, None
        if (self.config.batch and kv_memory is not None and loaded.batched is None and draft is not None
                and draft.can_batch and draft.batched is None and loaded.hf_model is not None
                and draft.hf_model is not None):
            # One budget for both models' pools (and their forwards' scratch), shared by KV bytes a token.
            from specdec.backends.kv_pool import split_budget

            kv_memory, draft_memory = split_budget(
                kv_memory, loaded.hf_model.device,
                [(m.hf_model.config, m.hf_model.dtype) for m in (loaded, draft)])
        if self.config.batch and loaded.batched is None:
            loaded.enable_batching(self.config.slots, kv_memory, self.config.max_tick_stretch,
                                   self.config.max_delay_share)
        if loaded.batched is not None:
            self.metrics.watch_batch(loaded.batched)
        self._no_trees: str | None = getattr(loaded.batched, "no_trees", None)
        if self._no_trees and self.config.defaults.tree:
            raise SpecdecError(f"--tree: {self._no_trees}")
        # The draft model's forwards too: every drafting request's draft-model forward at one draft
        # position goes into one forward (each drafter joins those batches only while it drafts).
        if self.config.batch and draft is not None and draft.can_batch and draft.batched is None:
            draft.enable_batching(self.config.slots, draft_memory)
        # The KV pools a request's sequences take pages from (the GPU batch's): one that could never
        # hold the request is a 400 before anything is streamed.
        self._pools = [b for b in (loaded.batched,) if hasattr(b, "check_fits")]
        self._draft_pools = [b for b in (getattr(draft, "batched", None),) if hasattr(b, "check_fits")]

    def warm_up(self) -> None:
        """Measure what the first request would otherwise pay for: the cost curve, first allocations."""
        defaults = self.config.defaults
        if POLICIES.get(defaults.policy).uses_costs:
            self.model.loaded.cost_model()
        self.model.generate("Hello", options=defaults.with_(max_new_tokens=2), draft_model=self.draft_model)
        self.context_tokens()
        try:  # the grammar engine's view of the tokenizer (about a second on a 152k vocabulary)
            self.model.loaded.grammar(Spec("json_object"))
        except SpecdecError:  # a tokenizer it cannot read: structured requests get the reason, in a 400
            pass

    def context_tokens(self) -> int:
        """The tokens a generation's KV cache holds, prompt and answer (read once from a sequence
        of the model: the batch's, where the server batches)."""
        with self._context_lock:  # one sequence leased at a time: the batch has no more than its slots
            if self._context is None:
                with self.model.loaded.pool.lease() as backend:
                    self._context = backend.max_length or 0
            return self._context

    def token_text(self, token: int) -> str:
        """A token's text as a response's logprobs show it."""
        return self.model.loaded.codec.decode([token])

    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """A completion's prompt as token ids (a chat's are the template's already)."""
        if not isinstance(prompt, str):
            return prompt
        try:
            return self.model.encode(prompt)
        except SpecdecError as exc:
            raise ApiError(400, str(exc), param="prompt") from None

    def names(self) -> list[str]:
        return [self.model.name]

    # -- what the routes read (specdec.server.routes.Served) ----------------------------------------
    def health(self) -> dict:
        out = {"status": "ok", "model": self.model.name, "uptime_s": round(time.time() - self.started, 1)}
        batched = self.model.loaded.batched
        if batched is not None:  # what the batch did: forwards, their rows and seconds
            out["batch"] = {"ticks": batched.ticks, "rows": batched.rows, "decode_s": round(batched.decode_s, 3)}
        return out

    def models(self) -> list[dict]:
        return [{"id": name, "object": "model", "created": int(self.started), "owned_by": "specdec"}
                for name in self.names()]

    def metrics_text(self) -> str:
        return self.metrics.render()

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """A chat's token ids (the model's chat template, with ``tools`` where given); a 400 if the
        template refuses them, or writes no tool calls this server can read."""
        codec = self.model.loaded.codec
        if tools and not supports_tools(getattr(codec.tokenizer, "chat_template", None)):
            raise ApiError(400, f"tools: the chat template of {self.model.name} writes no tool calls "
                                f"(specdec reads {OPEN} blocks, as Qwen2.5 and Hermes write them)", param="tools")
        try:
            return codec.encode_messages(template_messages(messages), tools)
        except SpecdecError as exc:
            raise ApiError(400, str(exc), param="messages") from None

    # -- requests -> generations --------------------------------------------------------------------
    def options(self, req: Common, max_new_tokens: int | None, prompt: list[int]) -> GenerationOptions:
        """The options ``req`` runs with: the server's defaults, OpenAI's fields over them, then
        specdec's own fields. A bad value is a 400 with the message the CLI gives for it, the
        option named as the body names it (``max_tokens``).

        A request without ``max_tokens`` runs until the model stops or the context is full (as
        OpenAI's API and llama-server do); ``--max-tokens``, where set, caps every request."""
        if req.model not in self.names():
            raise ApiError(404, f"model {req.model!r} is not served here (try {self.model.name!r})",
                           param="model", code="model_not_found")
        cap, context = self.config.max_tokens, self.context_tokens()
        if max_new_tokens is None:
            room = context - len(prompt) if context else UNBOUNDED_ANSWER
            if room < 1:
                raise ApiError(400, f"the prompt ({len(prompt)} tokens) leaves no room for an answer in the "
                                    f"model's context of {context} tokens", code="context_length_exceeded")
            max_new_tokens = room if cap is None else min(cap, room)
        else:
            if context and len(prompt) + max_new_tokens > context:  # OpenAI's answer too, whatever the cap
                raise ApiError(400, f"the prompt ({len(prompt)} tokens) plus max_tokens ({max_new_tokens}) exceed the "
                                    f"model's context of {context} tokens", param="max_tokens",
                               code="context_length_exceeded")
            if cap is not None:
                max_new_tokens = min(cap, max_new_tokens)
        base = self.config.defaults.with_(
            max_new_tokens=max_new_tokens,
            temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=req.seed, stop=req.stop or ())
        chosen = {o.name: getattr(req, o.name, None) for o in specdec_fields()}
        try:
            opts = option_forms.from_body(chosen, base)
        except SpecdecError as exc:
            option = getattr(exc, "option", None)
            raise ApiError(400, str(exc), param=option and option_forms.body_name(option)) from None
        if opts.tree and self._no_trees:
            raise ApiError(400, self._no_trees, param="tree")
        pools = self._pools + (self._draft_pools if DRAFTERS.get(opts.drafter).needs_draft_model else [])
        for pool in pools:
            try:
                pool.check_fits(len(prompt) + opts.max_new_tokens)
            except SpecdecError as exc:
                raise ApiError(400, str(exc), param="max_tokens") from None
        return opts

    def constraint(self, req: Common) -> Spec | None:
        """What the answer must follow: ``response_format`` (OpenAI's), or specdec's ``regex`` or
        ``grammar`` (Lark or GBNF), or tool calls where ``tool_choice`` requires one; a 400 for a
        malformed one (one that does not compile gets its 400 when the generation starts, before
        any byte is streamed)."""
        try:
            tools = req.tool_list() if isinstance(req, ChatRequest) else None
            if tools:
                return call_constraint(tools, req.choice(), req.parallel_tool_calls,
                                       markers(self.model.loaded.tokenizer))
            return spec_of(req.response_format, req.regex, req.grammar)
        except SpecdecError as exc:
            raise ApiError(400, str(exc), param="response_format") from None

    def _start(self, asked: Asked) -> DecodeRun:
        # Tenants apart unless the server shares one index (specdec.server.tenants).
        tenant = None if self.config.shared_index else asked.tenant
        try:
            return self.model.start(asked.prompt, asked.opts, draft_model=self.draft_model, tenant=tenant,
                                    constraint=asked.constraint, logprobs=asked.logprobs)
        except SpecdecError as exc:
            raise ApiError(400, str(exc)) from None

    async def _started(self, asked: Asked) -> DecodeRun:
        """A started generation; a request cancelled meanwhile still gets it, and closes it."""
        with anyio.CancelScope(shield=True):
            return await anyio.to_thread.run_sync(self._start, asked)

    async def generate(self, asked: Asked, request: Request, t0: float) -> Output:
        """The whole answer, in a slot; stops early if the client goes away. ``t0``: when the
        request came (its latency is observed once the answer is complete)."""
        async with self.scheduler.slot():
            run = await self._started(asked)
            try:
                async with aclosing(self.scheduler.steps(run)) as steps:
                    async for _ in steps:
                        if await request.is_disconnected():
                            break
            finally:
                run.close()  # no step is in flight here: the scheduler's steps are closed
                self.metrics.generation(run.result.stats)
            out = self.model.finish(run, run.result, asked.opts.stop)
        self.metrics.latency.observe(time.perf_counter() - t0)
        return out

    async def events(self, asked: Asked, answer: Answer, include_usage: bool, t0: float) -> AsyncIterator[str]:
        """Server-sent events: first the opening chunk (or "" if the answer has none) once the
        generation has started, then one chunk per step that released text, the finish reason,
        the usage if asked, [DONE]."""
        async with self.scheduler.slot():
            run = await self._started(asked)
            codec = self.model.loaded.codec
            deltas = TextDeltas(codec, StopStrings(list(asked.opts.stop), codec))
            first = True
            try:
                opening = answer.opening()
                yield sse(opening) if opening else ""
                sent = 0  # the log-probabilities streamed so far (each chunk carries its tokens')

                def new_logprobs():
                    nonlocal sent
                    if asked.logprobs is None:
                        return None
                    fresh = run.result.logprobs[sent:]
                    sent += len(fresh)
                    return fresh

                async with aclosing(self.scheduler.steps(run)) as steps:
                    async for progress in steps:
                        text = deltas.update(progress.token_ids, progress.done)
                        if text:
                            if first:
                                self.metrics.first_token.observe(time.perf_counter() - t0)
                                first = False
                            yield sse(answer.chunk(text, logprobs=new_logprobs()))
                yield sse(answer.chunk(None, FINISH[run.result.finish_reason], new_logprobs()))
                if include_usage:
                    yield sse(answer.usage_chunk(run.result.stats, run.result.seed))
                yield "data: [DONE]\n\n"
            finally:
                # Also when the client left before the first step: the run's backend (its sequence
                # in the batches) goes back now, not when the abandoned stream is collected.
                run.close()
                self.metrics.generation(run.result.stats)
                self.metrics.latency.observe(time.perf_counter() - t0)

    # -- the app ------------------------------------------------------------------------------------
    def app(self) -> FastAPI:
        """The FastAPI app (its request bodies accept every option registered by now)."""
        @asynccontextmanager
        async def lifespan(app: FastAPI):
            self.scheduler = Scheduler(self.config.slots, self.metrics, serial=not self.config.batch)
            yield

        app = FastAPI(title="specdec", lifespan=lifespan, docs_url=None, redoc_url=None)
        install_error_handlers(app, self.metrics)
        app.add_middleware(BodyLimit, limit=self.config.max_body)
        app.include_router(router(self))
        return app


def freeze_loaded() -> None:
    """Keep what is alive now out of the collector's full collections: in a server process, called
    once the models are loaded and warmed up.

    What is loaded by then (the models, PyTorch, transformers: some 250,000 objects) lives as long
    as the server. Left to the collector, each full collection walked all of it: a pause of about
    0.13 s in whichever request thread (or the batch's ticker) set it off, several times a load
    test. Frozen, a full collection walks only what requests made. Not part of
    :meth:`Server.warm_up`: a process that embeds a :class:`Server` keeps its own collector settings.
    """
    gc.collect()
    gc.freeze()


def serve_forever(server: Server, host: str, port: int) -> None:
    """Run the app with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(server.app(), host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
