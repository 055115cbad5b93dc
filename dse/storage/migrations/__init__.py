"""The Alembic migrations of the study database (``versions/``, one file a schema version;
``env.py`` runs them). :mod:`dse.storage` applies them whenever it opens a database."""
