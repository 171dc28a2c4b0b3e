"""The engine's parts talk one way: the engine composes them and hears from them through events
and return values. No part is handed a callable of the engine or of the front door (a bound
method, a lambda or a closure over either), so one request's walk never climbs back up.

The import contracts in pyproject.toml say the same of imports; this says it of what the parts
hold at run time, on a real engine."""

from __future__ import annotations

import functools
import inspect
import types
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from slotkeeper.core.basics.paths import app_paths
from slotkeeper.core.engine import Engine
from slotkeeper.core.engine.door.frontdoor import FrontDoor
from slotkeeper.core.events import EventBus
from slotkeeper.core.settings import Settings

# Where the walk stops: the bus (handlers subscribe to it: that is how the engine listens).
NOT_WALKED = (EventBus,)


def _refers_to(fn: Any, targets: tuple[object, ...], seen: set[int]) -> bool:
    """Whether the callable ``fn`` is a method of one of ``targets`` or closes over one."""
    if id(fn) in seen:
        return False
    seen.add(id(fn))
    if isinstance(fn, functools.partial):
        return _refers_to(fn.func, targets, seen) or any(
            a in targets or (callable(a) and _refers_to(a, targets, seen)) for a in fn.args)
    owner = getattr(fn, "__self__", None)
    if owner is not None and any(owner is t for t in targets):
        return True
    func = getattr(fn, "__func__", fn)
    if isinstance(func, types.FunctionType):
        for cell in func.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if any(value is t for t in targets) or (callable(value) and _refers_to(value, targets, seen)):
                return True
    return False


def _held(obj: object) -> Iterator[tuple[str, Any]]:
    fields = getattr(obj, "__dict__", None)
    if isinstance(obj, dict):
        fields = obj
    elif isinstance(obj, (list, tuple, set, frozenset)):
        fields = {str(i): v for i, v in enumerate(obj)}
    yield from (fields or {}).items()


CONTAINERS = (dict, list, tuple, set, frozenset)


def _walk(starts: list[tuple[str, object]], enter: Callable[[object], bool],
          hit: Callable[[Any], list[str]], seen: set[int]) -> list[str]:
    """Breadth first from ``starts`` (each place named by its shortest path): at every callable,
    ``hit`` names what it refers to (each found as the place plus that name, and not walked into);
    other values are walked into where ``enter`` says so."""
    found: list[str] = []
    queue: deque[tuple[str, object]] = deque(starts)
    while queue:
        where, obj = queue.popleft()
        if id(obj) in seen or isinstance(obj, NOT_WALKED):
            continue
        seen.add(id(obj))
        for name, value in _held(obj):
            here = f"{where}.{name}"
            if callable(value) and not inspect.isclass(value):
                names = hit(value)
                if names:
                    found += [here + n for n in names]
                    continue
            if enter(value) or isinstance(value, CONTAINERS):
                queue.append((here, value))
    return found


def _module(value: object) -> str:
    return type(value).__module__ or ""


def callbacks_up(engine: Engine) -> list[str]:
    """Every place a part (anything of Slotkeeper the engine holds, however deep) keeps a callable
    of the engine or the door."""
    targets = (engine, engine.front)
    starts = [(f"engine.{k}", v) for k, v in vars(engine).items() if not k.startswith("_")]
    return sorted(_walk(starts, lambda v: _module(v).startswith("slotkeeper.") and v is not engine.front,
                        lambda fn: [""] if _refers_to(fn, targets, set()) else [], {id(engine)}))


@pytest.fixture
def engine():
    eng = Engine(app_paths(), Settings())
    yield eng
    eng.close(save=False)


def test_no_part_holds_a_callable_of_the_engine_or_the_door(engine):
    assert callbacks_up(engine) == []


def test_the_check_finds_a_callback_up_where_there_is_one(engine):
    engine.board.policy.hook = lambda: engine.restart()  # a closure over the engine, deep in a part
    engine.library.on_ready = engine.front.start  # a method of the door
    engine.rates.notify = functools.partial(print, engine)  # the engine as an argument
    assert callbacks_up(engine) == ["engine.board.policy.hook", "engine.library.on_ready",
                                    "engine.rates.notify"]


def test_the_door_is_reached_only_from_above(engine):
    """The front door takes the front desk (below it); nothing below holds the door."""
    assert engine.front.desk is engine.desk
    for part in (engine.desk, engine.board, engine.actions, engine.saves, engine.library, engine.ledger,
                 engine.poller, engine.link, engine.rates, engine.identity, engine.launcher, engine.prompts,
                 engine.supervisor):
        assert not any(v is engine.front or isinstance(v, FrontDoor) for v in vars(part).values())


def test_the_faces_use_the_engines_face_not_its_parts():
    """The GUI and the command line talk to the engine through its face (``EngineFace``: reading,
    commands, the sessions service) and events; they never reach into its parts, nor import them
    (only the ``slotkeeper.core.engine`` package itself)."""
    import re
    from pathlib import Path

    app = Path(__file__).resolve().parents[2] / "app" / "slotkeeper"
    faces = [*app.joinpath("gui").rglob("*.py"), *app.joinpath("cli").rglob("*.py"), *app.glob("*.py")]
    importing = re.compile(r"^\s*(from|import)\s+slotkeeper\.core\.engine\.")
    imports = [f"{p.relative_to(app)}: {line.strip()}" for p in faces for line in p.read_text().splitlines()
               if importing.search(line)]
    assert imports == []
    parts = re.compile(r"\bengine\.(supervisor|history|library|board|link|saves|actions|store|ledger"
                       r"|poller|desk|front|prompts|launcher|rates)\b")
    reaching = [f"{p.relative_to(app)}: {line.strip()}" for p in faces for line in p.read_text().splitlines()
                if parts.search(line)]
    assert reaching == []


def climbing_from_below(engine: Engine) -> set[str]:
    """Every callable of an engine part (a module of ``slotkeeper.core.engine``) held by an object
    of Slotkeeper below the engine, found by walking from each of the engine's attributes."""
    held = {name: value for name, value in vars(engine).items() if not name.startswith("_")}
    parts = {n: v for n, v in held.items() if _module(v).startswith("slotkeeper.core.engine.")}

    def enter(value: object) -> bool:  # Slotkeeper's, below the engine
        module = _module(value)
        return module.startswith("slotkeeper.") and not module.startswith("slotkeeper.core.engine")

    below = {n: v for n, v in held.items() if enter(v) and _module(v).startswith("slotkeeper.core.")}

    def hit(fn: Any) -> list[str]:
        return [f" -> {p}" for p, part in parts.items() if _refers_to(fn, (part,), set())]

    return {f for start, obj in below.items() for f in _walk([(start, obj)], enter, hit, set())}


def test_what_is_below_the_engine_holds_no_callable_of_its_parts(engine):
    """The supervisor is handed each launch (commands down) and reports exits, fallbacks and
    leftover servers as events and return values: nothing below the engine asks a part of it."""
    assert climbing_from_below(engine) == set()


def test_the_check_from_below_finds_a_callable_up(engine):
    engine.supervisor.on_exit = engine.board.lock  # a part's method handed down
    launcher = engine.launcher
    engine.library.sessions.on_deleted = lambda ids: launcher.begin()  # a closure over a part
    assert climbing_from_below(engine) == {"supervisor.on_exit -> board", "sessions.on_deleted -> launcher"}


def engine_layers() -> dict[str, int]:
    """Each module of the engine's parts with its layer (0 the top), as the import contract
    "Inside the engine, each part imports only the parts below it" orders them."""
    from pathlib import Path

    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    [contract] = [c for c in project["tool"]["importlinter"]["contracts"]
                  if c["name"].startswith("Inside the engine")]
    return {f"slotkeeper.core.engine.{m.strip()}": i for i, layer in enumerate(contract["layers"])
            for m in layer.split("|")}


def climbing_between_parts(engine: Engine) -> set[str]:
    """Every callable of an engine part held by another part of a lower layer (the parts below a
    part never hold its callables: it calls them, they answer or say so with events)."""
    layer = engine_layers()
    parts = {n: v for n, v in vars(engine).items()
             if not n.startswith("_") and _module(v) in layer}
    found: set[str] = set()
    for name, part in parts.items():
        above = {q: other for q, other in parts.items() if layer[_module(other)] < layer[_module(part)]}
        others = {id(v) for v in parts.values() if v is not part}

        def enter(value: object, others: set[int] = others) -> bool:  # its own objects, never another part
            return _module(value).startswith("slotkeeper.") and id(value) not in others

        def hit(fn: Any, above: dict[str, object] = above) -> list[str]:
            return [f" -> {q}" for q, other in above.items() if _refers_to(fn, (other,), set())]

        found |= set(_walk([(name, part)], enter, hit, {id(engine)}))
    return found


def test_no_part_holds_a_callable_of_a_part_above_it(engine):
    layer = engine_layers()
    parts = [v for n, v in vars(engine).items() if _module(v).startswith("slotkeeper.core.engine.")]
    assert len(parts) > 10 and all(_module(v) in layer for v in parts)  # every part has its layer
    assert climbing_between_parts(engine) == set()


def test_the_check_between_parts_finds_one(engine):
    engine.board.on_change = engine.desk.leave  # the board (below) holding the desk's method (above)
    engine.link.after = engine.link.upstream  # a part's own method is not climbing
    assert climbing_between_parts(engine) == {"board.on_change -> desk"}
