"""Open entity and relationship types, optionally narrowed by the configured allow-lists."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from memoryctl.config import GraphSettings, load_settings
from memoryctl.errors import ConfigError, InputError
from memoryctl.model import BadLine, EntityRef, Memory, MemoryRef, Relation
from memoryctl.query.spec import GraphFilter, MemoryQuery
from memoryctl.vocabulary import Vocabulary


def said(speaker: str, rel: str = "SAID", *, entity_type: str = "Speaker") -> Memory:
    mid = uuid.uuid4()
    who = EntityRef(entity_type, speaker)
    return Memory(id=mid, agent_id="a", text="hi", entities=[who], relations=[Relation(who, rel, MemoryRef(mid))])


def test_without_allow_lists_any_well_formed_type_passes() -> None:
    open_ = Vocabulary.from_settings(GraphSettings())
    m = said("Ann", "attended_2")
    assert open_.check_memory(m) is m and m.relations[0].type == "ATTENDED_2"
    q = MemoryQuery(text="x", agent_id="a", graph=GraphFilter(EntityRef("Speaker", "Ann"), ("SAID",)))
    assert open_.check_query(q) is q


def test_allow_lists_narrow_writes_queries_and_imports() -> None:
    vocab = Vocabulary.from_settings(GraphSettings(entity_types=["Speaker"], relation_types=["said"]))
    assert vocab.relation_types == {"SAID"}  # normalised like every relationship type
    vocab.check_memory(said("Ann"))
    with pytest.raises(InputError, match=r"AUTHROED.*allow-list") as exc:
        vocab.check_memory(said("Ann", "AUTHROED"))
    assert "SAID" in (exc.value.hint or "")
    with pytest.raises(InputError, match="entity type 'User'"):
        vocab.check_memory(said("Ann", entity_type="User"))
    with pytest.raises(InputError, match="KNOWS"):
        vocab.check_query(MemoryQuery(text="x", agent_id="a", graph=GraphFilter(EntityRef("Speaker", "A"), ("KNOWS",))))
    # MENTIONS is memoryctl's own edge: always allowed.
    vocab.check_query(MemoryQuery(text="x", agent_id="a", graph=GraphFilter(EntityRef("Speaker", "A"), ("MENTIONS",))))
    screened = list(vocab.screen([(1, said("Ann")), (2, said("Bob", "KNOWS")), (3, BadLine(3, "not JSON"))]))
    assert isinstance(screened[0][1], Memory)
    assert isinstance(screened[1][1], BadLine) and screened[1][1].line == 2 and "KNOWS" in screened[1][1].error
    assert screened[2][1] == BadLine(3, "not JSON")


def test_malformed_allow_list_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"graph\.relation_types"):
        load_settings(Path("/dev/null"), graph={"relation_types": ["NOT A TYPE"]})
    with pytest.raises(ConfigError, match=r"graph\.entity_types"):
        load_settings(Path("/dev/null"), graph={"entity_types": ["Bad Type"]})
