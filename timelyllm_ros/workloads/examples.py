"""A seeded generator of LRTrace examples: the *rules* behind the reference plans of
`workloads/lrtrace_tasks.yaml` (plan = f(task, scene)), so it can produce any number of fresh,
scene-dependent examples to train the bundled tiny planner (scripts/build_tiny_model.py,
scripts/train_length_predictor.py) and to evaluate it on held-out scenes (benchmarks/model_validity.py).

It stays in the package rather than beside the model scripts because the model-validity benchmark
and the tests import it too (benchmarks import the installed package only).

Blocking skills (scan, detect) return a value the plan depends on: a plan is a list of `Step`s,
and a blocking step carries the continuation to write when it returns False.  The committed plan
text is the all-True path; `render_example` interleaves result annotations (see prompts.py) so the
model learns to continue from either outcome.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from .catalog import TaskDef

# --------------------------------------------------------------------------------------------
# Synthetic examples: the rules behind the reference plans
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Step:
    """One statement; a blocking step's `on_false` replaces the rest of the plan if it returns False."""

    stmt: str
    blocking: bool = False
    on_false: list["Step"] | None = None


@dataclass(frozen=True, slots=True)
class Example:
    task_id: str
    robot_type: str
    task: str
    scene: str
    steps: tuple[Step, ...] = ()
    reply: str = ""  # chat robots

    @property
    def plan(self) -> str:
        """The all-True plan text (what the committed reference plans hold)."""
        return self.reply if self.reply else "".join(s.stmt for s in self.steps)


def _q(s: str) -> str:
    return f"'{s}'"


def _scan(obj: str, then: list[Step], robot: str = "tello") -> list[Step]:
    """Scan for an object; on False, report it and stop (the generic failure path)."""
    skill = "s" if robot == "tello" else "dt"
    fail = [Step(f"l('no {obj} found');")] if robot == "tello" else [Step(f"l('no {obj} found');"), Step("hm;")]
    return [Step(f"{skill}({_q(obj)});", True, fail)] + then


HOUSE = ["chair", "sofa", "lamp", "table", "tv", "plant", "rug", "shelf", "door", "window", "bed",
         "desk", "clock", "box", "basket", "pillow", "mirror", "bag", "cup", "laptop"]
OPPOSITE = {"ahead": "mb", "behind": "mf", "left": "mr", "right": "ml", "above": "md", "below": "mu"}


def _objects(rng: random.Random, must: Sequence[str], avoid: Sequence[str], n: tuple[int, int] = (2, 5)) -> list[str]:
    pool = [o for o in HOUSE if o not in avoid and o not in must]
    objs = rng.sample(pool, rng.randint(*n)) + list(must)
    rng.shuffle(objs)
    return objs


def _t1(rng: random.Random) -> tuple[str, list[Step]]:
    visible = rng.random() < 0.5
    objs = _objects(rng, ["cat"] if visible else [], ["cat"])
    then = [Step("g('cat');"), Step("tp;")]
    return "objects: " + ", ".join(objs), then if visible else _scan("cat", then)


def _t2(rng: random.Random) -> tuple[str, list[Step]]:
    which = rng.choice(["keys", "wallet", None])
    objs = _objects(rng, [which] if which else [], ["keys", "wallet"])
    if which:
        return "objects: " + ", ".join(objs), [Step(f"g('{which}');"), Step("tp;"), Step(f"l('found the {which}');")]
    then = [Step("g('keys');"), Step("tp;"), Step("l('found the keys');")]
    wallet = [Step("s('wallet');", True, [Step("l('no keys or wallet found');")]), Step("g('wallet');"), Step("tp;"),
              Step("l('found the wallet');")]
    return "objects: " + ", ".join(objs), [Step("s('keys');", True, wallet)] + then


def _t3(rng: random.Random) -> tuple[str, list[Step]]:
    visible = rng.random() < 0.5
    height = rng.choice([130, 150, 170, 190, 210])
    objs = _objects(rng, ["cabinet"] if visible else [], ["cabinet"])
    then = [Step("g('cabinet');"), Step(f"mu({height - 100});"), Step("g('book');"), Step("tp;")]
    scene = "objects: " + ", ".join(objs) + f"; cabinet height: {height} cm"
    return scene, then if visible else _scan("cabinet", then)


def _t4(rng: random.Random) -> tuple[str, list[Step]]:
    visible = rng.random() < 0.5
    objs = _objects(rng, ["bed"] if visible else [], ["bed", "toy"])
    then = [Step("g('bed');"), Step("md(50);")] + _scan("toy", [Step("g('toy');"), Step("tp;")])
    return "objects: " + ", ".join(objs), then if visible else _scan("bed", then)


CUTTERS = ["scissors", "knife", "cutter"]


def _t5(rng: random.Random) -> tuple[str, list[Step]]:
    which = rng.choice(CUTTERS + [None])
    objs = _objects(rng, [which] if which else [], CUTTERS)
    if which:
        return "objects: " + ", ".join(objs), [Step(f"g('{which}');"), Step("tp;"), Step(f"l('found {which}');")]
    return "objects: " + ", ".join(objs), _scan("scissors", [Step("g('scissors');"), Step("tp;"),
                                                             Step("l('found scissors');")])


def _t6(rng: random.Random) -> tuple[str, list[Step]]:
    d = rng.choice(range(30, 101, 10))
    where = rng.choice(["ahead", "behind", "left", "right"])
    objs = _objects(rng, ["person"], ["person"], (1, 3))
    return (f"objects: {', '.join(objs)}; person: {d} cm {where}",
            [Step(f"{OPPOSITE[where]}({150 - d});"), Step("mu(50);")])


OBSTACLES = ["wall", "tree", "pole", "door", "shelf", "drone", "lamp"]


def _t7(rng: random.Random) -> tuple[str, list[Step]]:
    d = rng.choice(range(20, 81, 10))
    where = rng.choice(list(OPPOSITE))
    ob = rng.choice(OBSTACLES)
    objs = _objects(rng, [ob], [ob], (1, 3))
    return (f"objects: {', '.join(objs)}; {ob}: {d} cm {where}",
            [Step(f"{OPPOSITE[where]}({120 - d});"), Step(f"l('avoided the {ob}');")])


FLYING = ["bird", "goose", "bee"]
WALKING = ["dog", "cat", "goat"]


def _t8(rng: random.Random) -> tuple[str, list[Step]]:
    animal = rng.choice(FLYING + WALKING)
    where = rng.choice(["ahead", "behind", "left", "right"])
    objs = _objects(rng, [animal], [animal], (1, 3))
    first = Step("md(100);") if animal in FLYING else Step("mu(150);")
    dist = 300 if animal in FLYING else 200
    return (f"objects: {', '.join(objs)}; {animal}: chasing from the {where}" if where in ("left", "right")
            else f"objects: {', '.join(objs)}; {animal}: chasing from {where}",
            [first, Step(f"{OPPOSITE[where]}({dist});")])


COLORS = ["red", "blue", "green", "yellow", "white", "black", "purple", "pink"]
TABLE = ["cup", "pen", "tray", "book", "cloth", "plate", "phone"]


def _t9(rng: random.Random) -> tuple[str, list[Step]]:
    boxes = [f"{c} box" for c in rng.sample(COLORS, rng.randint(3, 4))]
    extra = rng.sample(TABLE, rng.randint(0, 2))
    steps = [Step("hm;")] + _scan(boxes[0], [], "arm")
    for below, top in zip(boxes, boxes[1:]):
        steps += _scan(top, [Step(f"pk('{top}');"), Step(f"pl('{below}');")], "arm")
    steps.append(Step("hm;"))
    return f"boxes bottom to top: {', '.join(boxes)}; other objects: {', '.join(extra) or 'none'}", steps


TRAY_ITEMS = ["cup", "mug", "bottle", "can", "plate"]
PEN_ITEMS = ["pen", "pencil", "marker", "ruler"]
BIN_ITEMS = ["paper", "wrapper", "tissue", "receipt"]


def _t10(rng: random.Random) -> tuple[str, list[Step]]:
    items = rng.sample(TRAY_ITEMS + PEN_ITEMS + BIN_ITEMS, rng.randint(2, 3))
    cloth = rng.random() < 0.7
    x, y = rng.choice(range(-30, 31, 5)), rng.choice(range(30, 61, 5))
    steps = [Step("hm;")]
    for it in items:
        dest = "tray" if it in TRAY_ITEMS else "pen holder" if it in PEN_ITEMS else "bin"
        steps += [Step(f"pk('{it}');"), Step(f"pl('{dest}');")]
    if cloth:
        steps += [Step("pk('cloth');"), Step(f"mt({x},{y},10);"), Step("wp('desk');"), Step("pl('cloth rack');")]
    steps.append(Step("hm;"))
    objs = items + (["cloth"] if cloth else [])
    return f"objects on desk: {', '.join(objs)}; desk centre: ({x}, {y})", steps


FRUITS = ["apple", "banana", "orange", "pear", "lemon", "peach", "mango", "plum"]
VEGETABLES = ["carrot", "potato", "onion", "broccoli", "cucumber", "pepper", "cabbage", "eggplant"]


def _t11(rng: random.Random) -> tuple[str, list[Step]]:
    n = rng.randint(2, 4)
    items = rng.sample(FRUITS, rng.randint(1, n - 1))
    items += rng.sample(VEGETABLES, n - len(items))
    rng.shuffle(items)
    steps = [Step("hm;")]
    for it in items:
        dest = "fruit bowl" if it in FRUITS else "vegetable basket"
        steps += _scan(it, [Step(f"pk('{it}');"), Step(f"pl('{dest}');")], "arm")
    steps.append(Step("hm;"))
    return f"objects: {', '.join(items)}; containers: fruit bowl, vegetable basket", steps


WEATHER_ADVICE = {"sunny": "It is a good day to go outside.", "cloudy": "It might get cooler later.",
                  "rainy": "Take an umbrella if you go out.", "windy": "Hold on to your hat outside.",
                  "snowy": "Wear warm clothes if you go out."}


def _c1(rng: random.Random) -> tuple[str, str]:
    w = rng.choice(list(WEATHER_ADVICE))
    t = rng.choice(range(-8, 3)) if w == "snowy" else rng.choice(range(5, 36))
    return (f"weather: {w}; temperature: {t} degrees",
            f"It is {w} today. The temperature is about {t} degrees. {WEATHER_ADVICE[w]}")


def _c2(rng: random.Random) -> tuple[str, str]:
    room, floor = rng.randint(1, 20), rng.randint(1, 4)
    how = ("It is on this floor, so you can walk there directly." if floor == 1
           else f"Take the elevator to floor {floor} and follow the signs.")
    return (f"charging station: room {room}, floor {floor}; you are on floor 1",
            f"The charging station is in room {room} on floor {floor}. {how} Let me know if you need more help.")


BOOKS = {"science fiction": "Dune", "mystery": "The Hound of the Baskervilles", "history": "The Guns of August",
         "poetry": "Leaves of Grass", "fantasy": "The Hobbit", "adventure": "Treasure Island"}


def _c3(rng: random.Random) -> tuple[str, str]:
    g = rng.choice(list(BOOKS))
    n = rng.choice(range(10, 95, 5))
    return (f"user likes: {g}; reading time: {n} minutes a day",
            f"Since you like {g}, I recommend {BOOKS[g]}. It is a classic of the genre. "
            f"If you read {n} minutes a day, you will enjoy it soon.")


@dataclass(frozen=True, slots=True)
class TaskRule:
    name: str
    robot_type: str
    category: str
    task: str
    make: Callable[[random.Random], tuple[str, Any]]


RULES: dict[str, TaskRule] = {
    "T1": TaskRule("look for the cat", "tello", "normal", "Look for the cat and take a picture of it.", _t1),
    "T2": TaskRule("check for keys or wallets", "tello", "normal",
                   "Check if my keys or my wallet are here and take a picture.", _t2),
    "T3": TaskRule("check the book on the cabinet", "tello", "normal",
                   "Check the book on the cabinet and take a picture of it.", _t3),
    "T4": TaskRule("find a toy under the bed", "tello", "normal", "Find the toy under the bed.", _t4),
    "T5": TaskRule("find a tool for cutting paper", "tello", "normal", "Find a tool for cutting paper.", _t5),
    "T6": TaskRule("avoiding human injury", "tello", "urgent",
                   "A person is too close. Move away at once to avoid injuring them.", _t6),
    "T7": TaskRule("preventing potential collision", "tello", "urgent",
                   "An obstacle is too close. Move away at once to prevent a collision.", _t7),
    "T8": TaskRule("evading animal pursuit", "tello", "urgent", "An animal is chasing you. Evade it at once.", _t8),
    "T9": TaskRule("object stacking", "arm", "normal", "Stack the boxes in the given order.", _t9),
    "T10": TaskRule("desk cleaning", "arm", "normal", "Clean the desk: put every object away and wipe it.", _t10),
    "T11": TaskRule("fruit and vegetable classification", "arm", "normal",
                    "Sort the fruits into the fruit bowl and the vegetables into the vegetable basket.", _t11),
    "C1": TaskRule("weather question", "chat", "chat", "What is the weather like today?", _c1),
    "C2": TaskRule("charging station question", "chat", "chat", "Where is the charging station?", _c2),
    "C3": TaskRule("book recommendation", "chat", "chat", "Can you recommend a book?", _c3),
}


def generate(task_id: str, rng: random.Random) -> Example:
    """One fresh synthetic example of a task (scene and plan drawn with `rng`)."""
    rule = RULES.get(task_id)
    if rule is None:
        raise KeyError(f"unknown LRTrace task {task_id!r}; known: {sorted(RULES)}")
    scene, body = rule.make(rng)
    if rule.robot_type == "chat":
        return Example(task_id, rule.robot_type, rule.task, scene, reply=body)
    return Example(task_id, rule.robot_type, rule.task, scene, steps=tuple(body))


def generate_many(task_ids: Sequence[str], n_per_task: int, seed: int,
                  exclude_scenes: set[tuple[str, str]] | None = None, max_tries: int = 50) -> list[Example]:
    """`n_per_task` distinct examples per task (seeded), skipping (task_id, scene) in `exclude_scenes`."""
    rng = random.Random(seed)
    out: list[Example] = []
    for tid in task_ids:
        seen = set(exclude_scenes or ())
        made = 0
        tries = 0
        while made < n_per_task and tries < n_per_task * max_tries:
            tries += 1
            ex = generate(tid, rng)
            if (tid, ex.scene) in seen:
                continue
            seen.add((tid, ex.scene))
            out.append(ex)
            made += 1
    return out


def outcome_paths(steps: Sequence[Step], rng: random.Random, p_annotate: float = 0.5,
                  p_false: float = 0.25) -> list[tuple[str, bool | None]]:
    """One path through a plan as (statement, result) pairs: result None = no annotation written,
    True/False = the blocking call's result was fed back (and False switches to `on_false`)."""
    out: list[tuple[str, bool | None]] = []
    annotate = rng.random() < p_annotate
    seq = list(steps)
    i = 0
    while i < len(seq):
        st = seq[i]
        if st.blocking and annotate:
            ok = not (st.on_false is not None and rng.random() < p_false)
            out.append((st.stmt, ok))
            if not ok:
                seq = list(st.on_false or [])
                i = 0
                continue
        else:
            out.append((st.stmt, None))
        i += 1
    return out


HELD_OUT_SEED = 777


@dataclass(frozen=True, slots=True)
class EvalItem:
    task_id: str
    robot_type: str
    task: str
    scene: str
    plan: str
    source: str  # "file" (the committed task file) | "generated" (held-out draw)
    false_plan: str = ""  # generated items: the plan when the first blocking call returns False


def false_path(steps: Sequence[Step]) -> str:
    """Plan text when the first blocking call returns False (later ones True); "" if none blocks."""
    for i, st in enumerate(steps):
        if st.blocking and st.on_false is not None:
            return "".join(s.stmt for s in steps[: i + 1]) + "".join(s.stmt for s in st.on_false)
    return ""


def held_out(tasks: dict[str, TaskDef], n_generated: int = 10, seed: int = HELD_OUT_SEED) -> list[EvalItem]:
    """Evaluation scenes never used for training: every scene of the task file plus `n_generated`
    fresh draws per task (seeded).  The model build skips all of them."""
    items = [EvalItem(tid, t.robot_type, t.task, s.scene, s.plan, "file")
             for tid, t in tasks.items() for s in t.scenes]
    seen = {(i.task_id, i.scene) for i in items}
    for ex in generate_many([t for t in tasks if t in RULES], n_generated, seed, exclude_scenes=seen):
        items.append(EvalItem(ex.task_id, ex.robot_type, ex.task, ex.scene, ex.plan, "generated",
                              false_path(ex.steps)))
    return items


def dump_reference_file(path: str | Path, n_per_task: int = 6, seed: int = 20240601) -> None:
    """Write a task file from the rules (how the committed file's scenes were first drawn)."""
    data: dict[str, Any] = {"tasks": {}}
    for tid, rule in RULES.items():
        exs = generate_many([tid], n_per_task, seed + sum(map(ord, tid)))
        data["tasks"][tid] = {"name": rule.name, "robot_type": rule.robot_type, "category": rule.category,
                              "task": rule.task, "scenes": [{"scene": e.scene, "plan": e.plan} for e in exs]}
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False, width=200, allow_unicode=True))
