"""A labelled recall data set of long multi-session conversations, generated deterministically.

The shape of the held-out evaluation ``benchmarks/recall.py`` stands in for (issue 12): one memory
per dialogue turn, the speaker as an entity (``Speaker:<name> -SAID-> turn``), sessions spread over
months, one agent per conversation, and questions labelled with the turns that answer them.

What makes it a fair test rather than a lexical game:

- **Questions paraphrase their evidence.** Every fact is stated with one surface form and asked
  about with another (``puppy`` → "dog", ``signed up for a pottery course`` → "started making
  ceramics"); only names and a few content words may overlap, as when a person asks.
- **Hard negatives.** The other speaker reacts to each fact with the same words; both speakers
  talk about the same topics at other times (chatter); facts that change (a job, a home) are
  stated twice months apart, so the older statement is a near-duplicate of the answer.
- **Question types**: a single fact, its detail, "when", "who said it" (no speaker to filter by),
  which of two events came first (two evidence turns months apart), "all the X that S did"
  (evidence over many sessions), and "what is S's current X" (the newest of two statements).
- **Generality.** Two families with different topics, vocabulary, speaker counts, text formats
  and question styles: ``life`` (two friends chatting, LoCoMo-like, turns prefixed "Name: ") and
  ``work`` (three colleagues, terse search-style queries, no name prefix in the text — the speaker
  is known only as an entity). A method that wins on one family only is tuned to a generator quirk.

Splits (``split(name)``): ``dev`` (life, conversations 0-3) for development, ``test`` (life 4-7)
looked at only to report, ``general`` (work 0-3), and ``ci`` (one small conversation of each
family) for the regression test. Everything is a pure function of the family, index and size:
the same call gives the same texts, ids, dates and labels on every machine.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

NAMESPACE = uuid.UUID("5d1e4a0c-7b1f-4f5e-9a53-2f0e0c4a9b71")
SPEAKER_TYPE = "Speaker"
SAID = "SAID"


@dataclass(frozen=True, slots=True)
class Turn:
    id: uuid.UUID
    agent_id: str
    speaker: str
    text: str
    created_at: datetime
    session: int
    entities: tuple[tuple[str, str], ...]  # (type, name) besides the speaker


@dataclass(frozen=True, slots=True)
class Question:
    agent_id: str
    text: str
    kind: str  # fact | detail | when | who | order | all | current
    evidence: tuple[uuid.UUID, ...]
    speaker: str | None  # the person the question is about (None: finding the speaker is the task)


@dataclass(slots=True)
class Conversation:
    agent_id: str
    family: str
    speakers: list[str]
    turns: list[Turn] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------
# Topic tables. A slot value is (how the speaker says it, how a questioner refers to it).


@dataclass(frozen=True, slots=True)
class Topic:
    key: str
    slots: dict[str, list[tuple[str, str]]]
    say: list[str]  # the fact, by its speaker
    react: list[str]  # the other speaker's reaction: same topic, not the answer
    detail: list[str]  # a second turn by the speaker with a detail
    q_fact: list[str]
    q_detail: list[str]
    q_when: list[str]
    act: list[str]  # a noun phrase for the event, as a questioner would name it
    chatter: list[str]  # the topic mentioned in passing (distractor), by anyone
    entities: dict[str, str] = field(default_factory=dict)  # slot -> entity type, when named in a turn
    category: str = ""  # topics of one category make "all the X" questions
    stateful: bool = False  # stated twice, months apart: "current" questions ask for the newer


def _t(**kw: object) -> Topic:
    return Topic(**kw)  # type: ignore[arg-type]


LIFE_TOPICS: list[Topic] = [
    _t(
        key="pet",
        slots={
            "a": [("beagle puppy", "dog"), ("tabby kitten", "cat"), ("lop-eared rabbit", "bunny")],
            "n": [(x, x) for x in ("Biscuit", "Luna", "Pepper", "Milo", "Nala")],
        },
        say=["I finally adopted a {a} from the shelter on Saturday!", "We brought home a little {a} last weekend."],
        react=["Oh how sweet, a {a}! Pets change everything.", "No way, I love animals. Send pictures!"],
        detail=["We named the {a} {n}, it already sleeps on my pillow.", "Its name is {n}, the kids picked it."],
        q_fact=["What kind of animal did {S} get from the shelter?", "Which pet joined {S}'s household?"],
        q_detail=["What is the name of {S}'s new {a?}?", "What did {S}'s family call the {a?}?"],
        q_when=["When did {S} adopt the {a?}?"],
        act=["getting a {a?}"],
        entities={"n": "Pet"},
        chatter=["There was a {a} at the park today that reminded me of you.", "Do you think pets are worth it?"],
    ),
    _t(
        key="trip",
        slots={
            "p": [("Lisbon", "Portugal"), ("Kyoto", "Japan"), ("Reykjavik", "Iceland"), ("Marrakesh", "Morocco")],
            "w": [("my cousin", "a relative"), ("my college roommate", "an old friend"), ("my mom", "a parent")],
        },
        say=["Just got back from a week in {p}, the food was unreal.", "I spent ten days in {p}, still jetlagged."],
        react=["{p}! I've always wanted to go there.", "That sounds like an amazing trip, so jealous."],
        detail=["I went with {w}, we hiked around {p} every morning.", "{w} came along and planned everything."],
        q_fact=["Which country did {S} visit on vacation?", "Where did {S} travel abroad?"],
        q_detail=["Who accompanied {S} on the journey to {p?}?"],
        q_when=["When did {S} take the vacation in {p?}?"],
        act=["the holiday in {p?}"],
        entities={"p": "Place"},
        chatter=["I keep looking at flights to {p} but it's so expensive.", "Travel is exhausting sometimes."],
        category="travel",
    ),
    _t(
        key="hobby",
        slots={
            "h": [
                ("pottery course", "ceramics"),
                ("watercolor workshop", "painting"),
                ("beginner guitar lessons", "music"),
                ("salsa dance class", "dancing"),
                ("sourdough baking course", "bread making"),
            ],
            "x": [("a retired sculptor", "an artist"), ("a very patient teacher", "an instructor")],
        },
        say=["I signed up for a {h} on Tuesday evenings, it's so relaxing.", "Started a {h} this month, love it."],
        react=["A {h}? That's so cool, you have to show me.", "I could never do that, I have zero patience."],
        detail=["The {h} is run by {x} who is hilarious.", "Our teacher is {x}, she makes it fun."],
        q_fact=["What new creative activity did {S} take up?", "What pastime did {S} start recently?"],
        q_detail=["Who leads the {h?} sessions {S} goes to?"],
        q_when=["When did {S} begin learning {h?}?"],
        act=["starting {h?}"],
        chatter=["I saw an ad for a {h} but I'm too busy.", "Hobbies keep me sane honestly."],
        category="hobby",
    ),
    _t(
        key="job",
        slots={
            "j": [
                ("a bakery downtown", "a bakery"),
                ("the city library", "a library"),
                ("a small design studio", "a design firm"),
                ("the children's hospital", "a hospital"),
                ("a bike repair shop", "a bicycle store"),
            ],
        },
        say=["I got the job at {j}, I start next week!", "So I'm working at {j} now, it's a big change."],
        react=["Congrats on {j}! You deserve it.", "New jobs are scary but exciting."],
        detail=["The hours are early but my manager is kind.", "The commute is long but I like the people."],
        q_fact=["Where did {S} get hired?"],
        q_detail=[],
        q_when=["When did {S} start the position at {j?}?"],
        act=["the new job at {j?}"],
        chatter=["Work has been draining this week.", "My boss keeps scheduling meetings at lunch."],
        stateful=True,
    ),
    _t(
        key="home",
        slots={"c": [("a flat near the river", "riverside"), ("a tiny house in the suburbs", "suburban")]},
        say=["We moved into {c}, boxes everywhere.", "Big news, I signed the lease on {c}."],
        react=["Moving is the worst, but {c} sounds lovely.", "You need a housewarming party!"],
        detail=["The landlord let us paint the walls green.", "There's a balcony where I grow tomatoes."],
        q_fact=["Where does {S} live?"],
        q_detail=[],
        q_when=["When did {S} relocate?"],
        act=["moving house"],
        chatter=["Rent prices here are ridiculous.", "Our neighbours are loud again."],
        stateful=True,
    ),
    _t(
        key="race",
        slots={
            "r": [
                ("half marathon", "21 km run"),
                ("charity 10k", "fundraising run"),
                ("triathlon", "swim-bike-run race"),
            ]
        },
        say=["I finished the {r} on Sunday, my legs are dead.", "Crossed the finish line of the {r} this weekend!"],
        react=["A {r}? You're a machine.", "I get tired walking to the bus, congrats!"],
        detail=["My {r} time was just under two hours, a personal best.", "I raised money for the animal shelter."],
        q_fact=["What athletic event did {S} complete?"],
        q_detail=["How did {S} do in the {r?}?"],
        q_when=["When did {S} run the {r?}?"],
        act=["the {r?}"],
        chatter=["I should start exercising again.", "My knees hate running."],
        category="sport",
    ),
    _t(
        key="family",
        slots={
            "e": [
                ("my sister's wedding", "a sibling getting married"),
                ("my grandpa's 90th birthday", "a grandparent's celebration"),
                ("my brother's graduation", "a sibling's ceremony"),
            ]
        },
        say=["We had {e} yesterday, I cried the whole time.", "{e} was this weekend, the whole family came."],
        react=["Aww, family events are the best.", "That must have been emotional!"],
        detail=["I gave a speech and somehow didn't forget my lines.", "I baked the cake myself, three layers."],
        q_fact=["What family occasion did {S} attend?"],
        q_detail=["What did {S} contribute to {e?}?"],
        q_when=["When was {e?} that {S} went to?"],
        act=["{e?}"],
        chatter=["My family group chat is chaos.", "Holidays with relatives are a lot."],
    ),
    _t(
        key="book",
        slots={
            "b": [
                ("a novel about a lighthouse keeper", "fiction about the sea"),
                ("a memoir by a mountain climber", "an autobiography about climbing"),
                ("a history of the printing press", "non-fiction about old technology"),
            ]
        },
        say=["I'm reading {b}, can't put it down.", "Just finished {b}, what a ride."],
        react=["Ooh, add it to my list.", "I haven't read anything in months."],
        detail=["My book club picked the book, we meet on Thursdays.", "A coworker lent it to me."],
        q_fact=["What book has {S} been reading?"],
        q_detail=["How did {S} come across {b?}?"],
        q_when=["When did {S} read {b?}?"],
        act=["reading {b?}"],
        chatter=["Bookstores are dangerous for my wallet.", "Audiobooks count as reading, right?"],
    ),
    _t(
        key="injury",
        slots={
            "i": [
                ("sprained my ankle", "hurt a foot"),
                ("broke my wrist", "fractured an arm"),
                ("pulled a muscle in my back", "back injury"),
            ]
        },
        say=["I {i} playing volleyball, so I'm on the couch.", "Ugh, I {i} tripping on the stairs."],
        react=["Oh no! Rest up and take care of yourself.", "That sounds painful, feel better soon."],
        detail=["The doctor said six weeks of physio for the injury.", "I have to wear a brace for a month."],
        q_fact=["What injury did {S} suffer?"],
        q_detail=["What treatment did {S} need after the accident?"],
        q_when=["When did {S} get hurt?"],
        act=["the accident"],
        chatter=["I need to stretch more, everything aches.", "Doctors' waiting rooms are the worst."],
    ),
    _t(
        key="volunteer",
        slots={
            "v": [
                ("the food bank", "a charity that feeds people"),
                ("an animal rescue", "a shelter for animals"),
                ("a literacy program for kids", "teaching children to read"),
            ]
        },
        say=["I started volunteering at {v} on weekends.", "I've been helping out at {v}, it's rewarding."],
        react=["That's really kind of you.", "I keep meaning to volunteer somewhere."],
        detail=["At {v} I mostly sort donations and drive the van.", "I read with two kids every Saturday."],
        q_fact=["Where does {S} do unpaid work?", "Which cause does {S} give time to?"],
        q_detail=["What are {S}'s duties as a volunteer?"],
        q_when=["When did {S} begin volunteering?"],
        act=["volunteering at {v?}"],
        chatter=["There was a fundraiser on the news.", "Giving back is important."],
    ),
    _t(
        key="concert",
        slots={
            "m": [
                ("a jazz trio", "jazz"),
                ("an indie rock band", "rock music"),
                ("the symphony orchestra", "classical music"),
            ]
        },
        say=["Saw {m} live last night, goosebumps the whole show.", "Went to see {m} play, incredible."],
        react=["Live music is the best!", "I'm so jealous, who did you go with?"],
        detail=[
            "We were in the front row at the concert and I lost my voice.",
            "They played an encore for twenty minutes.",
        ],
        q_fact=["What kind of performance did {S} attend?"],
        q_detail=["Where was {S} standing during the {m?} show?"],
        q_when=["When did {S} go to the {m?} concert?"],
        act=["the {m?} gig"],
        chatter=["Concert tickets cost a fortune now.", "I've had the same song stuck in my head all day."],
    ),
]

WORK_TOPICS: list[Topic] = [
    _t(
        key="incident",
        slots={"s": [("payments", "billing"), ("search", "lookup"), ("checkout", "purchase flow"), ("login", "auth")]},
        say=[
            "the {s} service fell over at 3am, connection pool exhausted",
            "paged for {s}: error rate spiked to 40 percent",
        ],
        react=["ouch, was it the same pool bug as last time?", "did we get a postmortem scheduled?"],
        detail=[
            "{s} root cause was a missing index on the orders table",
            "we rolled back and bumped the pool size to 50",
        ],
        q_fact=["{s?} outage overnight cause", "{S} report on the {s?} incident"],
        q_detail=["what fixed the {s?} breakage"],
        q_when=["date of the {s?} outage {S} handled"],
        act=["{s?} outage"],
        entities={"s": "Service"},
        chatter=["on-call this week has been quiet so far", "can someone look at the {s} dashboards later"],
    ),
    _t(
        key="deploy",
        slots={
            "d": [
                ("no canary stage", "no gradual rollout"),
                ("no automated rollback", "manual revert only"),
                ("flaky integration tests", "unreliable test suite"),
            ]
        },
        say=[
            "worried the release pipeline has {d}, one bad build and we're down",
            "honestly the pipeline having {d} scares me",
        ],
        react=["agreed the pipeline needs love", "let's put it on the next planning agenda"],
        detail=[
            "I drafted a pipeline proposal in the wiki with a two-week plan",
            "I can pair with whoever picks it up",
        ],
        q_fact=["{S} concerns about {d?} in delivery", "risk {S} raised about shipping safety"],
        q_detail=["{S} plan to fix the pipeline"],
        q_when=["when {S} flagged the pipeline risk"],
        act=["pipeline concerns"],
        chatter=["the pipeline took 40 minutes again today", "who owns the CI runners these days"],
        category="risk",
    ),
    _t(
        key="hiring",
        slots={
            "r": [
                ("a senior backend engineer", "experienced server developer"),
                ("a data analyst", "analytics hire"),
                ("an SRE", "reliability engineer"),
            ]
        },
        say=["we finally have budget to hire {r}", "opened a req for {r} today"],
        react=["nice, I can help with interviews", "referrals? I know a couple of people"],
        detail=["the loop is a take-home plus a systems design round", "target start date is end of next quarter"],
        q_fact=["{S} new headcount role", "which position {S} is recruiting for"],
        q_detail=["interview process for the {r?} opening"],
        q_when=["when the {r?} req was opened by {S}"],
        act=["the {r?} hiring"],
        chatter=["interview slots are eating my calendar", "the recruiter sent three more CVs"],
    ),
    _t(
        key="migration",
        slots={
            "m": [
                ("Postgres 16", "database upgrade"),
                ("the new Kubernetes cluster", "container platform move"),
                ("the event bus", "messaging system switch"),
            ]
        },
        say=["the move to {m} is done for the staging environment", "we cut over to {m} in staging this morning"],
        react=["any surprises during the cutover?", "great, prod next?"],
        detail=[
            "two cron jobs broke in the {m} cutover because of timezone settings",
            "replication lag stayed under a second the whole time",
        ],
        q_fact=["{S} update on the {m?} migration"],
        q_detail=["what went wrong in the {m?} staging cutover"],
        q_when=["when staging moved to {m?}"],
        act=["the {m?} cutover"],
        chatter=["migrations always take twice as long", "the staging env is flaky again"],
        category="risk",
    ),
    _t(
        key="budget",
        slots={
            "b": [
                ("cloud spend", "infrastructure costs"),
                ("the observability bill", "monitoring costs"),
                ("GPU hours", "accelerator usage"),
            ]
        },
        say=["finance flagged {b}, we're 30 percent over forecast", "{b} doubled last month, need to cut"],
        react=["ugh, it's always the logs", "can we get a breakdown per team?"],
        detail=[
            "biggest line item is unattached volumes nobody deleted",
            "I'll set alerts at 80 percent of the monthly budget",
        ],
        q_fact=["overspend {S} escalated", "{S} warning about {b?}"],
        q_detail=["main driver of the {b?} overrun"],
        q_when=["when {S} raised the {b?} issue"],
        act=["the {b?} overrun"],
        chatter=["the invoice portal is down again", "quarter close is always a scramble"],
    ),
    _t(
        key="role",
        slots={
            "t": [
                ("the platform team", "infrastructure group"),
                ("the payments squad", "billing team"),
                ("the mobile team", "app developers"),
            ]
        },
        say=["heads up, I'm moving to {t} from next sprint", "I'll be joining {t}, my last day here is Friday"],
        react=["we'll miss you on this team", "congrats, {t} is lucky"],
        detail=["handing over my on-call shifts to the new hire", "I wrote up my open tickets in the handover doc"],
        q_fact=["which team {S} belongs to"],
        q_detail=[],
        q_when=["when {S} switched teams"],
        act=["the transfer to {t?}"],
        chatter=["reorgs every six months, classic", "who is the manager of that team now"],
        stateful=True,
    ),
    _t(
        key="talk",
        slots={
            "c": [
                ("KubeCon", "a cloud native conference"),
                ("a local Python meetup", "community meetup"),
                ("the internal tech summit", "company conference"),
            ]
        },
        say=["my talk got accepted at {c}", "I'm presenting at {c} next month"],
        react=["amazing, what's the topic?", "we should do a dry run together"],
        detail=["it's about how we cut build times in half", "the topic is zero-downtime schema changes"],
        q_fact=["event where {S} will give a presentation"],
        q_detail=["subject of {S}'s {c?} talk"],
        q_when=["when {S}'s talk was accepted"],
        act=["the talk at {c?}"],
        entities={"c": "Event"},
        chatter=["conference season is starting", "slides are due Friday for everyone"],
    ),
    _t(
        key="customer",
        slots={
            "k": [
                ("Acme Corp", "a large retail client"),
                ("Globex", "an enterprise account"),
                ("Initech", "a banking customer"),
            ]
        },
        say=["{k} escalated again, their exports time out", "{k} threatened to churn over the export timeouts"],
        react=["is support looped in?", "how big is their contract?"],
        detail=["I promised them a fix by the end of the month", "we'll give them a dedicated export worker"],
        q_fact=["client complaint {S} dealt with", "{S} escalation from a customer"],
        q_detail=["what {S} committed to {k?}"],
        q_when=["when {k?} escalated"],
        act=["the {k?} escalation"],
        entities={"k": "Customer"},
        chatter=["support queue is long today", "customers love to email on Fridays"],
    ),
]

FAMILIES: dict[str, dict[str, object]] = {
    "life": {
        "topics": LIFE_TOPICS,
        "names": [
            "Caroline",
            "Melanie",
            "Jon",
            "Gina",
            "Andrew",
            "Audrey",
            "Tim",
            "Nate",
            "Joanna",
            "Evan",
            "Maria",
            "Deborah",
            "Sam",
            "Priya",
            "Omar",
            "Lena",
        ],
        "speakers": 2,
        "prefix": True,
        "filler": [
            "Hey {O}! So good to hear from you, how have you been?",
            "Haha that's so true.",
            "I know right?",
            "That's awesome, I'm really happy for you!",
            "Anyway, what have you been up to lately?",
            "It's been such a busy few weeks for me.",
            "Thanks {O}, that means a lot.",
            "Totally agree with you.",
            "Oh wow, tell me more!",
            "Gotta run, talk soon!",
            "The weather has been so weird this week.",
            "I've been sleeping terribly lately.",
            "Lol, classic.",
            "Same here, honestly.",
        ],
        "q_who": ["Who brought up {act}, {A} or {B}?"],
        "q_order": ["Which happened earlier for {S}: {act1} or {act2}?"],
        "q_all": {
            "hobby": "What classes or hobbies has {S} tried over the months?",
            "travel": "Which places has {S} travelled to?",
            "sport": "What sporting events has {S} taken part in?",
        },
        "q_current": {"job": "Where does {S} work these days?", "home": "What kind of place does {S} live in now?"},
        "sessions": 20,
        "reuse": 0.75,  # questions mostly keep the key noun (LoCoMo-like)
        "start": datetime(2023, 3, 4, 17, 30, tzinfo=UTC),
    },
    "work": {
        "topics": WORK_TOPICS,
        "names": [
            "Bob",
            "Alice",
            "Ravi",
            "Chen",
            "Fatima",
            "Lukas",
            "Sofia",
            "Kwame",
            "Ines",
            "Yuki",
            "Dmitri",
            "Hana",
        ],
        "speakers": 3,
        "prefix": False,
        "filler": [
            "morning all",
            "+1",
            "thanks {O}",
            "can we move the standup by 15 min?",
            "lgtm",
            "brb, meeting",
            "sounds good to me",
            "I'll take a look after lunch",
            "ack",
            "anyone else seeing slow builds?",
            "coffee?",
            "ping me if you need a review",
        ],
        "q_who": ["who mentioned {act}"],
        "q_order": ["{S} {act1} vs {act2} which came first"],
        "q_all": {"risk": "all the risks {S} raised"},
        "q_current": {"role": "{S} current team"},
        "sessions": 16,
        "reuse": 0.4,  # terse queries in the asker's own words
        "start": datetime(2024, 1, 8, 9, 15, tzinfo=UTC),
    },
}


# --------------------------------------------------------------------------------------------------
# Generation


def _fill(
    template: str,
    values: dict[str, tuple[str, str]],
    rng: random.Random | None = None,
    reuse: float = 0.0,
    **names: str,
) -> str:
    """``{x}`` → the stated form of slot x, ``{x?}`` → how a questioner refers to it: the
    paraphrase, or (with ``rng``, with probability ``reuse``) the stated words, as people often
    reuse the key noun while rephrasing the rest. ``{S}`` etc. → names."""
    out = template
    for key, (said, asked) in values.items():
        spoken = said if rng is not None and rng.random() < reuse else asked
        out = out.replace("{" + key + "?}", spoken).replace("{" + key + "}", said)
    for key, name in names.items():
        out = out.replace("{" + key + "}", name)
    return out[:1].upper() + out[1:]


def _named(topic: Topic, values: dict[str, tuple[str, str]], text: str | None = None) -> tuple[tuple[str, str], ...]:
    """The topic's named things (places, pets, customers) a turn states, as (type, name) entities."""
    return tuple(
        (etype, values[slot][0]) for slot, etype in topic.entities.items() if text is None or values[slot][0] in text
    )


@dataclass(slots=True)
class _Event:
    topic: Topic
    speaker: str
    values: dict[str, tuple[str, str]]
    session: int
    say_id: uuid.UUID | None = None
    detail_id: uuid.UUID | None = None


def generate(family: str, index: int, *, sessions: int | None = None) -> Conversation:
    """One conversation: deterministic in (family, index, sessions)."""
    spec = FAMILIES[family]
    rng = random.Random(f"{family}/{index}/{sessions}")
    names = list(spec["names"])  # type: ignore[call-overload]
    rng.shuffle(names)
    speakers = names[: int(spec["speakers"])]  # type: ignore[call-overload]
    agent = f"{family}-{index:02d}"
    conv = Conversation(agent, family, speakers)
    topics: list[Topic] = list(spec["topics"])  # type: ignore[call-overload]
    n_sessions = sessions or int(spec["sessions"])  # type: ignore[call-overload]

    # Plan the events: each speaker gets most topics once (stateful ones twice, months apart),
    # categories repeated with other slot values, spread over the sessions.
    events: list[_Event] = []
    for s in speakers:
        for topic in topics:
            if rng.random() < 0.2:
                continue
            reps = 2 if topic.stateful or (topic.category and rng.random() < 0.6) else 1
            choices = {k: rng.sample(v, len(v)) for k, v in topic.slots.items()}
            for r in range(reps):
                values = {k: v[r % len(v)] for k, v in choices.items()}
                events.append(_Event(topic, s, values, 0))
    rng.shuffle(events)
    for i, ev in enumerate(events):
        ev.session = min(n_sessions - 1, i * n_sessions // max(1, len(events)))
    # A stateful topic's two statements must be in order and apart: move the first earlier.
    seen: dict[tuple[str, str], _Event] = {}
    for ev in sorted(events, key=lambda e: e.session):
        k = (ev.speaker, ev.topic.key)
        if ev.topic.stateful and k in seen and seen[k].session >= ev.session - 2:
            seen[k].session = max(0, ev.session - 3)
        seen.setdefault(k, ev)

    filler: list[str] = list(spec["filler"])  # type: ignore[call-overload]
    prefix = bool(spec["prefix"])
    when = spec["start"]
    assert isinstance(when, datetime)
    seq = 0

    def emit(speaker: str, text: str, session: int, at: datetime, ents: tuple[tuple[str, str], ...] = ()) -> uuid.UUID:
        nonlocal seq
        tid = uuid.uuid5(NAMESPACE, f"{agent}/{seq}")
        seq += 1
        body = f"{speaker}: {text}" if prefix else text
        conv.turns.append(Turn(tid, agent, speaker, body, at, session, ents))
        return tid

    for session in range(n_sessions):
        when = when + timedelta(days=rng.randint(8, 24), minutes=rng.randint(-90, 90))
        at = when
        todays = [e for e in events if e.session == session]
        order = list(speakers)
        rng.shuffle(order)

        def other(s: str) -> str:
            return rng.choice([x for x in speakers if x != s])

        def tick() -> datetime:
            nonlocal at
            at = at + timedelta(seconds=rng.randint(20, 150))
            return at

        emit(order[0], _fill(filler[0], {}, O=order[1]), session, tick())
        emit(order[1], rng.choice(filler[1:]).replace("{O}", order[0]), session, tick())
        for ev in todays:
            t = ev.topic
            o = other(ev.speaker)
            ev.say_id = emit(ev.speaker, _fill(rng.choice(t.say), ev.values), session, tick(), _named(t, ev.values))
            emit(o, _fill(rng.choice(t.react), ev.values), session, tick())
            if t.detail:
                text = _fill(rng.choice(t.detail), ev.values)
                ev.detail_id = emit(ev.speaker, text, session, tick(), _named(t, ev.values, text))
            emit(o, rng.choice(filler[1:]).replace("{O}", ev.speaker), session, tick())
            for _ in range(rng.randint(1, 4)):  # small talk: a topic in passing, or filler
                s = rng.choice(speakers)
                if rng.random() < 0.5:
                    c = rng.choice(topics)
                    cv = {k: rng.choice(v) for k, v in c.slots.items()}
                    emit(s, _fill(rng.choice(c.chatter), cv), session, tick())
                else:
                    emit(s, rng.choice(filler[1:]).replace("{O}", other(s)), session, tick())
        emit(order[1], rng.choice(filler[1:]).replace("{O}", order[0]), session, tick())

    _questions(conv, events, spec, rng)
    return conv


def _questions(conv: Conversation, events: list[_Event], spec: dict[str, object], rng: random.Random) -> None:
    agent = conv.agent_id
    reuse = float(spec["reuse"])  # type: ignore[arg-type]

    asked: dict[str, int] = {}

    def add(text: str, kind: str, evidence: Sequence[uuid.UUID | None], speaker: str | None) -> None:
        """One question per text: two facts asked in the same words (two speakers moved to the same
        database) make one question that both answer."""
        ev = tuple(e for e in evidence if e is not None)
        if not ev:
            return
        if text in asked:
            old = conv.questions[asked[text]]
            who = old.speaker if old.speaker == speaker else None
            conv.questions[asked[text]] = Question(agent, text, old.kind, (*old.evidence, *ev), who)
            return
        asked[text] = len(conv.questions)
        conv.questions.append(Question(agent, text, kind, ev, speaker))

    by_key: dict[tuple[str, str], list[_Event]] = {}
    by_category: dict[tuple[str, str], list[_Event]] = {}
    for ev in sorted(events, key=lambda e: e.session):
        by_key.setdefault((ev.speaker, ev.topic.key), []).append(ev)
        if ev.topic.category:
            by_category.setdefault((ev.speaker, ev.topic.category), []).append(ev)
    q_all = spec["q_all"]
    assert isinstance(q_all, dict)
    for (speaker, category), evs in by_category.items():
        if len(evs) > 1:
            add(_fill(q_all[category], {}, S=speaker), "all", [e.say_id for e in evs], speaker)
    q_current = spec["q_current"]
    assert isinstance(q_current, dict)
    for (speaker, key), evs in by_key.items():
        t = evs[0].topic
        if t.stateful:
            if len(evs) > 1 and key in q_current:
                add(_fill(q_current[key], {}, S=speaker), "current", [evs[-1].say_id], speaker)
            continue
        for ev in evs:
            for kind, templates, turn in (
                ("detail", t.q_detail, ev.detail_id),
                ("when", t.q_when, ev.say_id),
                ("fact", t.q_fact, ev.say_id),
            ):
                # A speaker who did this twice: only questions that name the slot tell them apart.
                usable = [q for q in templates if len(evs) == 1 or "?}" in q]
                if usable:
                    template = rng.choice(usable)
                    add(_fill(template, ev.values, rng, reuse, S=speaker), kind, [turn], speaker)
    # Who said it: only for events whose topic nobody else had.
    topic_speakers: dict[str, set[str]] = {}
    for ev in events:
        topic_speakers.setdefault(ev.topic.key, set()).add(ev.speaker)
    q_who: list[str] = spec["q_who"]  # type: ignore[assignment]
    for ev in events:
        if len(topic_speakers[ev.topic.key]) == 1 and not ev.topic.stateful:
            a, b = rng.sample(conv.speakers, 2)
            if ev.speaker not in (a, b):
                b = ev.speaker
            act = _fill(rng.choice(ev.topic.act), ev.values, rng, reuse)
            add(_fill(rng.choice(q_who), {}, act=act.lower(), A=a, B=b), "who", [ev.say_id], None)
    # Which came first: two single events of one speaker, sessions apart.
    q_order: list[str] = spec["q_order"]  # type: ignore[assignment]
    for speaker in conv.speakers:
        mine = [e for e in events if e.speaker == speaker and not e.topic.stateful and not e.topic.category]
        rng.shuffle(mine)
        for e1, e2 in zip(mine[0::2], mine[1::2], strict=False):
            if e1.session == e2.session:
                continue
            act1 = _fill(rng.choice(e1.topic.act), e1.values, rng, reuse).lower()
            act2 = _fill(rng.choice(e2.topic.act), e2.values, rng, reuse).lower()
            add(
                _fill(rng.choice(q_order), {}, S=speaker, act1=act1, act2=act2),
                "order",
                [e1.say_id, e2.say_id],
                speaker,
            )


SPLITS: dict[str, list[tuple[str, int, int | None]]] = {
    "dev": [("life", i, None) for i in range(4)],
    "test": [("life", i, None) for i in range(4, 8)],
    "general": [("work", i, None) for i in range(4)],
    "ci": [("life", 100, 8), ("work", 100, 8)],
}


def split(name: str) -> list[Conversation]:
    if name not in SPLITS:
        raise KeyError(f"unknown split {name!r}: one of {', '.join(SPLITS)}")
    return [generate(f, i, sessions=s) for f, i, s in SPLITS[name]]
