"""The study report.

Owns: ``page`` (the static HTML + Markdown report of ``dse report``) and ``plots`` (its
plots, shared with the dashboard)."""
