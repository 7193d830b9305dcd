"""A session's record as notebooks: the journal, its notebook, export and replay."""
