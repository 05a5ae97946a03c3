"""Bundled sample memories (``memoryctl demo``)."""
