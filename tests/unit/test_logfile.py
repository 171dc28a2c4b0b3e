"""The log tailer: every line reaches the listeners, across rotation."""

from slotkeeper.core.server import logfile


def test_lines_survive_rotation(tmp_path, monkeypatch):
    monkeypatch.setattr(logfile, "LOG_MAX_BYTES", 200)
    path = tmp_path / "llama-server.log"
    path.touch()
    seen = []
    tailer = logfile.LogTailer(path, start_at_end=False)
    tailer.add_listener(seen.append)
    with open(path, "ab", buffering=0) as child:  # the child's O_APPEND handle
        for i in range(40):
            child.write(f"line {i:03d} some text to make it longer\n".encode())
            if i % 7 == 0:
                tailer._rotate_if_big()
            tailer.poll()
        child.write(b"half a li")
        tailer._rotate_if_big()
        child.write(b"ne, then the rest\n")
        tailer.poll()
    assert seen[:40] == [f"line {i:03d} some text to make it longer" for i in range(40)]
    assert path.with_name("llama-server.log.1").exists()
    assert seen[-1].endswith("ne, then the rest")
