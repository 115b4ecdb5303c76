"""Memories, files and knowledge collections: storage, ingestion and retrieval."""
