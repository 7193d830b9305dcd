"""The journey tier: the product run as the README tells users to, every setting at its default
(``journey.User``). One journey per README workflow; part of ``make test``."""
