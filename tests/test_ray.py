"""``specdec serve --ray``: the OpenAI-compatible app on a local Ray instance (2 CPUs) with 2
replicas of the tiny model: chat and streaming through the ``openai`` client, seeded sampling equal
to the plain server's, prefix-affinity routing, per-replica memory files, fuzzed bodies, and a
replica killed under load (restarted by Ray Serve; requests on it end with a clean 5xx JSON error).
Skipped without the ``ray`` extra."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.server.app import ServeConfig, Server

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_served(tiny_model_dir, tmp_path_factory):
    """(url, memory file) of the app on a local Ray instance with 2 replicas."""
    ray = pytest.importorskip("ray")
    serve = pytest.importorskip("ray.serve")
    from specdec.server.ray_app import ModelSpec, deployments

    memory = tmp_path_factory.mktemp("ray-memory") / "memory.json"
    spec = ModelSpec(model=str(tiny_model_dir), memory=str(memory), save_every=1.0, torch_threads=1,
                     config=ServeConfig(slots=4, max_tokens=24, max_body=64 * 1024, shared_index=True))
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="error", log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(deployments(spec, replicas=2), name="specdec", route_prefix="/")
        yield f"http://127.0.0.1:{port}", memory
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def http(ray_served):
    """One HTTP client for many requests (a client per request costs its set-up each time)."""
    with httpx.Client(base_url=ray_served[0]) as session:
        yield session


@pytest.fixture(scope="module")
def client(ray_served):
    return openai.OpenAI(base_url=ray_served[0] + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def plain(tiny):
    """The single-process server's url, for comparison."""
    server = Server(tiny, config=ServeConfig(slots=4, max_tokens=24))
    uv = uvicorn.Server(uvicorn.Config(server.app(), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not uv.started:
        assert time.time() < deadline and thread.is_alive()
        time.sleep(0.02)
    yield f"http://127.0.0.1:{uv.servers[0].sockets[0].getsockname()[1]}"
    uv.should_exit = True
    thread.join(10)


def test_chat_and_streaming_equal_generate(client, tiny):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello world"}]
    expected = tiny.generate(tiny.loaded.codec.encode_messages(messages), max_new_tokens=10, drafter="none")
    out = client.chat.completions.create(model=tiny.name, messages=messages, max_tokens=10, temperature=0)
    assert out.choices[0].message.content == expected.text
    assert out.model_extra["speculative"]["target_forwards"] >= 1
    chunks = list(client.chat.completions.create(model=tiny.name, messages=messages, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.text
    assert chunks[-1].usage.completion_tokens == len(expected.token_ids)
    streamed = list(client.completions.create(model=tiny.name, prompt="the quick brown fox", max_tokens=12,
                                              temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == tiny.generate("the quick brown fox", max_new_tokens=12,
                                                                          drafter="none").text


def test_seeded_sampling_equals_the_plain_server(ray_served, plain, tiny):
    body = {"model": tiny.name, "prompt": "the quick brown fox jumps over the lazy", "max_tokens": 20,
            "temperature": 0.9, "seed": 1234, "drafter": "ngram", "num_draft": 3}
    through_ray = httpx.post(ray_served[0] + "/v1/completions", json=body, timeout=60).json()
    alone = httpx.post(plain + "/v1/completions", json=body, timeout=60).json()
    assert through_ray["choices"][0]["text"] == alone["choices"][0]["text"]
    assert through_ray["speculative"]["seed"] == 1234


def test_a_repeated_prefix_goes_to_one_replica(ray_served, tiny):
    url = ray_served[0]
    seen = set()
    for i in range(6):
        r = httpx.post(url + "/v1/completions", timeout=60, json={
            "model": tiny.name, "prompt": "hello world hello world the quick brown fox " + "xyz"[i % 3] * (i + 1),
            "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200
        seen.add(r.headers["x-specdec-replica"])
    assert len(seen) == 1
    others = set()
    for word in ("apple", "banana", "cherry", "dog", "egg", "fig", "grape", "ink"):
        # prompts sharing no prefix go to the replica that has seen the least text: both get some
        r = httpx.post(url + "/v1/completions", timeout=60, json={
            "model": tiny.name, "prompt": f"{word} world", "max_tokens": 2, "temperature": 0})
        others.add(r.headers["x-specdec-replica"])
    assert len(others) == 2


def test_routes_metrics_and_memory_files(ray_served, client, tiny):
    url, memory = ray_served
    assert [m.id for m in client.models.list()] == [tiny.name]
    assert httpx.get(url + "/health").json()["status"] == "ok"
    client.completions.create(model=tiny.name, prompt="hello world hello world hello world", max_tokens=12,
                              temperature=0, extra_body={"drafter": "ngram", "policy": "fixed", "num_draft": 2})
    metrics = httpx.get(url + "/metrics").text
    for name in ("specdec:spec_decode_num_drafts_total", "specdec:e2e_request_latency_seconds_bucket",
                 "specdec:generation_tokens_total"):
        assert name in metrics, name
    deadline = time.time() + 20  # every replica writes its own file (FILE.replica-<rank>), never FILE
    while len(list(memory.parent.glob("memory.json.replica-*"))) < 2 and time.time() < deadline:
        time.sleep(0.5)
    files = sorted(p.name for p in memory.parent.glob("memory.json.replica-*"))  # temporaries are hidden
    assert files == ["memory.json.replica-0", "memory.json.replica-1"] and not memory.exists()
    assert sum(len(json.loads((memory.parent / f).read_text())["entries"]) for f in files) > 0


def test_errors_are_the_plain_servers(ray_served, tiny):
    url = ray_served[0]
    r = httpx.post(url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"]
    r = httpx.post(url + "/v1/completions", json={"model": tiny.name, "prompt": "x", "num_draft": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "num_draft"
    assert httpx.post(url + "/v1/completions", json={"model": "nope", "prompt": "x"}).status_code == 404
    assert httpx.get(url + "/v1/nothing").status_code == 404
    assert httpx.get(url + "/v1/completions").status_code == 405
    r = httpx.post(url + "/v1/completions", content=b"x" * (70 * 1024), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8)
FIELDS = st.fixed_dictionaries({}, optional={"model": st.just("x") | st.text(max_size=5), "prompt": JSON,
                                             "messages": JSON, "max_tokens": JSON, "temperature": JSON,
                                             "num_draft": JSON, "stream": JSON})


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
       body=st.binary(max_size=64) | FIELDS.map(lambda d: json.dumps(d).encode()))
def test_fuzzed_bodies_get_clean_4xx(http, path, body):
    r = http.post(path, content=body, headers={"content-type": "application/json"}, timeout=60)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert "message" in r.json()["error"]


def test_a_killed_replica_is_restarted_and_others_succeed(ray_served, tiny):
    import ray
    from ray import serve

    url = ray_served[0]
    prompt = "the quick brown fox jumps over the lazy"
    victim = httpx.post(url + "/v1/completions", json={"model": tiny.name, "prompt": prompt, "max_tokens": 2},
                        timeout=60).headers["x-specdec-replica"]

    def one(i: int) -> httpx.Response:
        return httpx.post(url + "/v1/completions", timeout=60, json={
            "model": tiny.name, "prompt": prompt if i % 2 else f"zebra {i}", "max_tokens": 24, "temperature": 0})

    # The kill must land while the victim is busy, and the tiny model makes about a token a millisecond:
    # a whole answer of 480 tokens (the most its 512 positions allow) goes first, the stream after it
    # to the same replica, and the kill follows the stream's first event at once (killing 0.3 s after
    # both had started let one of them finish first now and then).
    with ThreadPoolExecutor(8) as pool:
        whole = [pool.submit(httpx.post, url + "/v1/completions", timeout=60, json={
            "model": tiny.name, "prompt": prompt, "max_tokens": 480, "temperature": 0})]
        time.sleep(0.05)
        with httpx.stream("POST", url + "/v1/completions", timeout=60,
                          json={"model": tiny.name, "prompt": prompt, "max_tokens": 480, "temperature": 0,
                                "stream": True}) as long:
            assert long.headers["x-specdec-replica"] == victim  # the same prefix: the same replica
            lines = long.iter_lines()
            next(line for line in lines if line.startswith("data:"))  # in flight on the victim
            futures = [pool.submit(one, i) for i in range(16)]
            ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
            events = [line for line in lines if line.startswith("data:")]
        answers = [f.result() for f in futures]
        whole = [f.result() for f in whole]
    # a whole answer in flight on it is a 503 with an OpenAI-style error
    assert any(r.status_code == 503 and r.json()["error"]["code"] == "replica_unavailable" for r in whole), \
        [(r.status_code, r.text[:200]) for r in whole]
    answers += whole
    # the stream in flight ends with an OpenAI-style error event
    error = json.loads(events[-1][5:])["error"]
    assert error["code"] == "replica_unavailable" and error["type"] == "server_error", events[-3:]
    for r in answers:  # every answer is a success or a clean OpenAI-style server error
        assert r.status_code == 200 or (r.status_code >= 500 and r.json()["error"]["message"]), r.text
    assert any(r.status_code == 200 for r in answers)
    deadline = time.time() + 60
    while time.time() < deadline:
        replicas = serve.status().applications["specdec"].deployments["SpecdecModel"].replica_states
        if replicas.get("RUNNING", 0) == 2:
            break
        time.sleep(1)
    assert replicas.get("RUNNING", 0) == 2, replicas
    for i in range(4):
        assert one(i).status_code == 200


def test_a_replica_freezes_what_it_loaded(monkeypatch, tiny):
    """A replica is a server process like `specdec serve`: what it loaded before its first request
    is kept out of the collector's full collections."""
    import gc
    import types

    serve = pytest.importorskip("ray.serve")
    from specdec.server.ray_app import ModelReplica, ModelSpec

    context = types.SimpleNamespace(replica_id=types.SimpleNamespace(to_full_id_str=lambda: "replica#0"), rank=0)
    monkeypatch.setattr(serve, "get_replica_context", lambda: context)
    monkeypatch.setattr("specdec.load", lambda *args, **kwargs: tiny)
    gc.unfreeze()
    try:
        replica = ModelReplica(ModelSpec(model="tiny", config=ServeConfig(slots=1, max_tokens=8)))
        frozen = gc.get_freeze_count()
    finally:
        gc.unfreeze()
    assert replica.server is not None and frozen > 1000


def test_rayservice_manifest():
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "rayservice.yaml").read_text()))
    service = docs[0]
    assert service["apiVersion"].startswith("ray.io/") and service["kind"] == "RayService"
    config = yaml.safe_load(service["spec"]["serveConfigV2"])
    app = config["applications"][0]
    assert app["import_path"] == "specdec.server.ray_app:app" and app["route_prefix"] == "/"
    assert {d["name"] for d in app["deployments"]} == {"SpecdecModel", "SpecdecIngress"}
    cluster = service["spec"]["rayClusterConfig"]
    assert cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    assert cluster["workerGroupSpecs"][0]["replicas"] >= 1


def test_the_config_file_builder_takes_the_serve_flags(tiny_model_dir):
    pytest.importorskip("ray.serve")
    from specdec.errors import SpecdecError
    from specdec.server.ray_app import app

    ingress = app({"model": str(tiny_model_dir), "min_replicas": 1, "max_replicas": 3, "replica_cpus": 1,
                   "num_draft": 3, "slots": 2})._bound_deployment
    model = ingress.init_args[0]._bound_deployment
    assert (ingress.name, model.name) == ("SpecdecIngress", "SpecdecModel")
    scaling = model._deployment_config.autoscaling_config
    assert (scaling.min_replicas, scaling.max_replicas) == (1, 3) and model.ray_actor_options["num_cpus"] == 1
    assert model._deployment_config.request_router_config.request_router_class.endswith("ray_router.PrefixRouter")
    spec = model.init_args[0]
    assert spec.config.slots == 2 and spec.config.defaults.num_draft == 3
    fixed = app({"model": str(tiny_model_dir), "replicas": 3})._bound_deployment.init_args[0]._bound_deployment
    assert fixed.num_replicas == 3
    with pytest.raises(SpecdecError, match=r"^min_replicas \(3\) must be <= max_replicas \(2\)$"):
        app({"model": str(tiny_model_dir), "min_replicas": 3, "max_replicas": 2})
    with pytest.raises(SpecdecError, match="temperature is chosen by each request"):
        app({"model": str(tiny_model_dir), "temperature": 0.5})


def test_serve_flags_for_ray_are_checked_before_loading(no_loading, capsys, monkeypatch):
    from specdec.cli import main

    for argv, message in ((["--replicas", "2"], "--replicas needs --ray"),
                          (["--ray", "--replicas", "0"], "--replicas"),
                          (["--ray", "--min-replicas", "3", "--max-replicas", "2"], "must be <= --max-replicas"),
                          (["--ray", "--replicas", "2", "--max-replicas", "3"], "not both"),
                          (["--ray", "--replica-cpus", "-1"], "--replica-cpus must be >= 0")):
        assert main(["serve", *argv]) != 0
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and "Traceback" not in err, err
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # Ray not installed
    assert main(["serve", "--ray"]) != 0
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "pip install 'specdec[ray]'" in err, err
    assert no_loading == []


def test_routing_text_and_memory_files(tmp_path):
    from specdec.drafting.suffix_index import NgramMemory
    from specdec.server.ray_app import memory_start
    from specdec.server.ray_router import PREFIX_CHARS, routing_text

    chat = json.dumps({"messages": [{"role": "system", "content": "be terse"},
                                    {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}).encode()
    assert routing_text("/v1/chat/completions", chat) == "system:be terse\nuser:hi\n"
    assert routing_text("/v1/completions", json.dumps({"prompt": "x" * 5000}).encode()) == "x" * PREFIX_CHARS
    assert routing_text("/v1/completions", b"{oops") is None and routing_text("/health", b"") is None
    assert routing_text("/v1/completions", b"[1, 2]") is None
    shared = tmp_path / "memory.json"
    assert memory_start(str(shared), 1) == str(shared)  # a new replica starts from FILE
    memory = NgramMemory()
    memory.add([1, 2, 3, 4, 5])
    memory.save(f"{shared}.replica-1")
    assert memory_start(str(shared), 1) == f"{shared}.replica-1"  # restarted: from what its rank learned
    assert memory_start(str(shared), 0) == str(shared)
    assert len(NgramMemory.load(f"{shared}.replica-1")) == len(memory)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.json.replica-1"]  # no temporary left


def test_the_router_records_a_prompt_without_stalling_its_event_loop(ray_served, monkeypatch):
    """The router records each routed prompt in Ray's prefix tree actor. It runs on the event loop
    that routes every request of the ingress's process: waiting for the actor must let that loop
    run (``await``), not block it (``ray.get``). The tree here takes 0.5 s to answer."""
    import asyncio
    from types import SimpleNamespace

    import ray

    from specdec.server import ray_router
    from specdec.server.ray_router import PrefixRouter, Routed

    @ray.remote(num_cpus=0)
    class SlowTree:
        def __init__(self) -> None:
            self.seen = []

        async def insert(self, text, replica, when):
            await asyncio.sleep(0.5)
            self.seen.append((text, replica))

        def inserted(self):
            return self.seen

    replica = SimpleNamespace(replica_id=SimpleNamespace(to_full_id_str=lambda: "replica-1"))

    async def chosen(self, pending_request, *, is_retry=False):
        return replica

    monkeypatch.setattr(ray_router._PrefixBase, "_choose_replica_for_request", chosen)
    router = PrefixRouter.__new__(PrefixRouter)  # only the part that is ours: no deployment needed
    router._tree_actor = tree = SlowTree.remote()
    ray.get(tree.inserted.remote())  # the actor is up
    pending = SimpleNamespace(args=[Routed("POST", "/v1/completions", b"", [], b"{}", prompt="hello world")])

    async def route():
        ticks = 0

        async def other_requests():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        others = asyncio.ensure_future(other_requests())
        await asyncio.sleep(0)
        got = await router._choose_replica_for_request(pending)
        others.cancel()
        return got, ticks

    got, ticks = asyncio.run(route())
    assert got is replica
    assert ray.get(tree.inserted.remote()) == [("hello world", "replica-1")]
    assert ticks >= 10, f"the loop stood still while the prompt was recorded ({ticks} ticks in 0.5 s)"
