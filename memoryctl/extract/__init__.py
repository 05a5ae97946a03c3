"""Entity and relation extraction at ingest: ``rules`` (default), ``llm`` (vLLM), ``none``.

Whatever the extractor, its output is validated data (``EntityRef``/``Relation``) that the graph
adapters bind as parameters; see ``base`` for the contract and each module for its policy.
"""

from __future__ import annotations

from memoryctl.config import ExtractorSettings, VllmSettings, revealed
from memoryctl.errors import ConfigError
from memoryctl.extract.base import THIS_MEMORY, Extraction, Extractor, NoExtractor
from memoryctl.extract.llm import LlmExtractor
from memoryctl.extract.rules import RulesExtractor

__all__ = [
    "THIS_MEMORY",
    "Extraction",
    "Extractor",
    "LlmExtractor",
    "NoExtractor",
    "RulesExtractor",
    "make_extractor",
]


def make_extractor(settings: ExtractorSettings, vllm: VllmSettings | None = None) -> Extractor:
    """The configured extractor. ``llm`` is used only when asked for *and* vllm.url is set."""
    if settings.kind == "none":
        return NoExtractor()
    if settings.kind == "rules":
        return RulesExtractor()
    if settings.kind == "llm":
        if vllm is None or not vllm.url:
            raise ConfigError(
                'extractor.kind = "llm" needs vllm.url',
                hint='set vllm.url (e.g. http://10.77.0.3:8000) or extractor.kind = "rules"',
            )
        return LlmExtractor(
            vllm.url,
            vllm.model,
            api_key=revealed(vllm.api_key),
            timeout_s=vllm.timeout_s,
            fallback=RulesExtractor(),
            use_served_adapter=vllm.use_served_adapter,
            adapter_check_s=vllm.adapter_check_s,
        )
    raise ConfigError(f"unknown extractor.kind {settings.kind!r}", hint="one of rules, llm, none")
