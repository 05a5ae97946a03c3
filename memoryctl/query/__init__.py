"""The unified query: what a caller asks (``spec``), how it is planned (``plan``), run (``engine``,
``context``, ``guard``, ``fusion``, ``relational``) and answered (``results``)."""
