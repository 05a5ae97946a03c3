"""The unified query: what a caller asks (``spec``), how it is planned (``plan``), run (``engine``,
``executor``, ``calls``, ``context``, ``guard``, ``fusion``, ``relational``), ranked (``hydrate``,
``ranking``, ``turns``, ``named``) and answered (``results``)."""
