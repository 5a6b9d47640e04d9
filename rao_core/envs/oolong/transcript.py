"""Seeded tabletop-RPG session transcripts rendered from an event log.

The log (rolls, spells, arrivals, with session and in-game day) is the ground truth; the text is
dialogue lines that render each event in one of a few phrasings, between sessions headers, day
markers and chatter. Chatter mentions spells, places and natural 20s without being events (saving
a spell, missing a town, a monster's roll), so counting words is not counting events. The same
seed always gives the same transcript; its length stops just under the target in characters.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

CHARACTERS = "Vex Orin Thalia Bram Kestrel Mira Dorn Sable Quill Ysolde Fenn Liora".split()
SPELLS = [
    "Fireball", "Magic Missile", "Cure Wounds", "Healing Word", "Shield", "Eldritch Blast",
    "Thunderwave", "Hold Person", "Bless", "Counterspell", "Misty Step", "Sacred Flame",
    "Guiding Bolt", "Lightning Bolt", "Hex", "Faerie Fire",
]  # fmt: skip
PLACES = [
    "Ravenhollow", "Port Kessel", "Emberfall", "Mistral Keep", "Thornwood", "Saltmarsh", "Duskmere",
    "Ironvale", "Gallows Hill", "Brindle Crossing", "Oakshade", "Vesper Isle", "Copperjaw Mine",
    "Wyrmrest", "Highmoor", "Lantern Bay", "Cinder Pass", "Frostholm", "Marrow Fen", "Stillwater",
]  # fmt: skip
SKILLS = (
    "Perception Stealth Athletics Insight Persuasion Arcana Investigation Acrobatics Survival Attack".split()
)
MONSTERS = "goblin owlbear ghoul bandit wyvern troll cultist mimic harpy skeleton".split()
ITEMS = "rope torch potion map lantern dagger amulet scroll key coin".split()

CHATTER = [
    "{A}: Wait, how many hit points does the {monster} have left?",
    "{A}: I'm saving {spell} for something big.",
    "{A}: Does {spell} even work on a {monster}?",
    "{A}: I still miss {place}, honestly.",
    "{A}: Remember that natural 20 {B} rolled last week?",
    "{A}: Can someone pass the chips?",
    "{A}: I check my pack for the {item}.",
    "{A}: {B}, you take the front. I'll watch the back.",
    "{A}: Is the {item} magical? It looks magical.",
    "{A}: I hand the {item} to {B}.",
    "{A}: We should not trust the mayor of {place}.",
    "{A}: Okay, okay, I'm back. What did I miss?",
    "{A}: I whisper to {B}: this feels like a trap.",
    "{A}: Do I know anything about {monster}s?",
    "DM: The {monster} snarls and circles around {A}.",
    "DM: Rumours say the road to {place} is closed this season.",
    "DM: The {monster} rolls a {n} to hit {A}.",
    "DM: You hear footsteps somewhere behind the door.",
    "DM: The innkeeper slides a {item} across the counter.",
    "DM: Rain starts to fall, soft at first, then harder.",
    "DM: {A}, the {monster} is still standing. What do you do?",
    "DM: Let's take a five minute break, everyone.",
    "DM: Someone in the crowd mutters about {place}.",
    "DM: The {monster} drops to the ground and does not move.",
]
ROLLS = [
    "{A}: (rolls d20 for {skill}) {v}",
    "{A}: {skill} check... that's a {v}.",
    "DM: {A}, your {skill} roll comes up {v}.",
]
SPELL_LINES = ["{A}: I cast {spell}.", "{A}: Casting {spell} on the {monster}!", "DM: {A} casts {spell}."]
TRAVEL = [
    "DM: You arrive at {place}.",
    "DM: The party reaches {place}.",
    "DM: After hours on the road, you come to {place}.",
]


@dataclass(frozen=True)
class Event:
    kind: str  # roll | spell | travel
    session: int
    day: int
    actor: str  # "" for travel: the whole party moves
    what: str  # skill, spell or place
    value: int = 0  # the die face of a roll

    def as_list(self) -> list:
        return [self.kind, self.session, self.day, self.actor, self.what, self.value]


@dataclass
class Transcript:
    text: str
    events: list[Event]
    characters: list[str]
    sessions: int


class _Writer:
    """Appends lines until the next one would pass the target length."""

    def __init__(self, target: int) -> None:
        self.lines: list[str] = []
        self.events: list[Event] = []
        self.size, self.target, self.full = 0, target, False

    def emit(self, line: str, event: Event | None = None) -> bool:
        if self.full or self.size + len(line) + 1 > self.target:
            self.full = True
            return False
        self.lines.append(line)
        self.size += len(line) + 1
        if event is not None:
            self.events.append(event)
        return True


def sessions_for(target_chars: int) -> int:
    """More sessions in longer transcripts: 2 up to ~30K characters, at most 12."""
    return max(2, min(12, round(target_chars / 20000) + 1))


def generate(seed: str | int, target_chars: int, speakers: int = 4) -> Transcript:
    """A transcript of at most `target_chars` characters (and within one line of it)."""
    rng = random.Random(f"oolong-transcript:{seed}")
    cast = rng.sample(CHARACTERS, speakers)
    weight = {s: 0.05 + rng.random() ** 2 for s in SPELLS}  # a skewed favourite spell per table
    known = {c: rng.sample(SPELLS, rng.randint(2, 5)) for c in cast}
    out = _Writer(target_chars)
    n_sessions = sessions_for(target_chars)
    day, hour, place = rng.randint(1, 40), 8, ""

    def fill(template: str, **kw: str) -> str:
        a, b = rng.sample(cast, 2)
        slots = dict(A=a, B=b, monster=rng.choice(MONSTERS), spell=rng.choice(SPELLS))
        slots.update(place=rng.choice(PLACES), item=rng.choice(ITEMS), n=str(rng.randint(1, 20)))
        return template.format(**{**slots, **kw})

    def travel(session: int) -> None:
        nonlocal place
        place = rng.choice([p for p in PLACES if p != place])
        out.emit(rng.choice(TRAVEL).format(place=place), Event("travel", session, day, "", place))

    for k in range(1, n_sessions + 1):
        budget = target_chars * k // n_sessions
        out.emit(f"=== Session {k} ===")
        out.emit(f"[Day {day}, {hour:02d}:00]")
        if rng.random() < 0.5:
            travel(k)
        while out.size < budget and not out.full:
            r = rng.random()
            if r < 0.05:
                hour += rng.randint(1, 3)
                if hour > 22:
                    day, hour = day + 1, rng.randint(7, 10)
                out.emit(f"[Day {day}, {hour:02d}:00]")
            elif r < 0.08:
                travel(k)
            elif r < 0.28:
                actor, skill, v = rng.choice(cast), rng.choice(SKILLS), rng.randint(1, 20)
                if v in (1, 20) and rng.random() < 0.5:
                    line = f"{actor}: Natural {v} on {skill}" + ("!" if v == 20 else ". Ugh.")
                else:
                    line = rng.choice(ROLLS).format(A=actor, skill=skill, v=v)
                out.emit(line, Event("roll", k, day, actor, skill, v))
            elif r < 0.38:
                actor = rng.choice(cast)
                spell = rng.choices(known[actor], [weight[s] for s in known[actor]])[0]
                line = fill(rng.choice(SPELL_LINES), A=actor, spell=spell)
                out.emit(line, Event("spell", k, day, actor, spell))
            else:
                out.emit(fill(rng.choice(CHATTER)))
        day, hour = day + rng.randint(1, 3), rng.randint(8, 12)
    text = "".join(line + "\n" for line in out.lines)
    sessions = sum(line.startswith("=== Session ") for line in out.lines)
    return Transcript(text, out.events, cast, sessions)
