"""The write path: a memory from the caller to PostgreSQL and on to the vector store and the graph.

``pipeline.py`` (``Writes``: add, import, forget, the delivery that follows a write, what is
pending), ``outbox.py`` (``Deliverer``: draining the outbox to the stores, one bad record set aside
rather than holding back the rest), ``budget.py`` (``WriteDelivery``: a committed write's delivery
to every store at once under the service's budget, behind breakers), ``importer.py`` (JSONL lines
to memories). The modules are imported by name; this package imports none of them.
"""
