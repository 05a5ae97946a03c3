"""The stores behind small protocols: PostgreSQL (the truth), the vector store and the graph."""
