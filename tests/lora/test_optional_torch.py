"""`import memoryctl_lora` works without torch; asking for training without it is a ConfigError with the hint."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from memoryctl.adapter_files import LORA_INSTALL_HINT

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_import_lora_does_not_import_torch() -> None:
    r = _run("""
        import sys
        import memoryctl_lora, memoryctl_lora.registry, memoryctl_lora.serving, memoryctl_lora.evaluate
        import memoryctl_lora.datasets, memoryctl_lora.train_embedding, memoryctl_lora.train_generation
        assert "torch" not in sys.modules, "torch imported eagerly"
        print("ok")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_training_without_torch_raises_config_error_with_hint() -> None:
    # sys.modules[name] = None makes `import name` raise ImportError: torch is "not installed".
    r = _run("""
        import sys
        sys.modules["torch"] = None
        from memoryctl_lora.datasets import EmbeddingDataset
        from memoryctl_lora.train_embedding import train_embedding_adapter
        from memoryctl.errors import ConfigError
        try:
            train_embedding_adapter(EmbeddingDataset((), ()), "/tmp/never-written")
        except ConfigError as e:
            print(e.hint)
        else:
            raise SystemExit("no error")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == LORA_INSTALL_HINT
