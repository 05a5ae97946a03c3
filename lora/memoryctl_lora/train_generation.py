"""LoRA fine-tuning of the generation model (Qwen-family causal LM) on instruction/response pairs.

Production: the base is the Qwen checkpoint vLLM serves (``LoraTrainingConfig.base_model_path``
points at its Hugging Face directory; training that size wants the GPU node). The adapter targets
``q_proj``/``v_proj`` — modules vLLM's Qwen2 LoRA support covers — and is saved in peft's format,
which ``POST /v1/load_lora_adapter`` accepts as is.

Tests and CI: :func:`build_tiny_qwen2` writes a randomly initialised Qwen2 model (hidden 64,
2 layers) plus a byte-level tokenizer built locally with the ``tokenizers`` library into a normal
model directory — same architecture and code path as the real model, no weights to download.

Loss is causal-LM cross-entropy on the response tokens only (prompt tokens are masked with -100),
so held-out loss measures "how well does the model produce the answers", not the questions.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
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
from ._deps import require, require_torch
from .config import LoraTrainingConfig
from .datasets import GenerationDataset, GenerationExample
from .manifest import read_manifest, verify_adapter

TINY_QWEN2_ID = "memoryctl/tiny-qwen2-test"
PAD, EOS = "<|pad|>", "<|endoftext|>"
PLAIN_TEMPLATE = "### Instruction:\n{instruction}\n### Response:\n"


# -- tiny test model ----------------------------------------------------------------------------
def build_byte_tokenizer() -> Any:
    """A byte-level BPE tokenizer with no merges: 256 byte symbols + pad/eos, built offline.

    Corpus-independent on purpose: the tiny base model (and so any adapter trained on it) does not
    depend on which texts happened to be in the training window.
    """
    tokenizers = require("tokenizers")
    transformers = require("transformers")
    alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
    vocab = {PAD: 0, EOS: 1}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.add_special_tokens([PAD, EOS])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS)


def build_tiny_qwen2(
    output_dir: Path | str,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_positions: int = 512,
) -> Path:
    """Write a randomly initialised Qwen2ForCausalLM + tokenizer to ``output_dir``; return the path.

    Same seed → byte-identical weights, so tests can rebuild the base model and get the same
    losses. Vocab is 258 tokens rounded up to 320 (a multiple of 64, as real checkpoints pad).
    """
    require_torch()
    transformers = require("transformers")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_byte_tokenizer()
    config = transformers.Qwen2Config(
        vocab_size=((len(tok) + 63) // 64) * 64,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
    )
    with deterministic(seed, 1):
        model = transformers.Qwen2ForCausalLM(config)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


# -- data --------------------------------------------------------------------------------------
def format_prompt(tokenizer: Any, instruction: str) -> str:
    """The model's own chat template when it has one (real Qwen), else a plain template."""
    if getattr(tokenizer, "chat_template", None):
        return str(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": instruction}], tokenize=False, add_generation_prompt=True
            )
        )
    return PLAIN_TEMPLATE.format(instruction=instruction)


def _encode_batch(tokenizer: Any, examples: Sequence[GenerationExample], max_len: int) -> dict[str, Any]:
    """input_ids / attention_mask / labels, right-padded; labels = -100 on prompt and padding."""
    torch = require_torch()
    ids_list, label_list = [], []
    for ex in examples:
        prompt = tokenizer(format_prompt(tokenizer, ex.instruction), add_special_tokens=False)["input_ids"]
        answer = tokenizer(ex.response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = (prompt + answer)[:max_len]
        labels = ([-100] * len(prompt) + answer)[:max_len]
        ids_list.append(ids)
        label_list.append(labels)
    width = max(len(x) for x in ids_list)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids = torch.full((len(examples), width), pad, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (ids, lab) in enumerate(zip(ids_list, label_list, strict=True)):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(lab)] = torch.tensor(lab)
        mask[i, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def _shuffled_batches(
    examples: Sequence[GenerationExample], batch_size: int, *, seed: int
) -> Iterator[list[GenerationExample]]:
    """Batches drawn from seeded permutations, each epoch's leftovers topping up the next batch, so
    training is driven by a step count and no example is left out of an epoch."""
    rng = np.random.default_rng(seed)
    order: list[int] = []
    while True:
        if len(order) < batch_size:
            order += [int(i) for i in rng.permutation(len(examples))]
        idx, order = order[:batch_size], order[batch_size:]
        yield [examples[i] for i in idx]


def _batch_loss_sum(model: Any, batch: dict[str, Any]) -> tuple[Any, int]:
    """Sum of token losses and the number of target tokens (so batches average correctly)."""
    torch = require_torch()
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    shift_logits = logits[:, :-1, :].reshape(-1, logits.size(-1)).float()
    shift_labels = batch["labels"][:, 1:].reshape(-1)
    loss = torch.nn.functional.cross_entropy(shift_logits, shift_labels, ignore_index=-100, reduction="sum")
    return loss, int((shift_labels != -100).sum())


def heldout_loss(
    model: Any, tokenizer: Any, examples: Sequence[GenerationExample], *, max_len: int = 256, batch_size: int = 16
) -> float:
    """Mean per-token loss over the response tokens of ``examples`` (lower is better)."""
    torch = require_torch()
    model.eval()
    total, count = 0.0, 0
    with torch.inference_mode():
        for i in range(0, len(examples), batch_size):
            loss, n = _batch_loss_sum(model, _encode_batch(tokenizer, examples[i : i + batch_size], max_len))
            total += float(loss)
            count += n
    return total / max(count, 1)


# -- loading -----------------------------------------------------------------------------------
@dataclass(eq=False)
class GenerationModel:
    """A causal LM (+ optional adapter) with the operations the nightly gate and tests need."""

    model: Any = field(repr=False)
    tokenizer: Any = field(repr=False)
    _: KW_ONLY
    max_seq_length: int = 256
    threads: int | None = None

    def heldout_loss(self, examples: Sequence[GenerationExample]) -> float:
        with torch_threads(self.threads):
            return heldout_loss(self.model, self.tokenizer, examples, max_len=self.max_seq_length)

    def logits(self, text: str) -> Any:
        torch = require_torch()
        self.model.eval()
        enc = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)
        with torch.inference_mode(), torch_threads(self.threads):
            return self.model(**enc).logits[0].float().clone()

    def generate(self, instruction: str, max_new_tokens: int = 32) -> str:
        """Greedy decoding (deterministic) of the response to ``instruction``."""
        torch = require_torch()
        self.model.eval()
        enc = self.tokenizer(format_prompt(self.tokenizer, instruction), return_tensors="pt", add_special_tokens=False)
        with torch.inference_mode(), torch_threads(self.threads):
            out = self.model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.tokenizer.eos_token_id,
            )
        return str(self.tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True))


def _load_causal_lm(base_model_dir: Path) -> tuple[Any, Any]:
    require_torch()
    transformers = require("transformers")
    if not (base_model_dir / "config.json").is_file():
        raise ConfigError(
            f"{base_model_dir} is not a model directory (no config.json)",
            hint="set the generation base_model_path to the Hugging Face directory of the served model",
        )
    tok = transformers.AutoTokenizer.from_pretrained(str(base_model_dir), local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(base_model_dir), local_files_only=True)
    return model, tok


def load_generation_model(
    base_model_dir: Path | str,
    adapter_dir: Path | str | None = None,
    *,
    verify: bool = True,
    threads: int | None = None,
) -> GenerationModel:
    """Base causal LM with ``adapter_dir`` (checksum-verified) applied — the reference for what vLLM
    will serve once the adapter is hot-loaded."""
    model, tok = _load_causal_lm(Path(base_model_dir))
    if adapter_dir is not None:
        adir = Path(adapter_dir)
        _ = verify_adapter(adir) if verify else read_manifest(adir)
        model = load_peft_adapter(model, adir)
    model.eval()
    return GenerationModel(model, tok, threads=threads)


# -- training ----------------------------------------------------------------------------------
def train_generation_adapter(
    dataset: GenerationDataset,
    output_dir: Path | str,
    config: LoraTrainingConfig | None = None,
    *,
    base_model_dir: Path | str | None = None,
    active_adapter_dir: Path | str | None = None,
) -> TrainResult:
    """Train a causal-LM LoRA adapter on ``dataset.train``; write adapter + manifest to ``output_dir``.

    Metrics: held-out loss of the base model, of the active adapter if ``active_adapter_dir`` is
    given (what the gate compares against), and of the new adapter; the loss curve; timings.
    """
    config = config or LoraTrainingConfig.for_generation()
    require_torch()
    base = base_model_dir or config.base_model_path
    if base is None:
        raise ConfigError(
            "no generation base model configured",
            hint="set the generation base_model_path (the served Qwen model's directory)",
        )
    base_dir = Path(base)
    base_id = config.base_model_id or base_dir.name
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    with deterministic(config.seed, config.torch_threads):
        model, tok = _load_causal_lm(base_dir)
        t_loaded = time.monotonic()
        heldout = list(dataset.heldout)
        loss_base = heldout_loss(model, tok, heldout, max_len=config.max_seq_length)
        loss_active = None
        if active_adapter_dir is not None:
            loss_active = load_generation_model(base_dir, active_adapter_dir).heldout_loss(heldout)

        def batch_loss(model: Any, batch: list[GenerationExample]) -> Any:
            loss_sum, n = _batch_loss_sum(model, _encode_batch(tok, batch, config.max_seq_length))
            return loss_sum / max(n, 1)

        batches = _shuffled_batches(dataset.train, config.batch_size, seed=config.seed)
        run = train_lora(model, config, batches, batch_loss, task_type="CAUSAL_LM")
        loss_after = heldout_loss(run.model, tok, heldout, max_len=config.max_seq_length)
    metrics = {
        "heldout_loss_base": loss_base,
        "heldout_loss_active": loss_active if loss_active is not None else loss_base,
        "heldout_loss_after": loss_after,
        "heldout_examples": len(heldout),
        **run.metrics(config, started=t_start, loaded=t_loaded),
    }
    return write_adapter(
        run.model,
        out,
        dataset,
        metrics,
        kind="generation",
        config=config,
        base_model_id=base_id,
        base_model_path=base_dir,
        prompt_format="chat_template" if getattr(tok, "chat_template", None) else PLAIN_TEMPLATE,
    )
