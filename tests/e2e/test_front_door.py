"""The front door against the real llama-server: routing, saves before evictions, restores on
demand, recomputing instead of a wrong answer, streaming, cancellation, errors, every endpoint,
and llama-server's own port closed to everyone but Slotkeeper."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from e2e_helpers import EventLog, make_engine, wait_until

from slotkeeper.core import events as ev
from slotkeeper.core.model.modelgen import write_model
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.sessions.kvfile import read_tokens

pytestmark = pytest.mark.e2e

WORDS = ("river mountain garden window letter candle summer harbour violin meadow lantern orchard "
         "thunder pebble falcon ribbon compass cellar willow saddle").split()


def long_message(seed: int, n: int = 220) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(n))


def chat(url: str, messages: list[dict], max_tokens: int = 8, **extra) -> dict:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120,
                   json={"messages": messages, "max_tokens": max_tokens, "temperature": 0, "seed": 1,
                         **extra})
    r.raise_for_status()
    return r.json()


def reused(response: dict) -> float:
    """The share of the prompt that came from the cache."""
    t = response["timings"]
    return t["cache_n"] / (t["cache_n"] + t["prompt_n"])


def turn(url: str, history: list[dict], text: str) -> tuple[list[dict], dict]:
    messages = [*history, {"role": "user", "content": text}]
    r = chat(url, messages)
    return [*messages, {"role": "assistant", "content": r["choices"][0]["message"]["content"]}], r


def test_four_conversations_on_one_slot_survive_switching_and_a_restart(llama_model, server_bin, port):
    """More conversations than slots: each switch saves the one leaving the slot, and after a
    restart each conversation's next turn comes back from disk, not from a fresh prefill."""
    engine = make_engine(llama_model, server_bin, port, idle_save=3600, ctx=4096)  # no idle saves
    events = EventLog(engine)
    engine.start()
    convs: dict[str, list[dict]] = {}
    try:
        assert engine.wait_ready(60) is ServerState.READY
        url = engine.base_url
        for name in "ABCD":
            convs[name], _ = turn(url, [{"role": "system", "content": f"You are assistant {name}."}],
                                  long_message(ord(name)))
        for name in "ABCD":  # back to back: each return finds its conversation saved before it left
            convs[name], r = turn(url, convs[name], f"And what about {name.lower()}?")
            assert reused(r) >= 0.8, (name, r["timings"])
        # A switch save's commit (hash, fsync, sidecar) may end after the next reply went out.
        wait_until(lambda: len([s for s in events.of(ev.SessionSaved)
                                if s.reason == "before switching conversations"]) >= 6,
                   what="the saves before switching committed")
    finally:
        engine.stop()
    on_disk = engine.sessions.listing().sessions
    assert len(on_disk) == 4, [e.sidecar.title for e in on_disk]

    engine2 = make_engine(llama_model, server_bin, port, idle_save=3600, ctx=4096)
    events2 = EventLog(engine2)
    engine2.start()
    try:
        assert engine2.wait_ready(60) is ServerState.READY
        for name in "ABCD":
            convs[name], r = turn(engine2.base_url, convs[name], "One more thing, please.")
            assert reused(r) >= 0.8, (name, r["timings"])
        done = wait_until(lambda: len(events2.of(ev.RequestDone)) == 4 and events2.of(ev.RequestDone),
                          what="the four requests' figures")
        assert {d.source for d in done} <= {"slot", "restored"} and "restored" in {d.source for d in done}
        assert all(d.saved_ms > 0 for d in done)
    finally:
        engine2.stop()


def test_a_conversation_that_keeps_to_its_slot_is_not_tokenized_until_another_needs_the_slot(
        llama_model, server_bin, port):
    """The next turn of the conversation a slot holds goes straight to it (no template rendering
    and tokenizing on the way in); the figures come from the response. When another
    conversation needs the slot, the first one's tokens are learnt, it is saved before it is
    evicted, and its next turn comes back from disk."""
    engine = make_engine(llama_model, server_bin, port, idle_save=3600, ctx=4096)
    events = EventLog(engine)
    tokenized: list[str] = []
    real = engine.prompts.tokens

    async def counting(path, body):
        tokenized.append(body["messages"][-1]["content"][:20])
        return await real(path, body)

    engine.prompts.tokens = counting
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        url = engine.base_url
        a, first = turn(url, [{"role": "system", "content": "You are assistant A."}], long_message(1))
        a, second = turn(url, a, "Tell me more.")
        a, third = turn(url, a, "And then?")
        assert len(tokenized) == 1, tokenized  # only the first turn, which found no slot holding it
        done = wait_until(lambda: len(events.of(ev.RequestDone)) == 3 and events.of(ev.RequestDone),
                          what="three requests recorded (after their answers went out)")
        assert [d.source for d in done] == ["none", "slot", "slot"]
        for d, r in zip(done, (first, second, third)):
            t = r["timings"]
            assert (d.n_prompt, d.cache_n, d.prompt_n) == (t["cache_n"] + t["prompt_n"], t["cache_n"],
                                                           t["prompt_n"])
        assert reused(third) >= 0.9
        assert engine.snapshot.slots[0].n_tokens >= done[-1].n_prompt

        b, _ = turn(url, [{"role": "system", "content": "You are assistant B."}], long_message(2))
        assert len(tokenized) == 3, tokenized  # B's prompt, and A's last turn, learnt for the route
        # The switch save's commit may end after B's reply went out: wait for it.
        [saved] = wait_until(lambda: [s for s in events.of(ev.SessionSaved)
                                      if s.reason == "before switching conversations"],
                             what="A's save before switching committed")
        assert saved.n_tokens >= done[-1].n_prompt  # A as its last turn left it, reply included
        a, back = turn(url, a, "Back to you, A.")
        assert reused(back) >= 0.8, back["timings"]
        last = wait_until(lambda: len(events.of(ev.RequestDone)) == 5 and events.of(ev.RequestDone)[-1])
        assert last.source == "restored", events.of(ev.RequestDone)
    finally:
        engine.stop(save=False)


SHAPES = {  # the same prompt, written the ways llama-server reads a completion's "prompt"
    "tokens": lambda t: t,
    "one-item list": lambda t: [t],  # llama-server runs it as the prompt itself
    "prompt_string": lambda t: {"prompt_string": t},
    "two prompts": lambda t: [t, t],  # two tasks on the slot: the front door cannot know its tokens
}


@pytest.mark.parametrize("kind, shape",
                         [("gemma2", "tokens"), ("gemma3", "tokens"), ("gemma3", "one-item list"),
                          ("gemma3", "prompt_string"), ("gemma3", "two prompts")])
def test_a_rollback_into_restored_sliding_window_state_answers_like_a_cold_server(kind, shape, models_dir,
                                                                                 server_bin, port):
    """--swa-full: llama-server's save keeps only a window of old sliding-layer cells, yet after a
    restore it rolls back into them. The front door recomputes instead; the answer is a cold one,
    however the prompt is written (a shape the front door cannot tokenize is erased first too)."""
    model = write_model(models_dir / f"tiny-{kind}.gguf", kind)
    engine = make_engine(model, server_bin, port, swa_full=True, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        url = engine.base_url
        tokens = httpx.post(f"{url}/tokenize", json={"content": long_message(3, 400)}).json()["tokens"]
        saved_prompt = tokens[:700]
        r = httpx.post(f"{url}/completion", timeout=120,
                       json={"prompt": saved_prompt, "n_predict": 8, "temperature": 0})
        assert r.status_code == 200
        assert engine.save_slot(0).kind == "new"  # the prompt and 7 generated tokens
    finally:
        engine.stop(save=False)
    # The same prompt, another continuation: it drops the generated tokens, inside the restored state.
    rollback = saved_prompt + tokens[700:760]

    def top_logprobs(base: str) -> list[float]:
        r = httpx.post(f"{base}/completion", timeout=120,
                       json={"prompt": SHAPES[shape](rollback), "n_predict": 1, "n_probs": 8,
                             "temperature": 0})
        r.raise_for_status()
        first = r.json()[0] if isinstance(r.json(), list) else r.json()
        return [p["logprob"] for p in first["completion_probabilities"][0]["top_logprobs"]]

    engine = make_engine(model, server_bin, port, swa_full=True, idle_save=3600)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert events.of(ev.SessionRestored), "the saved state is in the slot"
        restored_answer = top_logprobs(engine.base_url)
        [recomputed] = events.of(ev.SlotRecomputed)
        assert ("restored state" if shape != "two prompts" else "tokens are not known") in recomputed.reason
        # Without the guard: llama-server itself, the same file restored, the same rollback.
        url, key = engine.link.upstream()
        raw = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120)
        entry = engine.sessions.listing().sessions[0]
        engine.library.store.states.materialize(entry.sidecar.kv_file, engine.link.staging / "by-hand.kv")
        assert raw.post("/slots/0", params={"action": "restore"}, json={"filename": "by-hand.kv"}).is_success
        r = raw.post("/completion", json={"prompt": rollback, "n_predict": 1, "n_probs": 8, "temperature": 0,
                                         "id_slot": 0})
        unguarded = [p["logprob"] for p in r.json()["completion_probabilities"][0]["top_logprobs"]]
        assert r.json()["timings"]["cache_n"] > 0  # it did roll back into the restored state
        raw.post("/slots/0", params={"action": "erase"})
        cold = [p["logprob"] for p in raw.post("/completion", json={
            "prompt": rollback, "n_predict": 1, "n_probs": 8, "temperature": 0, "id_slot": 0}).json()[
            "completion_probabilities"][0]["top_logprobs"]]
    finally:
        engine.stop(save=False)
    assert max(abs(a - b) for a, b in zip(restored_answer, cold)) <= 1e-5
    assert max(abs(a - b) for a, b in zip(unguarded, cold)) > 1e-5, "the unguarded rollback differs"


def test_a_hybrid_models_restored_state_serves_exact_continuations_and_recomputes_rollbacks(
        models_dir, server_bin, port):
    """qwen35 (gated delta net + attention): a save file holds no checkpoints of the recurrent state,
    so a restored state can only be continued exactly. The next turn of the saved conversation reuses
    it; a request that rolls back inside it is computed from scratch (the slot erased first), answers
    like a cold server and is recorded as recomputed, not as a restore that failed."""
    model = write_model(models_dir / "tiny-qwen35.gguf", "qwen35")
    engine = make_engine(model, server_bin, port, idle_save=3600)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        url = engine.base_url
        tokens = httpx.post(f"{url}/tokenize", json={"content": long_message(5, 400)}).json()["tokens"]
        prompt = tokens[:600]
        assert httpx.post(f"{url}/completion", timeout=120,
                          json={"prompt": prompt, "n_predict": 8, "temperature": 0}).status_code == 200
        summary = engine.save_slot(0)
        assert summary.kind == "new"
        entry = engine.sessions.listing().sessions[0]
        assert entry.sidecar.restore_mode == "exact"
        saved = read_tokens(engine.library.store.dir / entry.sidecar.kv_file).tokens
    finally:
        engine.stop(save=False)
    assert saved[:600] == prompt and len(saved) > 600
    continuation = saved + tokens[600:640]
    rollback = prompt[:-8] + tokens[600:660]  # an edited last message: diverges inside the saved tokens

    def ask(base: str, prompt_tokens: list[int]) -> dict:
        r = httpx.post(f"{base}/completion", timeout=120,
                       json={"prompt": prompt_tokens, "n_predict": 1, "n_probs": 8, "temperature": 0})
        r.raise_for_status()
        return r.json()

    def top(response: dict) -> list[float]:
        return [p["logprob"] for p in response["completion_probabilities"][0]["top_logprobs"]]

    # A restart restores the session; the next turn of that very conversation reuses all of it.
    engine = make_engine(model, server_bin, port, idle_save=3600)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert [r.id for r in events.of(ev.SessionRestored)] == [entry.id]
        t = ask(engine.base_url, continuation)["timings"]
        assert t["cache_n"] >= len(saved) - 1 and t["prompt_n"] <= 41, t
        [done] = wait_until(lambda: events.of(ev.RequestDone), what="the request's figures")
        assert done.source == "slot"  # restored at launch, so already in the slot
        wait_until(lambda: events.of(ev.RestoreReused), what="the restore's verdict")
        [verdict] = events.of(ev.RestoreReused)
        assert verdict.effective is True
        assert not events.of(ev.SlotRecomputed)
    finally:
        engine.stop(save=False)

    # Another restart; this time the next request rolls back inside the restored state.
    engine = make_engine(model, server_bin, port, idle_save=3600)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        assert [r.id for r in events.of(ev.SessionRestored)] == [entry.id]
        answer = ask(engine.base_url, rollback)
        [recomputed] = events.of(ev.SlotRecomputed)
        assert recomputed.session_id == entry.id and "restored state" in recomputed.reason
        assert answer["timings"]["cache_n"] == 0
        [done] = wait_until(lambda: events.of(ev.RequestDone), what="the request's figures")
        assert done.source == "recomputed"
        wait_until(lambda: events.of(ev.RestoreReused), what="the restore's verdict")
        [verdict] = events.of(ev.RestoreReused)
        assert verdict.effective is None and verdict.reason.startswith("not judged"), verdict
        assert not [e for e in events.of(ev.WarningRaised) if "restor" in e.message]  # nothing to warn about
        wait_until(lambda: [r for r in engine.history.load() if r.source == "recomputed"],
                   what="the history to record the recompute")
        store = engine.library.store
        wait_until(lambda: (store.get(entry.id).sidecar.last_restore or None)
                   and store.get(entry.id).sidecar.last_restore.reason, what="the sidecar's record")
        record = engine.library.store.get(entry.id).sidecar.last_restore
        assert record.effective is None and "recomputed" in record.reason
        # The same rollback straight to llama-server after a cold start of the slot.
        url, key = engine.link.upstream()
        raw = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120)
        raw.post("/slots/0", params={"action": "erase"})
        cold = raw.post("/completion",
                        json={"prompt": rollback, "n_predict": 1, "n_probs": 8, "temperature": 0,
                              "id_slot": 0}).json()
    finally:
        engine.stop(save=False)
    assert cold["timings"]["cache_n"] == 0
    assert max(abs(a - b) for a, b in zip(top(answer), top(cold))) <= 1e-5


def test_streaming_cancellation_errors_and_every_endpoint(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600, extra_args=("--metrics",))
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        url = engine.base_url
        # Passed through as they are.
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        assert httpx.get(f"{url}/props").json()["total_slots"] == 1
        assert httpx.get(f"{url}/v1/models").json()["data"]
        assert httpx.get(f"{url}/models").status_code == 200
        assert "llamacpp:prompt_tokens_total" in httpx.get(f"{url}/metrics").text
        toks = httpx.post(f"{url}/tokenize", json={"content": "hello there"}).json()["tokens"]
        assert httpx.post(f"{url}/detokenize",
                          json={"tokens": toks}).json()["content"].strip() == "hello there"
        assert "hello" in httpx.post(f"{url}/apply-template",
                                     json={"messages": [{"role": "user",
                                                         "content": "hello"}]}).json()["prompt"]
        # The web UI (this source build has none: llama-server's own 404) comes back as llama-server answers.
        private, key = engine.link.upstream()
        ui, direct = httpx.get(f"{url}/"), httpx.get(f"{private}/")
        assert (ui.status_code, ui.content) == (direct.status_code, direct.content)
        # llama-server's errors come back as it answered them.
        bad = httpx.post(f"{url}/embedding", json={"content": "x"})
        assert bad.status_code == 501 and "error" in bad.json()

        # A stream arrives chunk by chunk, with the figures in its last event.
        chunks, arrival = [], []
        with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": "river mountain garden " * 20}], "max_tokens": 40,
                "stream": True, "temperature": 0}) as s:
            for line in s.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
                    arrival.append(time.monotonic())
        assert len(chunks) > 10 and "timings" in chunks[-1]
        assert arrival[-1] - arrival[0] > 0  # not one buffered lump
        done = wait_until(lambda: events.of(ev.RequestDone), what="the stream's figures")
        assert done[-1].n_prompt == chunks[-1]["timings"]["prompt_n"] + chunks[-1]["timings"]["cache_n"]

        # A client that goes away cancels the request upstream: the slot is free again at once.
        with httpx.stream("POST", f"{url}/completion", timeout=60, json={
                "prompt": long_message(2, 50), "n_predict": 4000, "stream": True, "ignore_eos": True}) as s:
            for i, _line in enumerate(s.iter_lines()):
                if i > 5:
                    break
        url_priv, key = engine.link.upstream()
        wait_until(lambda: not httpx.get(f"{url_priv}/slots",
                                         headers={"Authorization": f"Bearer {key}"}).json()[0][
            "is_processing"], timeout=10, what="the cancelled request to stop")
        # A request llama-server refuses comes back as it answered, and changes nothing to save.
        engine.save_slot(0)
        too_long = httpx.post(f"{url}/completion", json={"prompt": "word " * 5000, "n_predict": 1},
                              timeout=60)
        assert too_long.status_code == 400 and "error" in too_long.json()
        report = engine.loop.call(engine.save_changed_slots_async())
        assert report.saved == () and report.unsaved == (), "a refused request is not a change to save"
    finally:
        engine.stop(save=False)


def test_the_slot_file_api_is_closed_on_every_port(llama_model, server_bin, port, tmp_path):
    engine = make_engine(llama_model, server_bin, port, extra_args=("--api-key", "users-key"))
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        front = engine.base_url
        user = {"Authorization": "Bearer users-key"}
        for action in ("save", "restore", "erase"):
            r = httpx.post(f"{front}/slots/0", params={"action": action}, json={"filename": "junk.bin"},
                           headers=user)
            assert r.status_code == 403 and "managed by Slotkeeper" in r.json()["error"]["message"]
        assert httpx.post(f"{front}/lora-adapters", json=[], headers=user).status_code == 403
        # The user's key guards the front door; health stays public, as llama-server has it.
        assert httpx.get(f"{front}/props").status_code == 401
        assert httpx.get(f"{front}/props", headers=user).status_code == 200
        assert httpx.get(f"{front}/health").status_code == 200
        # llama-server's own port answers only to Slotkeeper's private key, not even the user's.
        private, key = engine.link.upstream()
        assert f":{port}" not in private
        for headers in ({}, user):
            r = httpx.post(f"{private}/slots/0", params={"action": "save"}, json={"filename": "junk.bin"},
                           headers=headers)
            assert r.status_code == 401
        assert not (engine.paths.sessions_dir / "junk.bin").exists()
        assert key not in (engine.paths.server_state_file.read_text())
    finally:
        engine.stop()


def test_different_conversations_run_on_different_slots_at_once(llama_model, server_bin, port):
    engine = make_engine(llama_model, server_bin, port, idle_save=3600, parallel=2, ctx=4096)
    events = EventLog(engine)
    engine.start()
    try:
        assert engine.wait_ready(60) is ServerState.READY
        url = engine.base_url
        results: dict[str, dict] = {}

        def run(name: str) -> None:
            results[name] = chat(url, [{"role": "user", "content": long_message(ord(name), 80)}],
                                 max_tokens=32)

        threads = [threading.Thread(target=run, args=(n,)) for n in "AB"]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # The answer goes out before the engine's bookkeeping: wait for both figures.
        done = wait_until(lambda: len(events.of(ev.RequestDone)) >= 2 and events.of(ev.RequestDone),
                          what="both requests' figures")
        assert {d.slot for d in done} == {0, 1}
        assert not [s for s in events.of(ev.SessionSaved) if s.reason == "before switching conversations"]
    finally:
        engine.stop(save=False)
