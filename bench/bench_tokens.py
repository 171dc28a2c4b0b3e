"""Token lists, measured: what the front desk, a save and a restore do with them, in this tree and
(``--against REV``) in another revision, side by side in one run.

    .venv/bin/python bench/bench_tokens.py [--tokens 100000] [--against main] [--repeat 30] [--rounds 3]

With the same data in both trees, best of ``--repeat`` runs each:

1. the common prefix of two token lists of N tokens that part at 99% of them (the front desk
   compares a request's tokens with every slot's), both held as the tree's own token arrays, and
   a held array against a list (what the store hands over: a saved session's tokens); and the
   sessions index's block hashes of a request's tokens (routing looks them up for every request);
2. reading the token header of a slot save file of N tokens (a save reads it, so does a restore,
   routing and lineage when a session's tokens are not in memory yet), text only and with four
   images of 576 positions each;
3. lineage deciding what a save of N/2 tokens is, against 8 finalists of N/2 tokens (what a save
   compares at most), as lists, the way the store keeps them;
4. a fresh interpreter importing the sessions code a save and the sessions list use: the time,
   its peak memory, and whether numpy came with it.

Also numpy doing (1) on int64 arrays in every run: the same code in both trees shows the noise.
Another revision's app/ is taken with ``git archive`` into a temporary folder and measured in its
own processes, in turn with this tree's (``--rounds`` turns each). Prints; asserts nothing.
Timings are noisy on shared machines: compare the ratios, not microseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tarfile
import tempfile
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE_TOKENS = 576
IMPORTS = ("slotkeeper.core.sessions.saving", "slotkeeper.core.sessions.store")


def best(fn, repeat: int) -> float:
    """Seconds per call, best of ``repeat`` (each a few calls long, so short calls are timed too)."""
    number = max(1, int(0.01 / max(timeit.timeit(fn, number=1), 1e-7)))
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def write_save(path: Path, tokens: list[int], images: int = 0) -> None:
    """A slot save file in llama-server's layout (see sessions/kvfile.py), images as -1 runs."""
    starts, toks = [], list(tokens)
    for k in range(images):
        at = (k + 1) * len(toks) // (images + 1)
        starts.append(at)
        toks[at:at + IMAGE_TOKENS] = [-1] * IMAGE_TOKENS
    media = struct.pack(f"<{len(starts)}I", *starts)
    for k in range(images):
        chunk = bytes([k]) * 1000
        media += struct.pack("<I", len(chunk)) + chunk
    media += b"\0" * (-len(media) % 4)
    words = struct.pack(f"<3i{len(toks)}iI", -1, 1, len(toks), *toks, len(starts)) + media
    path.write_bytes(struct.pack("<III", 0x67677371, 4, len(words) // 4) + words + b"\1\0\0\0" * 64)


def measure(n: int, repeat: int) -> dict:
    """This process's slotkeeper (whichever tree is first on the path), on the same data each time."""
    from slotkeeper.core.sessions import index, kvfile, lineage

    try:  # the tree's own token arrays: core.basics.tokens, or numpy int64 arrays before it
        from slotkeeper.core.basics.tokens import as_tokens
    except ImportError:
        import numpy as np

        def as_tokens(values):
            return np.asarray(values, dtype=np.int64)

    out: dict = {}
    a = [1000 + (i * 7919) % 150_000 for i in range(n)]
    b = list(a)
    b[n * 99 // 100] = -5
    ta, tb = as_tokens(a), as_tokens(b)
    assert lineage.common_prefix_len(ta, tb) == n * 99 // 100
    out["prefix, arrays"] = best(lambda: lineage.common_prefix_len(ta, tb), repeat)
    out["prefix, array vs list"] = best(lambda: lineage.common_prefix_len(ta, b), repeat)
    out["index block hashes of an array"] = best(lambda: index.chain_hashes(ta), repeat)

    with tempfile.TemporaryDirectory() as tmp:
        text, media = Path(tmp) / "text.kv", Path(tmp) / "media.kv"
        write_save(text, a)
        write_save(media, a, images=4)
        assert kvfile.read_tokens(text).tokens == a
        assert kvfile.read_tokens(media).n_media == 4
        out["kvfile read, text"] = best(lambda: kvfile.read_tokens(text), repeat)
        out["kvfile read, 4 images"] = best(lambda: kvfile.read_tokens(media), repeat)

    half = a[: n // 2]
    finalists = []
    for k in range(8):  # parting at different places; the last one is the session it updates
        saved = list(half)
        if k < 7:
            saved[len(half) * (k + 1) // 9] = -5
        else:
            saved = saved[:-100]
        finalists.append((f"s{k}", saved))
    assert lineage.classify(half, finalists).kind == "update"
    out["lineage classify, 8 x N/2"] = best(lambda: lineage.classify(half, finalists), max(3, repeat // 5))
    out["(numpy prefix of int64 arrays)"] = numpy_prefix(n, repeat)  # the same code in both: a noise gauge
    return out


def fresh_import(app: Path) -> dict:
    """A new interpreter importing the sessions code: seconds, peak RSS (MB), numpy loaded."""
    probe = (
        "import resource, sys, time; t = time.perf_counter()\n"
        f"for m in {IMPORTS!r}: __import__(m)\n"
        "t = time.perf_counter() - t\n"
        "rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "rss = rss / 2**20 if sys.platform == 'darwin' else rss / 1024\n"
        "print(t, rss, 'numpy' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(app)}
    runs = []
    for _ in range(5):
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                              check=True)
        t, rss, np_loaded = done.stdout.split()
        runs.append((float(t), float(rss), np_loaded == "True"))
    return {"import s": min(r[0] for r in runs), "peak RSS MB": min(r[1] for r in runs), "numpy": runs[0][2]}


def numpy_prefix(n: int, repeat: int) -> float:
    import numpy as np

    a = np.asarray([1000 + (i * 7919) % 150_000 for i in range(n)], dtype=np.int64)
    b = a.copy()
    b[n * 99 // 100] = -5

    def prefix() -> int:
        m = min(len(a), len(b))
        differs = a[:m] != b[:m]
        first = int(np.argmax(differs))
        return first if differs[first] else m

    assert prefix() == n * 99 // 100
    return best(prefix, repeat)


def run_tree(app: Path, n: int, repeat: int) -> dict:
    done = subprocess.run([sys.executable, __file__, "--measure", "--tokens", str(n), "--repeat",
                           str(repeat)],
                          env={**os.environ, "PYTHONPATH": str(app)}, capture_output=True, text=True,
                          check=True)
    found = json.loads(done.stdout)
    found.update(fresh_import(app))
    return found


def run_trees(trees: dict[str, Path], n: int, repeat: int, rounds: int) -> dict[str, dict]:
    """Each tree in turn, ``rounds`` times (the machine's noise falls on all alike); the best of each."""
    results: dict[str, dict] = {name: {} for name in trees}
    for _ in range(rounds):
        for name, app in trees.items():
            for key, value in run_tree(app, n, repeat).items():
                old = results[name].get(key)
                results[name][key] = value if old is None or isinstance(value, bool) else min(old, value)
    return results


def export_app(rev: str, into: Path) -> Path:
    archive = into / "app.tar"
    with open(archive, "wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "app"], stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return into / "app"


def show(value, key: str) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key == "peak RSS MB":
        return f"{value:.1f} MB"
    return f"{value * 1e3:.2f} ms" if value >= 1e-3 else f"{value * 1e6:.1f} us"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3, help="turns of each tree, one after the other")
    ap.add_argument("--against", metavar="REV", help="another revision to compare with (e.g. main)")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:  # in a child: the tree is on PYTHONPATH
        print(json.dumps(measure(args.tokens, args.repeat)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        trees = {args.against: export_app(args.against, Path(tmp))} if args.against else {}
        trees["this tree"] = ROOT / "app"  # the other revision first: "before", then "after"
        results = run_trees(trees, args.tokens, args.repeat, args.rounds)
    names = list(results)
    print(f"N = {args.tokens} tokens; best of {args.repeat}")
    print(f"{'':34}" + "".join(f"{name:>16}" for name in names) + ("      after/before" if len(names) > 1
                                                                   else ""))
    for key in results["this tree"]:
        row = [results[name][key] for name in names]
        line = f"{key:34}" + "".join(f"{show(v, key):>16}" for v in row)
        if len(row) > 1 and not isinstance(row[0], bool) and row[0]:
            line += f"{row[1] / row[0]:>18.2f}"
        print(line)
    here = results["this tree"]
    print(f"this tree's prefix of two token arrays / numpy's: "
          f"{here['prefix, arrays'] / here['(numpy prefix of int64 arrays)']:.2f}")


if __name__ == "__main__":
    main()
