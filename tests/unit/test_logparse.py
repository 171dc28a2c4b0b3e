"""The per-slot log parser on lines captured from the real llama-server (b11434)."""

from slotkeeper.core.server.logparse import SlotLogParser

DEBUG_LOG = """\
0.01.540.288 I slot launch_slot_: id  0 | task 9 | processing task, is_child = 0
0.01.540.288 I slot launch_slot_: id  1 | task 11 | processing task, is_child = 0
0.01.540.304 I slot   operator(): id  0 | task 9 | new prompt, n_ctx_slot = 2048, n_keep = 0, task.n_tokens = 38
0.01.540.304 I slot   operator(): id  1 | task 11 | new prompt, n_ctx_slot = 2048, n_keep = 0, task.n_tokens = 500
0.01.540.312 I slot   operator(): id  0 | task 9 | cached n_tokens = 20, memory_seq_rm [20, end)
0.01.540.312 I slot   operator(): id  1 | task 11 | cached n_tokens = 0, memory_seq_rm [0, end)
0.00.711.670 I slot   operator(): id  1 | task 11 | cached n_tokens = 23, memory_seq_rm [23, end)
0.00.711.930 I slot create_check: id  1 | task 11 | created context checkpoint 1 of 32 (pos_min = 0, pos_max = 22, n_tokens = 23, size = 1 MiB)
0.01.546.325 I slot print_timing: id  0 | task 9 | prompt eval time =       2.49 ms /    18 tokens (    0.14 ms per token,  7226.01 tokens per second)
0.01.546.340 I slot print_timing: id  0 | task 9 |        eval time =       3.52 ms /     8 tokens (    0.50 ms per token,  1990.33 tokens per second)
0.01.546.373 I slot      release: id  0 | task 9 | stop processing: n_tokens = 45, truncated = 0
0.01.546.325 I slot print_timing: id  1 | task 11 | prompt eval time =       9.00 ms /   500 tokens (    0.14 ms per token,  7226.01 tokens per second)
0.01.546.373 I slot      release: id  1 | task 11 | stop processing: n_tokens = 503, truncated = 0
"""

INFO_LOG = """\
0.04.395.256 I slot launch_slot_: id  0 | task 10 | processing task, is_child = 0
0.04.400.099 I slot print_timing: id  0 | task 10 | prompt eval time =       2.25 ms /    18 tokens (    0.12 ms per token,  8000.00 tokens per second)
0.04.400.115 I slot print_timing: id  0 | task 10 |        eval time =       2.56 ms /     8 tokens (    0.37 ms per token,  2737.58 tokens per second)
0.04.400.149 I slot      release: id  0 | task 10 | stop processing: n_tokens = 45, truncated = 0
"""


def _parse(text):
    done = []
    parser = SlotLogParser(on_done=done.append)
    for line in text.splitlines():
        parser.feed(line)
    return done


def test_interleaved_slots_each_get_their_own_figures():
    a, b = _parse(DEBUG_LOG)
    assert (a.slot, a.task, a.n_prompt, a.cache_n, a.prompt_n, a.n_tokens_after) == (0, 9, 38, 20, 18, 45)
    assert (b.slot, b.task, b.n_prompt, b.cache_n, b.prompt_n) == (1, 11, 500, 0, 500)
    assert a.cache_share == 20 / 38


def test_info_level_logs_are_enough():
    [f] = _parse(INFO_LOG)
    assert (f.n_prompt, f.cache_n, f.prompt_n) == (38, 20, 18)
