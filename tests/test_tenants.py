"""Tenants apart: what one client's text teaches the drafters (the index of earlier outputs) never
drafts for another client's requests unless the server shares it (``--shared-index``)."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from conftest import serving
from specdec.loaded import OWN_TEXT
from specdec.server.app import ServeConfig, Server
from specdec.server.tenants import tenant_of

PROMPT = "the quick brown fox jumps over the lazy dog"


def tenant(key: str) -> str:
    return tenant_of(type("R", (), {"headers": {"authorization": f"Bearer {key}"}})())


@pytest.fixture()
def model(tiny_model_dir):
    import specdec

    loaded = specdec.load(str(tiny_model_dir))
    loaded.loaded.enable_memory()
    return loaded


def test_a_tenant_is_a_hash_of_its_api_key_and_no_key_is_its_own_text():
    assert tenant("secret-a") != tenant("secret-b") and tenant("secret-a") == tenant("secret-a")
    assert "secret-a" not in tenant("secret-a")
    assert tenant("secret-a").endswith(hashlib.sha256(b"secret-a").hexdigest()[:32])
    assert tenant_of(type("R", (), {"headers": {}})()) == OWN_TEXT
    assert tenant_of(type("R", (), {"headers": {"authorization": "Basic abc"}})()) == OWN_TEXT


def test_each_tenant_drafts_from_its_own_index(model, monkeypatch):
    loaded = model.loaded
    mine, theirs = loaded.tenant_state("a")[0], loaded.tenant_state("b")[0]
    assert mine is not theirs and mine is not loaded.memory and loaded.tenant_state(None)[0] is loaded.memory
    assert loaded.tenant_state(OWN_TEXT)[0] is None  # a request without a key: its own text only
    model.generate(PROMPT, max_new_tokens=12, drafter="ngram", tenant="b")
    assert len(theirs) > 0 and len(mine) == 0 and len(loaded.memory) == 0
    assert model.drafter("ngram", tenant="a").index.memory is mine
    monkeypatch.setattr("specdec.loaded.MAX_TENANTS", 2)
    loaded.tenant_state("c")  # a third tenant: the least recently seen ("b") is forgotten
    assert loaded.tenant_state("a")[0] is mine and loaded.tenant_state("b")[0] is not theirs


@pytest.mark.parametrize("shared", [False, True])
def test_the_server_keeps_tenants_apart_unless_it_shares_the_index(model, shared):
    server = Server(model, config=ServeConfig(slots=2, max_tokens=12, shared_index=shared))
    server.warm_up()
    with serving(server.app(), timeout=30) as url, httpx.Client(base_url=url) as http:
        body = {"model": model.name, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "drafter": "ngram"}
        answer = http.post("/v1/completions", json=body, headers={"Authorization": "Bearer tenant-b"})
        assert answer.status_code == 200, answer.text
        anonymous = http.post("/v1/completions", json=body)
        assert anonymous.status_code == 200 and anonymous.json()["choices"][0]["text"] == answer.json()["choices"][0]["text"]
    loaded = model.loaded
    b_index, a_index = loaded.tenant_state(tenant("tenant-b"))[0], loaded.tenant_state(tenant("tenant-a"))[0]
    if shared:  # everyone's outputs in the model's one index
        assert len(loaded.memory) > 0 and len(b_index) == 0
    else:  # B's output only in B's index: A (and a request without a key) draft from none of it
        assert len(b_index) > 0 and len(a_index) == 0 and len(loaded.memory) == 0


@pytest.mark.parametrize("index_tokens", [0, 500])
def test_a_server_keeps_an_index_per_tenant_bounded_by_its_setting(tiny_model_dir, index_tokens):
    import specdec

    model = specdec.load(str(tiny_model_dir))
    Server(model, config=ServeConfig(slots=1, max_tokens=12, index_tokens=index_tokens))
    loaded = model.loaded
    if not index_tokens:  # off: each request drafts from its own prompt and answer alone
        assert loaded.memory is None and loaded.tenant_state(tenant("x"))[0] is None
        return
    assert loaded.memory.capacity == loaded.tenant_state(tenant("x"))[0].capacity == index_tokens
    plain = model.generate(PROMPT, max_new_tokens=40, drafter="none")
    first = model.generate(PROMPT, max_new_tokens=40, policy="fixed", num_draft=8, tenant=tenant("x"))
    again = model.generate(PROMPT, max_new_tokens=40, policy="fixed", num_draft=8, tenant=tenant("x"))
    other = model.generate(PROMPT, max_new_tokens=40, policy="fixed", num_draft=8, tenant=tenant("y"))
    assert again.token_ids == first.token_ids == other.token_ids == plain.token_ids
    # The same tenant's repeat copies its first answer; another tenant's drafts as the first did.
    assert again.stats.accepted > first.stats.accepted == other.stats.accepted
    assert len(loaded.tenant_state(tenant("x"))[0]) <= index_tokens


def test_a_memory_file_on_a_server_needs_a_shared_index(capsys):
    from specdec.cli import main
    from specdec.server.settings import settings_from

    with pytest.raises(Exception, match="add shared_index"):
        settings_from({"memory": "m.json"})
    assert settings_from({"memory": "m.json", "shared_index": True}).config.shared_index
    assert main(["serve", "--memory", "m.json", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--memory keeps one index" in err and "--shared-index" in err and "Traceback" not in err
