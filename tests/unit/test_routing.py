"""Routing a request to a slot, without a server: prefixes, waiting, restores, eviction, recompute."""

from slotkeeper.core.engine.desk.routing import Route, SessionOption, SlotOption, Wait, route


def slot(i, prefix=0, held=0, n_prompt=0, busy=False, changed=False, used=0.0, fragile=0):
    return SlotOption(i, prefix, held, n_prompt, busy, changed, used, fragile)


def test_a_continuation_goes_to_the_slot_that_holds_it():
    r = route(500, [slot(0), slot(1, prefix=480, held=490, n_prompt=400, changed=True)])
    assert isinstance(r, Route) and r.slot == 1 and r.expected_prefix == 480
    assert not r.save_first and not r.restore and not r.erase_first


def test_a_busy_own_slot_is_waited_for_but_a_small_shared_start_is_not():
    assert isinstance(route(500, [slot(0), slot(1, prefix=480, held=490, n_prompt=400, busy=True)]), Wait)
    r = route(500, [slot(0), slot(1, prefix=40, held=490, n_prompt=400, busy=True)])
    assert isinstance(r, Route) and r.slot == 0
    assert route(500, [slot(0, busy=True), slot(1, busy=True)]) is None


def test_another_conversation_takes_an_empty_slot_before_evicting_one():
    r = route(300, [slot(0, prefix=40, held=400, n_prompt=350, changed=True), slot(1)])
    assert r.slot == 1 and not r.save_first


def test_evicting_a_changed_conversation_saves_it_first():
    r = route(300, [slot(0, prefix=40, held=400, n_prompt=350, changed=True, used=5.0)])
    assert r.slot == 0 and r.save_first and r.expected_prefix == 40
    # saved already: nothing to save
    assert not route(300, [slot(0, prefix=40, held=400, n_prompt=350, changed=False)]).save_first
    # least recently used goes first, a saved one before a changed one
    r = route(100,
              [slot(0, held=10, n_prompt=5, changed=True, used=1.0), slot(1, held=10, n_prompt=5, used=9.0)])
    assert r.slot == 1 and not r.save_first


def test_an_edit_inside_the_last_prompt_is_an_eviction_of_the_unsaved_turn():
    # The slot's last prompt was 400 tokens; the request diverges at 350 (an edited message).
    r = route(420, [slot(0, prefix=350, held=410, n_prompt=400, changed=True)])
    assert r.slot == 0 and r.save_first and r.expected_prefix == 350
    # Diverging only inside the reply (a re-rendered answer) continues the conversation.
    assert not route(420, [slot(0, prefix=405, held=410, n_prompt=400, changed=True)]).save_first


def test_a_saved_session_is_restored_when_it_beats_the_slots_by_the_break_even():
    s = SessionOption("abc", prefix=900, n_tokens=950, exact_only=False)
    r = route(1000, [slot(0, prefix=40, held=300, n_prompt=280, changed=True)], s, break_even_tokens=100)
    assert r.restore == "abc" and r.slot == 0 and r.save_first and r.expected_prefix == 900
    assert route(1000, [slot(0, prefix=850, held=860, n_prompt=850)], s,
                 break_even_tokens=100).restore is None


def test_fragile_sessions_are_restored_only_for_an_exact_continuation():
    s = SessionOption("swa", prefix=900, n_tokens=950, exact_only=True)
    assert route(1000, [slot(0)], s).restore is None  # diverges inside it: a restore would be wrong
    s = SessionOption("swa", prefix=950, n_tokens=950, exact_only=True)
    assert route(1000, [slot(0)], s).restore == "swa"


def test_rolling_back_inside_fragile_restored_state_recomputes():
    r = route(700, [slot(0, prefix=600, held=950, n_prompt=950, fragile=950)])
    assert r.erase_first and r.expected_prefix == 0
    assert not route(1000, [slot(0, prefix=950, held=960, n_prompt=950, fragile=950)]).erase_first


def test_a_request_whose_tokens_are_not_known_never_rolls_back_into_fragile_state():
    # The front door could not tokenize it (a /v1/messages body, a template that fails, a media
    # prompt): it may share anything with what the slot holds, so fragile restored state is erased.
    r = route(0, [slot(0, held=950, n_prompt=950, fragile=950)], known=False)
    assert r.slot == 0 and r.erase_first and r.expected_prefix == 0
    # An empty slot is taken first; a slot whose state can be rolled back is left as it is.
    r = route(0, [slot(0, held=950, n_prompt=950, fragile=950), slot(1)], known=False)
    assert r.slot == 1 and not r.erase_first
    assert not route(0, [slot(0, held=950, n_prompt=950)], known=False).erase_first
    # Unsaved changes are saved before it replaces them, as for any new conversation.
    r = route(0, [slot(0, held=950, n_prompt=950, changed=True, fragile=950)], known=False)
    assert r.save_first and r.erase_first


# -- restore points ---------------------------------------------------------------------------
def test_an_exact_only_save_is_restored_only_for_a_request_that_strictly_extends_it():
    s = SessionOption("hyb", prefix=950, n_tokens=950, exact_only=True)
    assert route(951, [slot(0)], s).restore == "hyb"
    # the same tokens again (a Regenerate of a prompt saved as it was): llama-server would have to
    # roll back one token inside the restored state, which re-reads it all; no restore
    assert route(950, [slot(0)], s).restore is None


def test_a_request_rolling_back_inside_restored_state_is_served_from_a_restore_point_in_that_slot():
    # Slot 0 holds a restored 950-token conversation (prompt 900, reply 50); the client re-rendered
    # the reply (reasoning dropped): it shares 905 tokens and goes on. A point at 899 is offered.
    fragile = slot(0, prefix=905, held=950, n_prompt=950, fragile=950, used=9.0)
    point = SessionOption("hyb", prefix=899, n_tokens=899, exact_only=True, point="hyb.00000001.kv")
    r = route(1200, [fragile, slot(1, held=300, n_prompt=250, used=1.0)], point, break_even_tokens=100)
    assert r.slot == 0 and r.restore == "hyb" and r.restore_point == "hyb.00000001.kv"
    assert r.expected_prefix == 899 and not r.erase_first and not r.save_first
    # Regenerate: the 900-token prompt again
    r = route(900, [slot(0, prefix=900, held=950, n_prompt=950, fragile=950)], point)
    assert r.restore_point == "hyb.00000001.kv" and r.expected_prefix == 899
    # Without a point it is recomputed, as before.
    r = route(1200, [fragile], None)
    assert r.erase_first and r.expected_prefix == 0


def test_an_exact_repeat_of_restored_state_counts_as_nothing_kept():
    from slotkeeper.core.engine.desk.routing import usable_prefix

    assert usable_prefix(slot(0, prefix=950, held=950, fragile=950), 950) == 0
    assert usable_prefix(slot(0, prefix=950, held=950, fragile=950), 960) == 950
    assert usable_prefix(slot(0, prefix=900, held=950, fragile=950), 960) == 0
    assert usable_prefix(slot(0, prefix=900, held=950), 960) == 900  # live state rolls back fine
