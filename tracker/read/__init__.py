"""The read side: everything that reads the experiment index and says what it holds, for every front end (the
``tracker runs/show/compare/audit`` commands, the web view, the demo).

- ``store``: the one reader of the index (read-only, retrying while a writer writes); ``history``: a run's rows as
  the model's classes (built with the standard library), and a history as its published JSON document.
- ``filters``: label selectors, ``RunFilter`` and ``run_filter``, which both the command line and the web view use.
- ``runs``, ``queues``, ``audit``, ``compare``: what each command computes and prints; ``render`` and ``timeline``:
  the terminal's tables and a run's timeline.

It reads SQLite through the standard library and knows the core's vocabulary and the index schema; it never
touches Kafka, Kubernetes or Azure. ``store``, ``filters``, ``runs``, ``queues`` and ``audit`` import neither
pydantic nor rich, so ``tracker runs`` starts fast; no module here imports pydantic (``show`` and ``compare`` start
without it), and rich is imported by ``timeline`` and, when called, by the functions that make a table.
"""
