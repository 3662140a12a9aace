"""Alembic migrations of the batch queue, run by ``BatchStore.open`` (never by hand).

A package so that ``pip install .`` ships the scripts; Alembic skips ``__init__.py``.
"""
