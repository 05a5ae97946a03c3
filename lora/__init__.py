"""Not a package: lora/ is the root of the memoryctl-lora distribution (its pyproject.toml is here).

The repository's layout names lora/ as a top-level folder, and Python would make the folder an
empty PEP 420 namespace for anyone who runs ``import lora`` from the repository root; this file
turns that mistake into a clear error instead. The code is ``memoryctl_lora``
(``pip install -e ./lora``).
"""

raise ImportError(
    "lora/ is the memoryctl-lora distribution, not a module: import memoryctl_lora "
    "(installed with `pip install -e ./lora`)"
)
