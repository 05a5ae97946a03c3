"""The default extractor: a few deterministic rules tuned for precision over recall.

Why rules by default: ingest must be fast, offline and reproducible, and a wrong entity is worse
than a missing one — it links unrelated memories in the graph and every graph query then returns
noise. So each rule fires only on forms that are unambiguous in chat/ticket/notes text:

================  ==========  ================================================================
form              type        rule
================  ==========  ================================================================
``https://…``     Document    http(s) URLs only; trailing punctuation trimmed; ≤ 512 characters
``a@b.example``   Email       RFC-ish address (the identity of a *person* is not guessed from it)
``@alice``        User        handle not glued to a word/e-mail; ``@here/@channel/@everyone``
                              and similar broadcast words excluded
``#release-2``    Topic       must start with a letter; CSS colours (``#ff0000``) excluded
``ABC-123``       Ticket      2-10 upper-case/digit prefix, number without leading zero; not
                              ``UTF-8``, ``SHA-256``, ``ISO-8601``, ``COVID-19``, ``CVE-2024-1``…
``Ada Lovelace``  Entity      2-4 consecutive capitalised words in one clause (see below)
================  ==========  ================================================================

Capitalised names are the only guess: leading function words, titles, weekdays and months are
stripped; a clause that starts with a verb-looking word (``…ed``, ``…ing``, ``…ly``) loses that
word; runs longer than four words and Title Case Headlines (5+ capitalised words, nothing
else but function words) are ignored; names with a comma,
digit or bracket in between are split. The type is the neutral ``Entity`` — a rule cannot tell
a person from a company. Callers who know better pass explicit entities.

URLs and e-mail addresses are masked before the other rules run, so ``#fragment``, ``@host`` or
``ABC-1`` inside them do not become separate entities. Every pattern is linear-time on any input
(bounded repetition, anchored starts) and the text is capped at ``MAX_TEXT``; results are capped at
``MAX_ENTITIES``.
"""

from __future__ import annotations

import re
import uuid

from memoryctl.errors import InputError
from memoryctl.extract.base import MAX_ENTITIES, Extraction
from memoryctl.model import MAX_NAME, MAX_TEXT, EntityRef, normalise_name

_URL = re.compile(r"\bhttps?://[^\s<>\"'`{}|\\^\[\]]{1,2048}", re.IGNORECASE)
_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*\.[A-Za-z]{2,24}(?![A-Za-z0-9-])"
)
_MENTION = re.compile(r"(?<![\w@./+-])@([A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,62}[A-Za-z0-9_])?)(?![\w@])")
_TAG = re.compile(r"(?<![\w#&/])#([A-Za-z][A-Za-z0-9_-]{0,63})(?![\w#])")
_TICKET = re.compile(r"(?<![\w-])([A-Z][A-Z0-9]{1,9})-([1-9][0-9]{0,6})(?![\w-]|\.\d)")
_HEX_COLOUR = re.compile(r"^(?:[0-9a-fA-F]{3,4}|[0-9a-fA-F]{6}|[0-9a-fA-F]{8})$")
_CLAUSE = re.compile(r"(?<=[.!?;:])\s+|\n+|\t+")
_APOSTROPHES = "'\u2019"
_OPENERS = "\"'\u201c\u2018([{<*_"
_CLOSERS = "\"'\u201d\u2019)]}>,.;:!?*_"
_POSSESSIVE = ("'s", "\u2019s")
_WORD = re.compile(r"[^\W\d_]+(?:['\u2019-][^\W\d_]+)*")

_BROADCAST = frozenset({"here", "channel", "everyone", "all", "room", "team"})
_NOT_TICKETS = frozenset(
    """UTF UTF8 UCS SHA MD ISO IEC RFC CVE CWE COVID SARS GPT LLAMA AES RSA DES TLS SSL HTTP HTTPS IP IPV
    PEP ES ECMA IEEE PCI SOC WCAG PG PY UTC GMT CET CEST EST PST BST X BS EN DIN ANSI MP ID
    IDS EC AWS AZ Q FY""".split()
)
# Capitalised words that start or end clauses without being (part of) a name.
_STOP = frozenset(
    """a an the this that these those there here i we you he she it they me us him her them my our your
    his its their mine ours yours theirs who whom whose what which when where why how if but and or nor
    so yet also then than after before during since until while because although though however
    hello hi hey dear thanks thank please yes no not ok okay sure note notes todo fyi re fwd cc bcc
    mr mrs ms miss dr prof sir madam mx st
    monday tuesday wednesday thursday friday saturday sunday today tomorrow yesterday tonight
    january february march april may june july august september october november december
    on in at by for from to of with about via per as is are was were be been will would shall should
    can could may might must do does did has have had let lets meeting call update summary""".split()
)
_VERBISH = ("ed", "ing", "ly")
# Lower-case words a Title Case Headline keeps ("Notes on the State of the Union").
_TITLE_CASE_LOWER = frozenset("a an the and or of on in at to for with by from as vs via".split())


def _add(out: list[EntityRef], seen: set[tuple[str, str]], type_: str, name: str) -> int:
    """Append a valid, new entity; return 1 when the proposal had to be dropped as invalid."""
    name = name.strip()
    key = (type_, normalise_name(name))
    if key in seen:
        return 0
    try:
        ref = EntityRef(type_, name)
    except InputError:
        return 1
    seen.add(key)
    out.append(ref)
    return 0


def _trim_url(url: str) -> str:
    """Drop sentence punctuation glued to a URL, keeping a ``)`` that closes a ``(`` inside it."""
    while url and url[-1] in ".,;:!?'\")]>":
        if url[-1] == ")" and url.count("(") >= url.count(")"):
            break
        url = url[:-1]
    return url


def _is_cap_word(word: str) -> bool:
    return (
        _WORD.fullmatch(word) is not None
        and len(word) <= 40
        and word[0].isupper()
        and len(word) > 1
        and (word[1].islower() or word[1] in _APOSTROPHES)
    )


def _name_from_run(run: list[str], at_clause_start: bool) -> str | None:
    """Trim a run of capitalised words to the name inside it, or None when none is left."""
    words = list(run)
    if at_clause_start and words[0].casefold().endswith(_VERBISH):
        words.pop(0)  # "Reviewed Alice Smith" at a clause start
    while words and words[0].casefold() in _STOP:
        words.pop(0)
    while words and words[-1].casefold() in _STOP:
        words.pop()
    if 2 <= len(words) <= 4 and not any(w.casefold() in _STOP for w in words):
        return " ".join(words)
    return None


def _names(text: str) -> list[str]:
    found: list[str] = []
    for clause in _CLAUSE.split(text):
        tokens = clause.split()
        if not tokens:
            continue
        words_in_clause = [w if _is_cap_word(w) else w.casefold() for w in _WORD.findall(clause)]
        capitalised = sum(1 for w in words_in_clause if w[0].isupper())
        if capitalised >= 5 and all(w[0].isupper() or w in _TITLE_CASE_LOWER for w in words_in_clause):
            continue  # A Title Case Headline: every word looks like a name
        runs: list[tuple[list[str], bool]] = []  # (words, starts the clause)
        run: list[str] = []
        for i, raw in enumerate(tokens):
            lead = raw[: len(raw) - len(raw.lstrip(_OPENERS))]
            core = raw.strip(_OPENERS + _CLOSERS)
            possessive = core.endswith(_POSSESSIVE)
            if possessive:
                core = core[:-2]
            if lead and run:  # an opening quote/bracket starts a new name
                run = []
            if _is_cap_word(core):
                if not run:
                    runs.append((run, i == 0))
                run.append(core)
                if possessive or raw[len(raw.rstrip(_CLOSERS)) :]:
                    run = []  # a comma, full stop or "'s" ends the name
            else:
                run = []
        for words, at_start in runs:
            name = _name_from_run(words, at_start)
            if name:
                found.append(name)
    return found


class RulesExtractor:
    """Deterministic entity rules (see the module docstring). Emits entities only, no relations:
    the write path links each entity to the memory with MENTIONS; typed relations come from the
    caller or the LLM extractor."""

    name = "rules"

    def __init__(self, *, proper_names: bool = True, max_entities: int = MAX_ENTITIES) -> None:
        self.proper_names = proper_names
        self.max_entities = max_entities

    def extract(self, text: str, memory_id: uuid.UUID | None = None) -> Extraction:
        if not isinstance(text, str) or not text:
            return Extraction()
        text = text[:MAX_TEXT]
        out: list[EntityRef] = []
        seen: set[tuple[str, str]] = set()
        dropped = 0
        chars = list(text)

        def mask(m: re.Match[str]) -> None:
            chars[m.start() : m.end()] = " " * (m.end() - m.start())

        for m in _URL.finditer(text):
            url = _trim_url(m.group(0))
            if len(url) <= MAX_NAME and len(url) > len("https://x"):
                dropped += _add(out, seen, "Document", url)
            mask(m)
        text = "".join(chars)
        for m in _EMAIL.finditer(text):
            dropped += _add(out, seen, "Email", m.group(0))
            mask(m)
        text = "".join(chars)
        for m in _MENTION.finditer(text):
            handle = m.group(1)
            if handle.casefold() not in _BROADCAST:
                dropped += _add(out, seen, "User", handle)
        for m in _TAG.finditer(text):
            tag = m.group(1).rstrip("-")
            if not (_HEX_COLOUR.match(tag) and any(c.isdigit() for c in tag)):
                dropped += _add(out, seen, "Topic", tag)
        for m in _TICKET.finditer(text):
            if m.group(1) not in _NOT_TICKETS:
                dropped += _add(out, seen, "Ticket", m.group(0))
        if self.proper_names:
            for name in _names(text):
                dropped += _add(out, seen, "Entity", name)
        if len(out) > self.max_entities:
            dropped += len(out) - self.max_entities
            out = out[: self.max_entities]
        return Extraction(entities=out, relations=[], dropped=dropped)
