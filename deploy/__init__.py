"""pyinfra deploys for the memoryctl stack, one module per component, composed by ``deploy.py``.

Each module exposes one ``@deploy`` function that reads the host's data (set by the inventory from
``inventory/<name>.yaml``, see :mod:`deploy.settings`) and writes its files from ``templates/``.
"""
